#!/usr/bin/env bash
# Wide-area benchmark: seed 000's experiments (YottaYotta, figs. 3-6) against Locus on the
# repo's WAN emulator (bench/results/wan-emulator.md). Two sites, A (10.99.0.1) and B
# (10.99.0.2), joined by `locus-wan` at RATE Mbit/s per direction; meta and a node at A, a
# node at B, a Locus mount at B (and one at A to write the test file). Every daemon runs in a
# site namespace; nothing talks to any address outside these namespaces.
#
#   a. fig. 3: time to read a SIZE_MB file that lives only at A from one reader at B
#      (dd bs=64k, cold caches) at RTT 0/10/50/100/200 ms: Locus, sshfs, a one-request-at-a-
#      time 64 KiB reader over TCP (bench/seq_reader.py), iperf3 -P 8 on the same path, and the
#      eq. 1 bound T <= B/(1+R*B/D).
#   b. fig. 4: steady throughput at 100 ms RTT, loss 0/0.1/0.5/1 %, iperf3 -P 1/2/4/8/16 and
#      Locus (per connection count if the CLI has such an option, else at its default).
#   c. figs. 5-6: copying the file from A to B at 50 and 100 ms: cp inside Locus (to a Locus file
#      at B, and to B's local disk), scp, rsync (over ssh), xrdcp (XRootD), globus-url-copy -p 8
#      (GridFTP, anonymous mode inside the emulated namespaces only).
#   d. a second reader at B after the first (new mount process, page cache dropped, the site's
#      node and its cache left as they are): throughput and bytes over the WAN (forwarder
#      counters before/after).
# Writes bench/results/wan-seeds.md, wan-seeds.tsv and wan-seeds-*.png (bench/wan_seeds_report.py).
#
# Usage (as root, from anywhere):  bench/wan-seeds.sh
# Environment knobs:
#   SIZE_MB=1024          test file size in MiB (SIZE_MB=128 for a quick run)
#   RTTS="0 10 50 100 200"   RTT grid of a and d (ms)
#   LOSS_RTT=100 LOSSES="0 0.1 0.5 1" CONNS="1 2 4 8 16"   grid of b
#   COPY_RTTS="50 100"    RTT grid of c
#   RATE=1000             emulated link, Mbit/s per direction
#   IPERF_SECS=8 IPERF_OMIT=2   iperf3 -t / -O (the first seconds of slow start not counted)
#   IPERF_CC=bbr          congestion control of the iperf3 reference (Locus's own default is bbr;
#                         b also measures -P 8 with cubic for context)
#   READ_TIMEOUT=60       cap on one Locus/sshfs read in a/d (s); a capped read reports its rate so far
#   B_READ_TIMEOUT=30     cap on one Locus read in b (s)
#   SERIAL_SECS=15        cap on one serial-reader run (s)
#   COPY_TIMEOUT=90       cap on one copy (s)
#   RA_KB=1024            read_ahead_kb set on each FUSE mount's bdi (as bench/run.sh does)
#   LOCUS_MOUNT_ARGS= LOCUS_NODE_ARGS=   extra flags for `locus mount` / `locus node`
#   NO_TLS=0         1: every process runs with --insecure-no-tls (the cost of TLS on the WAN)
#   SKIP_BUILD=0 SKIP_APT=0   1: use existing target/release binaries / skip apt-get
#   WORK=/tmp/wan-seeds   scratch directory (on the local disk)
#   PREFIX=lws-           namespace prefix
#   OUT=bench/results/wan-seeds.md
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZE_MB=${SIZE_MB:-1024}
RTTS=${RTTS:-"0 10 50 100 200"}
LOSS_RTT=${LOSS_RTT:-100}
LOSSES=${LOSSES:-"0 0.1 0.5 1"}
CONNS=${CONNS:-"1 2 4 8 16"}
COPY_RTTS=${COPY_RTTS:-"50 100"}
RATE=${RATE:-1000}
IPERF_SECS=${IPERF_SECS:-8}
IPERF_OMIT=${IPERF_OMIT:-2}
IPERF_CC=${IPERF_CC:-bbr}
READ_TIMEOUT=${READ_TIMEOUT:-60}
B_READ_TIMEOUT=${B_READ_TIMEOUT:-30}
SERIAL_SECS=${SERIAL_SECS:-15}
COPY_TIMEOUT=${COPY_TIMEOUT:-90}
RA_KB=${RA_KB:-1024}
LOCUS_MOUNT_ARGS=${LOCUS_MOUNT_ARGS:-}
LOCUS_NODE_ARGS=${LOCUS_NODE_ARGS:-}
SKIP_BUILD=${SKIP_BUILD:-0}
SKIP_APT=${SKIP_APT:-0}
WORK=${WORK:-/tmp/wan-seeds}
PREFIX=${PREFIX:-lws-}
OUT=${OUT:-$ROOT/bench/results/wan-seeds.md}

