# Shell pieces shared by the bench scripts (sourced, not run). After sourcing: say/die log
# with the seconds since the source; bench_pki and tls need LOCUS and TLS_DIR set;
# postmark_tps needs PM_FILES and PM_TX; the juicefs_* functions need ROOT.

T_START=$(date +%s)

say() { printf '[%5ss] %s\n' "$(($(date +%s) - T_START))" "$*" >&2; }
die() {
    say "FAILED: $*"
    exit 1
}

# The directory of PostgreSQL's server binaries (initdb, pg_ctl), from PATH or Debian's layout.
pg_bin() {
    local initdb
    if initdb=$(command -v initdb); then dirname "$(readlink -f "$initdb")"; return; fi
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1
}

# $1 / $2, printed as `1.23x`.
ratio() { python3 -c "print(f'{$1 / $2:.2f}x')"; }

# A TCP port free on 127.0.0.1 right now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Runs a command as the postgres user when root (initdb refuses to run as root).
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# Starts a PostgreSQL server of the script's own in directory $1 (data in $1/data, log
# $1/server.log, socket in $1) on 127.0.0.1 at a free port, which it puts in PGPORT;
# PGBIN must be set (pg_bin). The caller stops it: pg_ctl stop -D $1/data.
start_pg() { # dir
    mkdir -p "$1"
    [[ $(id -u) == 0 ]] && chown postgres: "$1"
    PGPORT=$(free_port)
    (cd "$1" && as_pg "$PGBIN/initdb" -D "$1/data" -U locus -A trust -E UTF8 --locale=C >/dev/null)
    (cd "$1" && as_pg "$PGBIN/pg_ctl" start -w -D "$1/data" -l "$1/server.log" \
        -o "-p $PGPORT -k $1 -c listen_addresses=127.0.0.1" >/dev/null)
}

# Starts `$BIN ARGS...` in the background (its pid added to PIDS, output in $WORK/NAME.out,
# log in $WORK/NAME.log) and sets ANNOUNCED to what follows PREFIX on its first line
# starting so (the address or mount point it announces); waits at most TRIES x 50 ms.
start_announced() { # name prefix tries args...
    local name=$1 prefix=$2 tries=$3
    shift 3
    "$BIN" "$@" >"$WORK/$name.out" 2>"$WORK/$name.log" &
    PIDS+=($!)
    for _ in $(seq 1 "$tries"); do
        if grep -qs "^$prefix" "$WORK/$name.out"; then ANNOUNCED=$(sed -n "s/^$prefix //p" "$WORK/$name.out"); return; fi
        sleep 0.05
    done
    echo "$name did not start; its log:" >&2; cat "$WORK/$name.log" >&2; exit 1
}

# A fresh `locus up` in $WORK (mounted on $WORK/mnt, data in $WORK/data, ports the OS
# picks; LOCUS set): sets UP_PID, META (its address) and TLS_DIR (its CA directory).
start_up() {
    rm -rf "$WORK"
    mkdir -p "$WORK/mnt"
    "$LOCUS" up "$WORK/mnt" --data-dir "$WORK/data" --meta-listen 127.0.0.1:0 --node-listen 127.0.0.1:0 \
        >"$WORK/up.out" 2>"$WORK/up.err" &
    UP_PID=$!
    wait_line "$WORK/up.out" "mounted on" 60 "locus up" "$UP_PID"
    META=$(sed -n 's/^locus: meta \([^,]*\),.*/\1/p' "$WORK/up.out")
    TLS_DIR=$WORK/data/tls
}

# Mutual TLS for one run: a CA in TLS_DIR and a certificate per "role name site" argument;
# admin commands (policy, status, fsck) use the one named admin through LOCUS_CA/CERT/KEY.
bench_pki() {
    local c role name site
    "$LOCUS" ca init --dir "$TLS_DIR" >/dev/null
    for c in "$@"; do
        read -r role name site <<<"$c"
        "$LOCUS" ca issue --dir "$TLS_DIR" --role "$role" --name "$name" --site "$site" >/dev/null
    done
    export LOCUS_CA=$TLS_DIR/ca.pem LOCUS_CERT=$TLS_DIR/admin.pem LOCUS_KEY=$TLS_DIR/admin.key
}

# The TLS flags of the process whose certificate is named $1.
tls() { echo "--ca $TLS_DIR/ca.pem --cert $TLS_DIR/$1.pem --key $TLS_DIR/$1.key"; }

