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

# A TCP port free on 127.0.0.1 right now.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

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
# process's last output and dies naming $4.
wait_line() {
    for _ in $(seq $(($3 * 10))); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    tail -20 "$1" "${1%.out}.err" >&2 2>/dev/null || true
    die "$4 not ready after $3 s"
}

# Stops a daemon by pid (SIGTERM unmounts), falling back to a lazy unmount and SIGKILL.
stop_daemon() { # pid mountpoint
    local pid=$1 mnt=$2 i
    [[ -n $pid ]] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 300); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "$(ps -o comm= -p "$pid") (pid $pid) did not exit within 30 s of SIGTERM: lazy unmount and SIGKILL"
            umount -l "$mnt" 2>/dev/null || true
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    wait "$pid" 2>/dev/null || true
    if mountpoint -q "$mnt" 2>/dev/null; then
        umount -l "$mnt" 2>/dev/null || true
    fi
}

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