NSA=${PREFIX}s0
NSB=${PREFIX}s1
IPA=10.99.0.1
IPB=10.99.0.2
META=$IPA:7070
BYTES=$((SIZE_MB * 1048576))
BIN=$WORK/bin
LOG=$WORK/logs
ADISK=$WORK/site-a-disk      # A's local disk: the source file for sshfs/scp/rsync/xrdcp/GridFTP
BDISK=$WORK/site-b-disk      # B's local disk: copy destinations
SRC=$ADISK/src.bin
MNTA=$WORK/mnt-a
MNTB=$WORK/mnt-b
SSHFS_MNT=$WORK/sshfs-b
NODEA_DIR=$WORK/node-a
NODEB_DIR=$WORK/node-b
TSV=$WORK/results.tsv
INFO=$WORK/info.txt
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"

[[ $(id -u) == 0 ]] || die "needs root (network namespaces, FUSE, drop_caches)"
# Debian's python3 (python3-matplotlib lives there), not a pyenv shim that may come first in PATH.
PY=python3
[[ -x /usr/bin/python3 ]] && PY=/usr/bin/python3

# ---------------------------------------------------------------- tools

if [[ $SKIP_APT != 1 ]]; then
    need=()
    for pair in sshfs:sshfs sshd:openssh-server ssh:openssh-client scp:openssh-client rsync:rsync \
        xrootd:xrootd-server xrdcp:xrootd-client globus-url-copy:globus-gass-copy-progs \
        globus-gridftp-server:globus-gridftp-server-progs iperf3:iperf3 fusermount3:fuse3 \
        nsenter:util-linux python3:python3 ssh-keygen:openssh-client; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || [[ -x /usr/sbin/${pair%%:*} ]] || need+=("${pair#*:}")
    done
    $PY -c 'import matplotlib' 2>/dev/null || need+=(python3-matplotlib)
    if ((${#need[@]})); then
        say "apt-get install ${need[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null ||
            say "apt-get install failed for some of: ${need[*]} (rows needing them will say so)"
    fi
fi

if [[ $SKIP_BUILD != 1 ]]; then
    say "cargo build --release (locus, locus-wan)"
    (cd "$ROOT" && cargo build --release -p locus -p testkit --bin locus --bin locus-wan) ||
        die "build failed (SKIP_BUILD=1 uses the binaries already in target/release)"
fi

# ---------------------------------------------------------------- state and cleanup

UP_PID="" META_PID="" NODEA_PID="" NODEB_PID="" MOUNTA_PID="" MOUNTB_PID="" SSHFS_PID=""
IPERF_PID="" SERIAL_PID="" SSHD_PID="" XRD_PID="" GFTP_PID=""
CTL=""
ALLOWED_CC=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)


cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    say "cleanup"
    stop_mount "$SSHFS_PID" "$SSHFS_MNT"
    stop_mount "$MOUNTB_PID" "$MNTB"
    stop_mount "$MOUNTA_PID" "$MNTA"
    for p in "$NODEB_PID" "$NODEA_PID" "$META_PID" "$IPERF_PID" "$SERIAL_PID" "$SSHD_PID" "$XRD_PID" "$GFTP_PID"; do
        stop_pid "$p" 50
    done
    stop_pid "$UP_PID" 100
    [[ -x $BIN/locus-wan ]] && "$BIN/locus-wan" down --prefix "$PREFIX" 2>/dev/null || true
    rm -rf "/etc/netns/$NSA" "/etc/netns/$NSB"
    sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$ALLOWED_CC" 2>/dev/null || true
    rm -rf "$ADISK" "$BDISK" "$NODEA_DIR" "$NODEB_DIR" "$WORK/meta.db"* 2>/dev/null || true
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A stale run (crash, kill -9) may have left namespaces and mounts behind.
for m in "$SSHFS_MNT" "$MNTB" "$MNTA"; do mountpoint -q "$m" 2>/dev/null && umount -l "$m" || true; done
rm -rf "$WORK"
mkdir -p "$BIN" "$LOG" "$ADISK" "$BDISK" "$MNTA" "$MNTB" "$SSHFS_MNT" "$NODEA_DIR" "$NODEB_DIR"
chmod 755 "$WORK" "$ADISK" "$BDISK"
chmod 777 "$LOG"
# Private copies: another build in the tree cannot swap binaries under a running benchmark.
cp "$ROOT/target/release/locus" "$ROOT/target/release/locus-wan" "$BIN/"
LOCUS=$BIN/locus
WAN=$BIN/locus-wan
"$WAN" down --prefix "$PREFIX" 2>/dev/null || true
# Mutual TLS: a CA for this run and a certificate per process (binaries from before TLS have
# no `ca` command and run without). NO_TLS=1 measures the same run with --insecure-no-tls.
TLS_DIR=$WORK/tls
HAS_TLS=0
if "$LOCUS" ca --help >/dev/null 2>&1; then
    HAS_TLS=1
    "$LOCUS" ca init --dir "$TLS_DIR" >/dev/null
    for c in "meta meta a" "node node-a a" "node node-b b" "client client-a a" "client client-b b"; do
        read -r role name site <<<"$c"
        "$LOCUS" ca issue --dir "$TLS_DIR" --role "$role" --name "$name" --site "$site" >/dev/null
    done
fi
: >"$TSV"



record() { # exp rtt loss conns system bytes secs complete wan_ab note
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$TSV"
    local mbs
    mbs=$(python3 -c "print(f'{$6/max($7,1e-9)/1e6:.1f}')" 2>/dev/null || echo "?")
    say "  $1 rtt=$2 loss=$3 conns=$4 $5: $6 B in $7 s = $mbs MB/s complete=$8 wan=$9 ${10}"
}


# ---------------------------------------------------------------- transports and tools

record_iperf() { # exp rtt loss streams [cc]
    local bps cc=${5:-$IPERF_CC} name=iperf3
    [[ $cc != "$IPERF_CC" ]] && name=iperf3-$cc
    bps=$(iperf_run "$4" "$cc")
    if [[ $bps == fail ]]; then
        record "$1" "$2" "$3" "$4" "$name" 0 0 0 -1 "iperf3 -C $cc failed"
    else
        record "$1" "$2" "$3" "$4" "$name" "$bps" 1 1 -1 "$cc, steady (first ${IPERF_OMIT}s omitted)"
    fi
}

start_sshd() {
    mkdir -p "$WORK/ssh" /run/sshd
    chmod 700 "$WORK/ssh"
    ssh-keygen -q -t ed25519 -N '' -f "$WORK/ssh/host_key"
    ssh-keygen -q -t ed25519 -N '' -f "$WORK/ssh/client_key"
    cp "$WORK/ssh/client_key.pub" "$WORK/ssh/authorized_keys"
    cat >"$WORK/ssh/sshd_config" <<EOF
ListenAddress $IPA
Port 22
HostKey $WORK/ssh/host_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile $WORK/ssh/authorized_keys
StrictModes no
UsePAM no
PidFile none
Subsystem sftp internal-sftp
EOF
    ip netns exec "$NSA" /usr/sbin/sshd -D -f "$WORK/ssh/sshd_config" -E "$LOG/sshd.log" &
    SSHD_PID=$!
    SSH_OPTS="-i $WORK/ssh/client_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes"
    local i
    for ((i = 0; i < 50; i++)); do
        inB ssh $SSH_OPTS -o ConnectTimeout=5 "root@$IPA" true 2>/dev/null && return 0
        sleep 0.2
    done
    say "sshd did not answer: $(tail -3 "$LOG/sshd.log" 2>/dev/null | tr '\n' ' ')"
    return 1
}

start_sshfs() {
    : >"$LOG/sshfs.err"
    nsenter --net="/run/netns/$NSB" sshfs -f -o "ro,IdentityFile=$WORK/ssh/client_key,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,LogLevel=ERROR,BatchMode=yes" \
        "root@$IPA:$ADISK" "$SSHFS_MNT" >/dev/null 2>>"$LOG/sshfs.err" &
    SSHFS_PID=$!
    local i
    for ((i = 0; i < 100; i++)); do
        mountpoint -q "$SSHFS_MNT" && { set_ra "$SSHFS_MNT"; return 0; }
        kill -0 "$SSHFS_PID" 2>/dev/null || break
        sleep 0.1
    done
    say "sshfs did not mount: $(tail -3 "$LOG/sshfs.err" | tr '\n' ' ')"
    stop_mount "$SSHFS_PID" "$SSHFS_MNT"
    SSHFS_PID=""
    return 1
}

start_xrootd() {
    printf 'all.export %s\nxrd.port 1094\n' "$ADISK" >"$WORK/xrootd.cfg"
    # xrootd refuses to run as root; it serves A's disk directory as nobody.
    ip netns exec "$NSA" xrootd -c "$WORK/xrootd.cfg" -l "$LOG/xrootd.log" -R nobody >"$LOG/xrootd.out" 2>&1 &
    XRD_PID=$!
    sleep 1.5
    kill -0 "$XRD_PID" 2>/dev/null || { XRD_ERR="xrootd exited: $(tail -3 "$LOG/xrootd.out" "$LOG/xrootd.log" 2>/dev/null | tr '\n' ' ')"; XRD_PID=""; return 1; }
}

start_gridftp() {
    # GridFTP resolves its own address to a name: give the namespaces a hosts file
    # (`ip netns exec` binds /etc/netns/NAME/hosts over /etc/hosts; removed at cleanup).
    local n
    for n in "$NSA" "$NSB"; do
        mkdir -p "/etc/netns/$n"
        printf '127.0.0.1 localhost\n127.0.0.1 %s\n%s site-a\n%s site-b\n' "$(hostname)" "$IPA" "$IPB" >"/etc/netns/$n/hosts"
    done
    # Anonymous clear-text access (-aa), mapped to nobody: only inside the emulated namespaces.
    ip netns exec "$NSA" globus-gridftp-server -aa -anonymous-user nobody -s -p 2811 -d error,warn -l "$LOG/gridftp.log" \
        >"$LOG/gridftp.out" 2>&1 &
    GFTP_PID=$!
    sleep 1.5
    kill -0 "$GFTP_PID" 2>/dev/null || { GFTP_ERR="globus-gridftp-server exited: $(tail -4 "$LOG/gridftp.out" "$LOG/gridftp.log" 2>/dev/null | tr '\n' ' ')"; GFTP_PID=""; return 1; }
}

# Runs one copy with a time cap; the rate is the destination's size over the elapsed time.
copy_run() { # rtt name dest cmd...
    local rtt=$1 name=$2 dest=$3 t0 t1 rc w0 w1 size complete note=""
    shift 3
    rm -f "$dest"
    drop_caches
    read -r w0 _ < <(wan_bytes)
    t0=$(date +%s.%N)
    rc=0
    timeout -s INT "$COPY_TIMEOUT" "$@" >"$LOG/copy.out" 2>&1 || rc=$?
    t1=$(date +%s.%N)
    read -r w1 _ < <(wan_bytes)
    size=$(stat -c %s "$dest" 2>/dev/null || echo 0)
    complete=0
    [[ $rc == 0 && $size -ge $BYTES ]] && complete=1
    if [[ $rc != 0 && $rc != 124 && $rc != 130 ]]; then
        note="exit $rc: $(tail -2 "$LOG/copy.out" | tr '\n\t' '  ' | cut -c1-200)"
    elif [[ $rc != 0 ]]; then
        note="capped at ${COPY_TIMEOUT}s"
    fi
    record c "$rtt" 0 - "$name" "$size" "$(python3 -c "print(f'{$t1-$t0:.3f}')")" "$complete" "$((w1 - w0))" "$note"
    rm -f "$dest"
}

# ---------------------------------------------------------------- set up

# Namespaces may only pick congestion controls the root namespace allows (restored at exit).
sysctl -q -w net.ipv4.tcp_allowed_congestion_control="reno cubic bbr" || say "cannot widen tcp_allowed_congestion_control"
say "WAN emulator: 2 sites, $RATE Mbit/s"
"$WAN" up --prefix "$PREFIX" --sites 2 --rate-mbit "$RATE" >"$LOG/wan-up.out" 2>"$LOG/wan-fwd.err" &
UP_PID=$!
wait_line "$LOG/wan-up.out" "^ready" 30 "locus-wan up" "$UP_PID"
CTL=$(sed -n 's/^ready control=//p' "$LOG/wan-up.out")
set_path 0 0
NS_CC=$(inB sysctl -n net.ipv4.tcp_congestion_control)

# Connection-count option of the Locus build, if any (fig. 4 rows per connection count).
CONN_FLAG="" CONN_ROLE="" CONN_DEFAULT=""
for role in mount node; do
    f=$("$LOCUS" "$role" --help 2>/dev/null | grep -oE -- '--[a-z-]*conn[a-z-]*' | head -1 || true)
    if [[ -n $f ]]; then
        CONN_FLAG=$f CONN_ROLE=$role
        CONN_DEFAULT=$("$LOCUS" "$role" --help | awk -v f="$f" 'index($0, f) {on = 1} on && /\[default: / {
            sub(/.*\[default: /, ""); sub(/\].*/, ""); print; exit }')
        break
    fi
done
say "connection-count option: ${CONN_FLAG:-none} ${CONN_ROLE:+(locus $CONN_ROLE, default ${CONN_DEFAULT:-?})}"

say "source file: $SIZE_MB MiB of random data on A's disk"
head -c "$BYTES" /dev/urandom >"$SRC"
chmod 644 "$SRC"

start_meta
start_node a
start_node b
start_mount a
say "writing the file at A through the Locus mount"
t0=$(date +%s.%N)
dd if="$SRC" of="$MNTA/big" bs=1M conv=fsync status=none
t1=$(date +%s.%N)
record setup 0 0 - "locus-write-a" "$BYTES" "$(python3 -c "print(f'{$t1-$t0:.3f}')")" 1 -1 "dd bs=1M conv=fsync at A"
# Site-local cold read at A (the single-site figure of this run, for d).
stop_mount_site a
drop_caches
start_mount a
r=$(timed_dd "$MNTA/big" "$READ_TIMEOUT")
record local 0 0 - locus-site-a $r -1 "cold read at the file's own site"
stop_mount_site a

ip netns exec "$NSB" iperf3 -s -p 5201 >"$LOG/iperf3.log" 2>&1 &
IPERF_PID=$!
ip netns exec "$NSA" python3 "$ROOT/bench/seq_reader.py" serve --listen "$IPA:7200" --root "$ADISK" >"$LOG/serial.out" 2>&1 &
SERIAL_PID=$!
SSH_OK=1 XRD_OK=1 GFTP_OK=1 XRD_ERR="" GFTP_ERR=""
start_sshd || SSH_OK=0
start_xrootd || { XRD_OK=0; say "$XRD_ERR"; }
start_gridftp || { GFTP_OK=0; say "$GFTP_ERR"; }
sleep 0.5

# ---------------------------------------------------------------- a + d: read vs RTT

for rtt in $RTTS; do
    say "RTT $rtt ms (loss 0)"
    set_path "$rtt" 0
    record_iperf a "$rtt" 0 8
    cold_b
    read -r b s c w < <(locus_read_b "$READ_TIMEOUT")
    record a "$rtt" 0 default locus "$b" "$s" "$c" "$w" "first reader, cold"
    second_b
    read -r b s c w < <(locus_read_b "$READ_TIMEOUT")
    record d "$rtt" 0 default locus-second "$b" "$s" "$c" "$w" "second reader, new client, site node kept"
    stop_mount_site b
    if [[ $SSH_OK == 1 ]]; then
        drop_caches
        if start_sshfs; then
            read -r b s c < <(timed_dd "$SSHFS_MNT/src.bin" "$READ_TIMEOUT")
            record a "$rtt" 0 1 sshfs "$b" "$s" "$c" -1 ""
            stop_mount "$SSHFS_PID" "$SSHFS_MNT"
            SSHFS_PID=""
        else
            record a "$rtt" 0 1 sshfs 0 0 0 -1 "sshfs did not mount"
        fi
    else
        record a "$rtt" 0 1 sshfs 0 0 0 -1 "sshd did not start"
    fi
    drop_caches
    r=$(timeout $((SERIAL_SECS + 40)) ip netns exec "$NSB" python3 "$ROOT/bench/seq_reader.py" read --connect "$IPA:7200" --path "$SRC" --bs 65536 \
        --max-seconds "$SERIAL_SECS" 2>"$LOG/serial-read.err" || echo "0 0 0")
    record a "$rtt" 0 1 serial $r -1 "64 KiB per request, one in flight"
done

# ---------------------------------------------------------------- b: loss x connections

B_TIMEOUT=$B_READ_TIMEOUT
for loss in $LOSSES; do
    say "RTT $LOSS_RTT ms, loss $loss %"
    set_path "$LOSS_RTT" "$loss"
    for p in $CONNS; do record_iperf b "$LOSS_RTT" "$loss" "$p"; done
    [[ $IPERF_CC != cubic ]] && record_iperf b "$LOSS_RTT" "$loss" 8 cubic
    if [[ -n $CONN_FLAG ]]; then
        for p in $CONNS; do
            if [[ $CONN_ROLE == mount ]]; then MOUNT_CONN_ARG="$CONN_FLAG $p"; else NODE_CONN_ARG="$CONN_FLAG $p"; fi
            cold_b
            read -r b s c w < <(locus_read_b "$B_TIMEOUT")
            record b "$LOSS_RTT" "$loss" "$p" locus "$b" "$s" "$c" "$w" "$CONN_FLAG $p"
        done
        MOUNT_CONN_ARG="" NODE_CONN_ARG=""
        # The build's default count was not in the grid: measure it too.
        if [[ -n $CONN_DEFAULT && " $CONNS " != *" $CONN_DEFAULT "* ]]; then
            cold_b
            read -r b s c w < <(locus_read_b "$B_TIMEOUT")
            record b "$LOSS_RTT" "$loss" default locus "$b" "$s" "$c" "$w" "build default"
        fi
    else
        cold_b
        read -r b s c w < <(locus_read_b "$B_TIMEOUT")
        record b "$LOSS_RTT" "$loss" default locus "$b" "$s" "$c" "$w" "build default"
    fi
done
MOUNT_CONN_ARG="" NODE_CONN_ARG=""
stop_mount_site b
# Nodes with the default connection count again.
if [[ -n $CONN_FLAG && $CONN_ROLE == node ]]; then stop_node b; start_node b; fi

# ---------------------------------------------------------------- c: copy A -> B

for rtt in $COPY_RTTS; do
    say "copies at RTT $rtt ms"
    set_path "$rtt" 0
    record_iperf c "$rtt" 0 8
    if [[ $SSH_OK == 1 ]]; then
        copy_run "$rtt" scp "$BDISK/scp.bin" ip netns exec "$NSB" scp $SSH_OPTS "root@$IPA:$SRC" "$BDISK/scp.bin"
        copy_run "$rtt" rsync "$BDISK/rsync.bin" ip netns exec "$NSB" rsync --whole-file -e "ssh $SSH_OPTS" "root@$IPA:$SRC" "$BDISK/rsync.bin"
    else
        record c "$rtt" 0 - scp 0 0 0 -1 "sshd did not start"
        record c "$rtt" 0 - rsync 0 0 0 -1 "sshd did not start"
    fi
    if [[ $XRD_OK == 1 ]]; then
        copy_run "$rtt" xrdcp "$BDISK/xrdcp.bin" ip netns exec "$NSB" xrdcp -f -s "root://$IPA/$SRC" "$BDISK/xrdcp.bin"
    else
        record c "$rtt" 0 - xrdcp 0 0 0 -1 "$XRD_ERR"
    fi
    if [[ $GFTP_OK == 1 ]]; then
        copy_run "$rtt" "globus-url-copy -p 8" "$BDISK/gridftp.bin" ip netns exec "$NSB" globus-url-copy -p 8 \
            "ftp://$IPA:2811$SRC" "file://$BDISK/gridftp.bin"
    else
        record c "$rtt" 0 - "globus-url-copy -p 8" 0 0 0 -1 "$GFTP_ERR"
    fi
    cold_b
    copy_run "$rtt" "cp Locus->B disk" "$BDISK/cp.bin" cp "$MNTB/big" "$BDISK/cp.bin"
done
# cp to a Locus file at B last: its chunks (same content, same ids) land on B's node and would
# serve any later read at B. Between RTTs B's node is emptied (chunks and cache) and restarted.
first=1
for rtt in $COPY_RTTS; do
    set_path "$rtt" 0
    if [[ $first == 0 ]]; then
        stop_mount_site b
        stop_node b
        rm -rf "$NODEB_DIR/chunks" "$NODEB_DIR/cache"
        start_node b
    fi
    first=0
    cold_b
    copy_run "$rtt" "cp Locus->Locus B" "$MNTB/copy" cp "$MNTB/big" "$MNTB/copy"
done
stop_mount_site b

# ---------------------------------------------------------------- report

LOCUS_REV=$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo "?")
DIRTY=$(cd "$ROOT" && git status --porcelain -- crates 2>/dev/null | wc -l)
{
    echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "kernel=$(uname -r)"
    echo "cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
    echo "ram=$(free -g | awk '/Mem:/{print $2}') GiB"
    echo "locus_rev=$LOCUS_REV$([[ $DIRTY != 0 ]] && echo " + uncommitted changes in crates/ ($DIRTY files)")"
    echo "locus_built=$(date -u -r "$ROOT/target/release/locus" '+%Y-%m-%d %H:%M UTC')"
    echo "size_mb=$SIZE_MB"
    echo "rate=$RATE"
    echo "rtts=$RTTS"
    echo "loss_rtt=$LOSS_RTT"
    echo "losses=$LOSSES"
    echo "conns=$CONNS"
    echo "copy_rtts=$COPY_RTTS"
    echo "iperf_secs=$IPERF_SECS"
    echo "iperf_omit=$IPERF_OMIT"
    echo "read_timeout=$READ_TIMEOUT"
    echo "b_timeout=$B_TIMEOUT"
    echo "serial_secs=$SERIAL_SECS"
    echo "copy_timeout=$COPY_TIMEOUT"
    echo "ra_kb=$RA_KB"
    echo "cc=$NS_CC (root allows: $ALLOWED_CC)"
    echo "mtu=$(inB cat /sys/class/net/eth0/mtu 2>/dev/null || echo '?')"
    echo "conn_flag=${CONN_FLAG:-none}"
    echo "conn_role=$CONN_ROLE"
    echo "conn_default=$CONN_DEFAULT"
    echo "iperf_cc=$IPERF_CC"
    echo "mount_args=$LOCUS_MOUNT_ARGS"
    echo "node_args=$LOCUS_NODE_ARGS"
    echo "node_cache_dir=$([[ -d $NODEB_DIR/cache ]] && echo yes || echo no)"
    echo "loadavg=$(cut -d' ' -f1-3 /proc/loadavg)"
    echo "elapsed=$(($(date +%s) - T_START))"
    echo "sshd_ok=$SSH_OK"
    echo "xrootd_ok=$XRD_OK"
    echo "gridftp_ok=$GFTP_OK"
} >"$INFO"
say "forwarder counters at the end: $("$WAN" ctl --control "$CTL" stats | tr '\n' ' ')"
"$PY" "$ROOT/bench/wan_seeds_report.py" --tsv "$TSV" --info "$INFO" --out "$OUT" \
    --foundation "$ROOT/bench/results/foundation.md"
cat "$OUT"
say "done in $(($(date +%s) - T_START)) s"
