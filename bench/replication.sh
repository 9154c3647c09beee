#!/usr/bin/env bash
# Replication across sites on the repo's WAN emulator: two sites, A (10.99.0.1) and B
# (10.99.0.2), joined by `locus-wan` at RATE Mbit/s per direction; meta, a node and the
# writing mount at A, a node at B. Every daemon runs in a site namespace.
#
#   1. Sequential write of SIZE_MB (dd bs=1M conv=fsync) into a single-site directory (the
#      default policy) and into a `sync` a,b directory, at each RTT of RTTS, beside
#      iperf3 -P 8 on the same path; bytes crossing the WAN (forwarder counters).
#   2. A 4 KiB overwrite in the middle of the `sync` file (dd conv=notrunc,fsync): bytes
#      crossing the WAN A->B and B->A.
#   3. `async` a,b: the same write, then the time until B holds every chunk (the node's
#      replication lag metric back to 0).
# Writes bench/results/replication.md.
#
# Usage (as root):  bench/replication.sh
#   SIZE_MB=1024 RTTS="50 100" RATE=1000 IPERF_SECS=8 SKIP_BUILD=0 WORK=/tmp/locus-repl PREFIX=lrp-
#   OUT=bench/results/replication.md
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZE_MB=${SIZE_MB:-1024}
RTTS=${RTTS:-"50 100"}
RATE=${RATE:-1000}
IPERF_SECS=${IPERF_SECS:-8}
SKIP_BUILD=${SKIP_BUILD:-0}
WORK=${WORK:-/tmp/locus-repl}
PREFIX=${PREFIX:-lrp-}
OUT=${OUT:-$ROOT/bench/results/replication.md}

NSA=${PREFIX}s0
NSB=${PREFIX}s1
IPA=10.99.0.1
IPB=10.99.0.2
META=$IPA:7070
METRICS=$IPA:9101
BIN=$WORK/bin
LOG=$WORK/logs
MNT=$WORK/mnt-a
T_START=$(date +%s)

say() { printf '[%5ss] %s\n' "$(($(date +%s) - T_START))" "$*" >&2; }
die() {
    say "FAILED: $*"
    exit 1
}
[[ $(id -u) == 0 ]] || die "needs root (network namespaces, FUSE)"

if [[ $SKIP_BUILD != 1 ]]; then
    say "cargo build --release (locus, locus-wan)"
    (cd "$ROOT" && cargo build --release -p locus -p testkit --bin locus --bin locus-wan) || die "build failed"
fi

UP_PID="" META_PID="" NODEA_PID="" NODEB_PID="" MOUNT_PID="" IPERF_PID="" CTL=""
ALLOWED_CC=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)

stop_pid() { # pid
    [[ -n $1 ]] || return 0
    kill -TERM "$1" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_pid "$MOUNT_PID"
    mountpoint -q "$MNT" 2>/dev/null && umount -l "$MNT" || true
    for p in "$NODEB_PID" "$NODEA_PID" "$META_PID" "$IPERF_PID" "$UP_PID"; do stop_pid "$p"; done
    [[ -x $BIN/locus-wan ]] && "$BIN/locus-wan" down --prefix "$PREFIX" 2>/dev/null || true
    sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$ALLOWED_CC" 2>/dev/null || true
    rm -rf "$WORK/node-a" "$WORK/node-b" "$WORK/meta.db"* 2>/dev/null || true
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mountpoint -q "$MNT" 2>/dev/null && umount -l "$MNT" || true
rm -rf "$WORK"
mkdir -p "$BIN" "$LOG" "$MNT" "$WORK/node-a" "$WORK/node-b"
cp "$ROOT/target/release/locus" "$ROOT/target/release/locus-wan" "$BIN/"
LOCUS=$BIN/locus
WAN=$BIN/locus-wan
"$WAN" down --prefix "$PREFIX" 2>/dev/null || true

wait_line() { # file pattern seconds what
    for _ in $(seq $(($3 * 10))); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    tail -5 "$1" "${1%.out}.err" >&2 2>/dev/null || true
    die "$4 not ready after $3 s"
}
set_path() { # rtt_ms
    "$WAN" ctl --control "$CTL" set delay_ms="$(python3 -c "print($1/2)")" loss_pct=0 rate_mbit="$RATE" \
        queue_bytes=auto >/dev/null
    sleep 0.3
}
wan_bytes() { # -> "a_to_b b_to_a"
    "$WAN" ctl --control "$CTL" stats | python3 -c '
import re, sys
t = sys.stdin.read()
ab = re.search(r"s0->s1 .*?released_bytes=(\d+)", t)
ba = re.search(r"s1->s0 .*?released_bytes=(\d+)", t)
print(ab.group(1) if ab else -1, ba.group(1) if ba else -1)'
}
metric() { # name -> value at node a
    ip netns exec "$NSA" python3 -c '
import sys, urllib.request
body = urllib.request.urlopen("http://'"$METRICS"'/metrics", timeout=5).read().decode()
for line in body.splitlines():
    if line.startswith(sys.argv[1] + "{"):
        print(line.rsplit(" ", 1)[1]); break
else:
    print(-1)' "$1"
}
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2-$1:.3f}')"; }
mbs() { python3 -c "print(f'{$1/max($2,1e-9)/1e6:.1f}')"; }

sysctl -q -w net.ipv4.tcp_allowed_congestion_control="reno cubic bbr" || true
say "WAN emulator: 2 sites, $RATE Mbit/s"
"$WAN" up --prefix "$PREFIX" --sites 2 --rate-mbit "$RATE" >"$LOG/wan-up.out" 2>"$LOG/wan-fwd.err" &
UP_PID=$!
wait_line "$LOG/wan-up.out" "^ready" 30 "locus-wan up"
CTL=$(sed -n 's/^ready control=//p' "$LOG/wan-up.out")
set_path 0

