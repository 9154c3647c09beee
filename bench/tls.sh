#!/usr/bin/env bash
# Cost of TLS: the foundation benchmark's sequential write and read (bench/run.sh: dd bs=1M,
# writes with conv=fsync; cold read after dropping the page cache and restarting Locus so its
# client cache is empty; warm read right after) on `locus up` with mutual TLS (the default) and
# with --insecure-no-tls, side by side in one run, interleaved REPS times; tables show medians.
# Writes bench/results/tls.md and prints it.
#
# Usage (as root):  bench/tls.sh
#   SIZE_MB=1024  REPS=3  SKIP_BUILD=0  SCRATCH=/tmp/bench-tls  OUT=bench/results/tls.md
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZE_MB=${SIZE_MB:-1024}
REPS=${REPS:-3}
SKIP_BUILD=${SKIP_BUILD:-0}
SCRATCH=${SCRATCH:-/tmp/bench-tls}
OUT=${OUT:-$ROOT/bench/results/tls.md}
BIN=$ROOT/target/release/locus
MNT=$SCRATCH/mnt
SRC=$SCRATCH/source.bin
MODES=(tls plain)
declare -A FLAGS=([tls]="" [plain]="--insecure-no-tls")
declare -A NAME=([tls]="mutual TLS 1.3" [plain]="--insecure-no-tls")
declare -A RES=()
PID=""
T0=$(date +%s)

say() { printf '[%4ss] %s\n' "$(($(date +%s) - T0))" "$*" >&2; }

stop() {
    [[ -n $PID ]] || return 0
    kill -TERM "$PID" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    mountpoint -q "$MNT" && umount -l "$MNT"
    PID=""
}

cleanup() {
    local rc=$?
    set +e
    stop
    rm -rf --one-file-system "$SCRATCH"
    exit "$rc"
}
trap cleanup EXIT

start() { # mode data-dir
    # shellcheck disable=SC2086 # FLAGS holds a list of flags
    LOCUS_LOG=warn "$BIN" up "$MNT" --data-dir "$2" --meta-listen 127.0.0.1:0 --node-listen 127.0.0.1:0 \
        ${FLAGS[$1]} >>"$SCRATCH/locus-$1.log" 2>&1 &
    PID=$!
    for _ in $(seq 300); do
        mountpoint -q "$MNT" && break
        kill -0 "$PID" 2>/dev/null || { tail "$SCRATCH/locus-$1.log" >&2; exit 1; }
        sleep 0.1
    done
    mountpoint -q "$MNT" || { say "not mounted"; exit 1; }
    echo 1024 >"/sys/class/bdi/$(mountpoint -d "$MNT")/read_ahead_kb"
    sleep 3 # the embedded node registers and the client learns it (see bench/run.sh restart_locus)
}

mbps() { awk -v b=$((SIZE_MB * 1048576)) -v ns="$1" 'BEGIN { printf "%.0f", b / (ns / 1e9) / 1e6 }'; }

timed() { # command... -> nanoseconds
    local t0 t1
    t0=$(date +%s%N)
    "$@" >/dev/null 2>&1
    t1=$(date +%s%N)
    echo $((t1 - t0))
}

median() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

((SKIP_BUILD)) || (cd "$ROOT" && cargo build --release -p locus >&2)
mkdir -p "$MNT"
head -c $((SIZE_MB * 1048576 + 1048576)) /dev/urandom >"$SRC"

for rep in $(seq "$REPS"); do
    for mode in "${MODES[@]}"; do
        data=$SCRATCH/data-$mode-$rep
        start "$mode" "$data"
        # A distinct offset per write: no chunk is shared with an earlier run.
        w=$(timed dd if="$SRC" of="$MNT/f" bs=1M count="$SIZE_MB" skip=$((rep * 4096)) iflag=skip_bytes conv=fsync)
        stop
        sync
        echo 3 >/proc/sys/vm/drop_caches
        start "$mode" "$data"
        c=$(timed dd if="$MNT/f" of=/dev/null bs=1M)
        h=$(timed dd if="$MNT/f" of=/dev/null bs=1M)
        stop
        RES[write|$mode]+="$(mbps "$w") "
        RES[cold|$mode]+="$(mbps "$c") "
        RES[warm|$mode]+="$(mbps "$h") "
        say "rep $rep ${NAME[$mode]}: write $(mbps "$w") MB/s, cold read $(mbps "$c") MB/s, warm read $(mbps "$h") MB/s"
    done
done

{
    echo "# Cost of TLS: foundation write/read with mutual TLS vs --insecure-no-tls"
    echo
    echo "Produced by \`bench/tls.sh\` on $(date -u +%Y-%m-%d) (commit $(git -C "$ROOT" rev-parse --short HEAD)),"
    echo "$(nproc) cores, SIZE_MB=$SIZE_MB, REPS=$REPS (median, all runs in brackets), release build,"
    echo "\`locus up\` defaults. TLS: rustls TLS 1.3, ring provider, AES-128-GCM, ECDSA P-256 certificates"
    echo "made by \`locus up\` in its data directory. MB/s = 10^6 bytes/s of wall time around dd."
    echo
    echo "| test | ${NAME[tls]} | ${NAME[plain]} | TLS / plain |"
    echo "|---|---|---|---|"
    for t in write cold warm; do
        a=$(median "${RES[$t|tls]}") b=$(median "${RES[$t|plain]}")
        label=$([[ $t == write ]] && echo "seq write, dd bs=1M conv=fsync" || echo "seq read $t, bs=1M")
        echo "| $label (MB/s) | $a [${RES[$t|tls]% }] | $b [${RES[$t|plain]% }] | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.0f %%", 100 * a / b }') |"
    done
} >"$OUT"
cat "$OUT"