# Waits until file $1 has a line matching $2, for at most $3 seconds; else shows the
# process's last output and dies naming $4 (at once if the process $5, when given, exits).
wait_line() { # file pattern seconds what [pid]
    for _ in $(seq $(($3 * 10))); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        if [[ -n ${5:-} ]] && ! kill -0 "$5" 2>/dev/null; then
            tail -5 "$1" "${1%.out}.err" 2>/dev/null >&2
            die "$4 exited"
        fi
        sleep 0.1
    done
    tail -20 "$1" "${1%.out}.err" >&2 2>/dev/null || true
    die "$4 not ready after $3 s"
}

# ---------------------------------------------------------------- two sites on the WAN emulator
# Used by wan-seeds.sh and wan-read.sh. The caller sets WAN, CTL (after `locus-wan up`), RATE,
# NSA/NSB, IPA/IPB, META, LOCUS, LOG, WORK, BYTES, RA_KB, NODEA_DIR/NODEB_DIR, MNTA/MNTB,
# LOCUS_NODE_ARGS, LOCUS_MOUNT_ARGS (NODE_CONN_ARG, MOUNT_CONN_ARG optional) and the pids.

# Stops a process by pid: SIGTERM, then SIGKILL after $2 tenths of a second.
stop_pid() { # pid [tenths]
    local pid=$1 n=${2:-100} i
    [[ -n $pid ]] || return 0
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < n; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "pid $pid ignored SIGTERM: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

# Stops a FUSE daemon by pid (SIGTERM unmounts; SIGKILL after 30 s), then makes sure the
# mountpoint is free (a lazy unmount if it is busy).
stop_mount() { # pid mountpoint
    stop_pid "$1" 300
    if mountpoint -q "$2" 2>/dev/null; then
        umount "$2" 2>/dev/null || umount -l "$2" 2>/dev/null || true
    fi
}

# The TLS flags of process $1 (NO_TLS=1: --insecure-no-tls; HAS_TLS=0: a build without TLS).
tls_flags() { # certificate name
    local HAS_TLS=${HAS_TLS:-1}
    if ((HAS_TLS)) && [[ ${NO_TLS:-0} == 1 ]]; then
        echo "--insecure-no-tls"
    elif ((HAS_TLS)); then
        echo "--ca $TLS_DIR/ca.pem --cert $TLS_DIR/$1.pem --key $TLS_DIR/$1.key"
    fi
}

inA() { ip netns exec "$NSA" "$@"; }
inB() { ip netns exec "$NSB" "$@"; }
# Background daemons are started with `ip netns exec` directly (not through these functions),
# so that $! is the daemon's own pid. FUSE daemons (locus mount, sshfs) enter only the network
# namespace with nsenter: `ip netns exec` also gives its command a private (slave) mount
# namespace, and a mount made there would be invisible to dd and cp.

# Waits (30 s at most) until $2 is a mount point; dies if daemon $1 exits first (showing log $3).
wait_mounted() { # pid mountpoint logfile
    local pid=$1 mnt=$2 logfile=$3 i
    for i in $(seq 300); do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$logfile" >&2 || true
            die "the daemon for $mnt exited before mounting"
        fi
        mountpoint -q "$mnt" && return 0
        sleep 0.1
    done
    die "$mnt was not mounted within 30 s"
}

# Sets the kernel readahead of FUSE mount $1 to $2 KiB (its bdi is named after the mount's
# MAJ:MIN) and prints the value it had.
set_readahead() { # mountpoint kb
    local ra
    ra=/sys/class/bdi/$(mountpoint -d "$1")/read_ahead_kb
    [[ -w $ra ]] || die "no $ra for $1"
    cat "$ra"
    echo "$2" >"$ra"
    [[ $(cat "$ra") == "$2" ]] || die "$ra reads $(cat "$ra") after writing $2"
}

# Writes dirty pages back and empties the page, dentry and inode caches.
drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

set_wan() { "$WAN" ctl --control "$CTL" set "$@" >/dev/null; }
set_path() { # rtt_ms loss_pct [queue_bytes, default auto]
    set_wan delay_ms="$(python3 -c "print($1/2)")" loss_pct="$2" rate_mbit="$RATE" queue_bytes="${3:-auto}"
    sleep 0.3
}
# Counters of the forwarder so far, A->B first: "released_bytes" (default) or any other
# field of `locus-wan ctl stats` (queue_drops, overflow_drops, received, ...).
wan_counter() { # [field]
    "$WAN" ctl --control "$CTL" stats | python3 -c '
import re, sys
f, t = sys.argv[1], sys.stdin.read()
ab = re.search(r"s0->s1 .*?\b" + f + r"=(\d+)", t)
ba = re.search(r"s1->s0 .*?\b" + f + r"=(\d+)", t)
print(ab.group(1) if ab else -1, ba.group(1) if ba else -1)' "${1:-released_bytes}"
}
# Bytes the forwarder released in both directions so far (A->B first).
wan_bytes() { wan_counter released_bytes; }

set_ra() { # mountpoint
    local dev ra=/dev/null
    dev=$(mountpoint -d "$1" 2>/dev/null) || return 0
    ra=/sys/class/bdi/$dev/read_ahead_kb
    [[ -w $ra ]] && echo "$RA_KB" >"$ra" || true
}

# dd with a time cap: "<bytes> <seconds> <complete>"
timed_dd() { # file timeout
    { timeout -s INT "$2" dd if="$1" of=/dev/null bs=64k 2>&1 || true; } | python3 -c '
import re, sys
m = re.findall(r"^(\d+) bytes.*copied, ([0-9.e+-]+) s", sys.stdin.read(), re.M)
if not m:
    print("0 0 0")
else:
    b, s = m[-1]
    print(b, s, 1 if int(b) >= int(sys.argv[1]) else 0)' "$BYTES"
}

# ---------------------------------------------------------------- Locus roles

start_meta() {
    # shellcheck disable=SC2046 # tls_flags is a list of flags
    ip netns exec "$NSA" "$LOCUS" meta --listen "$META" --db "$WORK/meta.db" --init --admit-node node-a --admit-node node-b --no-root-squash a --no-root-squash b $(tls_flags meta) \
        >"$LOG/meta.out" 2>"$LOG/meta.err" &
    META_PID=$!
    wait_line "$LOG/meta.out" "listening" 30 "locus meta" "$META_PID"
}
start_node() { # a|b
    local ns ip dir port
    if [[ $1 == a ]]; then ns=$NSA ip=$IPA dir=$NODEA_DIR port=7101; else ns=$NSB ip=$IPB dir=$NODEB_DIR port=7102; fi
    # shellcheck disable=SC2086
    ip netns exec "$ns" "$LOCUS" node --listen "$ip:$port" --meta "$META" --data-dir "$dir" --id "node-$1" \
        --site "$1" $LOCUS_NODE_ARGS ${NODE_CONN_ARG:-} $(tls_flags "node-$1") >"$LOG/node-$1.out" 2>>"$LOG/node-$1.err" &
    if [[ $1 == a ]]; then NODEA_PID=$!; else NODEB_PID=$!; fi
    wait_line "$LOG/node-$1.out" "listening" 30 "locus node $1" "$!"
}
stop_node() { # a|b
    if [[ $1 == a ]]; then stop_pid "$NODEA_PID" 100; NODEA_PID=""; else stop_pid "$NODEB_PID" 100; NODEB_PID=""; fi
}
# Mounts site $1's client on MNTA/MNTB (its pid in MOUNTA_PID/MOUNTB_PID), or as a further
# client of that site on mountpoint $2 (its pid in EXTRA_MOUNT_PID; logs mount-SITE-NAME.*).
start_mount() { # a|b [mountpoint]
    local mnt=${2:-} log=$LOG/mount-$1${2:+-$(basename "${2:-}")}
    [[ -n $mnt ]] || { if [[ $1 == a ]]; then mnt=$MNTA; else mnt=$MNTB; fi; }
    : >"$log.out"
    # shellcheck disable=SC2086
    nsenter --net="/run/netns/$([[ $1 == a ]] && echo "$NSA" || echo "$NSB")" "$LOCUS" mount "$mnt" --meta "$META" \
        --site "$1" $LOCUS_MOUNT_ARGS ${MOUNT_CONN_ARG:-} $(tls_flags "client-$1") >"$log.out" 2>>"$log.err" &
    if [[ -n ${2:-} ]]; then EXTRA_MOUNT_PID=$!; elif [[ $1 == a ]]; then MOUNTA_PID=$!; else MOUNTB_PID=$!; fi
    wait_line "$log.out" "mounted" 60 "locus mount $1" "$!"
    set_ra "$mnt"
}
stop_mount_site() { # a|b
    if [[ $1 == a ]]; then stop_mount "$MOUNTA_PID" "$MNTA"; MOUNTA_PID=""; else stop_mount "$MOUNTB_PID" "$MNTB"; MOUNTB_PID=""; fi
}
# First reader at B: nothing of the file anywhere at B. New mount process (empty client
# cache), B's node restarted with its site cache (cache/ in its data dir, if the build has one)
# removed, page cache dropped.
cold_b() {
    stop_mount_site b
    stop_node b
    rm -rf "$NODEB_DIR/cache"
    if [[ -d $NODEA_DIR/cache ]]; then
        stop_node a
        rm -rf "$NODEA_DIR/cache"
        start_node a
    fi
    start_node b
    drop_caches
    start_mount b
}
# Second reader at B: a new client (mount process), page cache dropped; B's node keeps what it has.
second_b() {
    stop_mount_site b
    drop_caches
    start_mount b
}

# One Locus read at B of the file at A: "<bytes> <secs> <complete> <wan A->B bytes>"
locus_read_b() { # timeout
    local w0 w1 r
    read -r w0 _ < <(wan_bytes)
    r=$(timed_dd "$MNTB/big" "$1")
    read -r w1 _ < <(wan_bytes)
    echo "$r $((w1 - w0))"
}

iperf_run() { # streams [cc] -> "bytes_per_sec" (receiver side), or "fail"
    local j=$WORK/iperf.json
    timeout $((IPERF_SECS + IPERF_OMIT + 30)) ip netns exec "$NSA" iperf3 -c "$IPB" -p 5201 -t "$IPERF_SECS" -O "$IPERF_OMIT" -P "$1" -C "${2:-$IPERF_CC}" -J >"$j" 2>/dev/null || true
    python3 - "$j" <<'EOF'
import json, sys
try:
    e = json.load(open(sys.argv[1]))["end"]
    print(f'{e["sum_received"]["bits_per_second"] / 8:.0f}')
except Exception:
    print("fail")
EOF
}

# PostMark's transactions per second in directory $1 (Debian's `postmark` 1.51: PM_FILES files
# in one directory, PM_TX transactions of create/delete and read/append, its default sizes of
# 500 to 10,000 bytes). It reports whole seconds, so PM_TX should keep it busy for 20 s or more.
postmark_tps() {
    mkdir -p "$1"
    printf 'set location %s\nset number %s\nset transactions %s\nrun\nquit\n' "$1" "$PM_FILES" "$PM_TX" |
        (cd "$1" && postmark) | sed -n 's/.* seconds of transactions (\([0-9]*\) per second).*/\1/p'
}

# JuiceFS, measured beside Locus: sets JUICEFS_BIN to the binary bench/juicefs-build.sh builds from
# the public sources (or reuses) and JUICEFS_BUILD to its version line.
juicefs_bin() {
    JUICEFS_BIN=$("$ROOT/bench/juicefs-build.sh") || die "JuiceFS could not be built (see above; JUICEFS=0 skips it)"
    JUICEFS_BUILD=$(head -1 "$(dirname "$JUICEFS_BIN")/build.txt")
}

# A fresh JuiceFS volume: metadata at URL $1 (sqlite3://... or postgres://...), data blocks
# in directory $2 (`--storage file`), otherwise `juicefs format`'s defaults; output to log $3.
juicefs_format() { # meta-url data-dir log
    mkdir -p "$2"
    "$JUICEFS_BIN" format --storage file --bucket "$2/" "$1" bench >>"$3" 2>&1 || {
        tail -20 "$3" >&2
        die "juicefs format $1 failed"
    }
}

# Mounts the volume at URL $1 on $2 in the foreground (a background job of this script; sets
# JUICEFS_PID) with `juicefs mount`'s default options, but for the local cache directory $3
# (default size, 100 GiB) and no usage report; output to log $4.
juicefs_mount() { # meta-url mountpoint cache-dir log
    mkdir -p "$2" "$3"
    "$JUICEFS_BIN" mount --no-usage-report --cache-dir "$3" "$1" "$2" >>"$4" 2>&1 9>&- &
    JUICEFS_PID=$!
    wait_mounted "$JUICEFS_PID" "$2" "$4"
}