ip netns exec "$NSA" "$LOCUS" meta --listen "$META" --db "$WORK/meta.db" --init >"$LOG/meta.out" 2>"$LOG/meta.err" &
META_PID=$!
wait_line "$LOG/meta.out" listening 30 "locus meta"
ip netns exec "$NSA" "$LOCUS" node --listen "$IPA:7101" --meta "$META" --data-dir "$WORK/node-a" --id node-a \
    --site a --metrics "$METRICS" --sync-timeout 60s >"$LOG/node-a.out" 2>"$LOG/node-a.err" &
NODEA_PID=$!
wait_line "$LOG/node-a.out" listening 30 "node a"
ip netns exec "$NSB" "$LOCUS" node --listen "$IPB:7102" --meta "$META" --data-dir "$WORK/node-b" --id node-b \
    --site b >"$LOG/node-b.out" 2>"$LOG/node-b.err" &
NODEB_PID=$!
wait_line "$LOG/node-b.out" listening 30 "node b"
nsenter --net="/run/netns/$NSA" "$LOCUS" mount "$MNT" --meta "$META" --site a >"$LOG/mount.out" 2>"$LOG/mount.err" &
MOUNT_PID=$!
wait_line "$LOG/mount.out" mounted 60 "locus mount"
sleep 3 # nodes learn each other at their heartbeat
ip netns exec "$NSB" iperf3 -s -p 5201 >"$LOG/iperf3.log" 2>&1 &
IPERF_PID=$!

mkdir "$MNT/single" "$MNT/sync" "$MNT/async"
pol() { ip netns exec "$NSA" "$LOCUS" policy set "$@" --meta "$META" >>"$LOG/policy.out" 2>&1; }
pol /sync --sites a,b --copies 1 --mode sync
pol /async --sites a,b --copies 1 --mode async

ROWS=()
OVER=()
for rtt in $RTTS; do
    set_path "$rtt"
    say "RTT $rtt ms"
    j=$WORK/iperf.json
    ip netns exec "$NSA" timeout $((IPERF_SECS + 30)) iperf3 -c "$IPB" -p 5201 -t "$IPERF_SECS" -O 2 -P 8 -C bbr -J \
        >"$j" 2>/dev/null || true
    iperf=$(python3 -c "import json; print(f'{json.load(open(\"$j\"))[\"end\"][\"sum_received\"][\"bits_per_second\"]/8e6:.1f}')" \
        2>/dev/null || echo "?")
    for dir in single sync async; do
        f=$MNT/$dir/f-$rtt
        read -r w0 _ < <(wan_bytes)
        t0=$(now)
        head -c $((SIZE_MB << 20)) /dev/urandom | dd of="$f" bs=1M iflag=fullblock conv=fsync status=none
        t1=$(now)
        read -r w1 _ < <(wan_bytes)
        s=$(secs "$t0" "$t1")
        drained=""
        if [[ $dir == async ]]; then
            for _ in $(seq 3000); do
                [[ $(metric locus_replication_lag_chunks) == 0 ]] && break
                sleep 0.1
            done
            t2=$(now)
            read -r w1 _ < <(wan_bytes)
            drained="B holds every chunk $(secs "$t1" "$t2") s after fsync"
        fi
        say "  $dir: $(mbs $((SIZE_MB << 20)) "$s") MB/s, WAN A->B $((w1 - w0)) B $drained"
        ROWS+=("| $rtt | $dir | $SIZE_MB | $s | $(mbs $((SIZE_MB << 20)) "$s") | $iperf | $((w1 - w0)) | $drained |")
    done
    # A 4 KiB overwrite in the middle of the sync file.
    read -r a0 b0 < <(wan_bytes)
    head -c 4096 /dev/urandom | dd of="$MNT/sync/f-$rtt" bs=4096 seek=$(((SIZE_MB << 20) / 2 / 4096)) \
        conv=notrunc,fsync status=none
    read -r a1 b1 < <(wan_bytes)
    OVER+=("| $rtt | $((a1 - a0)) | $((b1 - b0)) |")
    say "  4 KiB overwrite: A->B $((a1 - a0)) B, B->A $((b1 - b0)) B"
done

{
    echo "# Replication across sites (bench/replication.sh)"
    echo
    echo "Two sites joined by locus-wan at $RATE Mbit/s per direction; meta, node a and the"
    echo "writing mount at A, node b at B; release build of $(cd "$ROOT" && git rev-parse --short HEAD)"
    echo "on $(nproc) cores, $(date -u +%Y-%m-%d). Writes: dd bs=1M conv=fsync of $SIZE_MB MiB of random"
    echo "data. single = the default policy (one node at A: one copy); sync / async = --sites a,b"
    echo "--copies 1. iperf3 = -P 8 with bbr on the same path, MB/s received."
    echo
    echo "| RTT ms | directory | MiB | seconds | MB/s | iperf3 -P 8 MB/s | WAN bytes A->B (async: until B holds every chunk) | note |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "A 4 KiB overwrite (dd conv=notrunc,fsync) in the middle of the sync file: bytes"
    echo "the forwarder carried (meta is at A, so only the node-to-node copy crosses)."
    echo
    echo "| RTT ms | A->B bytes | B->A bytes |"
    echo "|---|---|---|"
    printf '%s\n' "${OVER[@]}"
} >"$OUT"
say "wrote $OUT"
