#!/usr/bin/env bash
# Paced starts across the emulated WAN (issue 11, part 1): plain TCP moving SIZE_MB on 8
# fresh BBR connections A->B (bench/tcp_copy.py), as a cold read's transfer does, with each
# connection's pacing rate capped (SO_MAX_PACING_RATE) at its share of a multiple of the link
# rate, against no cap. Per point: the copy's rate (first connect to last byte) and the
# packets the drop-tail bottleneck queue (1 x BDP) dropped A->B as a share of those it
# received. Paced starts inside Locus were tried after it (bench/results/wan-pacing-ab.md).
# Sites are network namespaces joined by `locus-wan`; nothing talks to an address outside them.
#
# Usage (as root):  bench/tcp-pacing.sh
#   RTTS="100 200"  SHARES="0 1.0 1.1 1.3" (multiples of the link rate the 8 flows share; 0: no cap)
#   ROUNDS=2  SIZE_MB=1024  LOSS=0.5  RATE=1000 (Mbit/s)  OUT=bench/results/tcp-pacing.md
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
RTTS=${RTTS:-"100 200"}
SHARES=${SHARES:-"0 1.0 1.1 1.3"}
ROUNDS=${ROUNDS:-2}
SIZE_MB=${SIZE_MB:-1024}
LOSS=${LOSS:-0.5}
RATE=${RATE:-1000}
OUT=${OUT:-$ROOT/bench/results/tcp-pacing.md}
PREFIX=${PREFIX:-ltp-}
STREAMS=8
NSA=${PREFIX}s0 NSB=${PREFIX}s1 IPB=10.99.0.2
WAN=$ROOT/target/release/locus-wan
WORK=$(mktemp -d /tmp/tcp-pacing.XXXXXX)
BYTES=$((SIZE_MB * 1048576))

[[ $(id -u) == 0 ]] || die "needs root (network namespaces)"
[[ -x $WAN ]] || die "no $WAN (cargo build --release -p testkit --bin locus-wan)"
ALLOWED_CC=$(sysctl -n net.ipv4.tcp_allowed_congestion_control)
UP_PID=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_pid "$UP_PID" 100
    "$WAN" down --prefix "$PREFIX" 2>/dev/null || true
    sysctl -q -w net.ipv4.tcp_allowed_congestion_control="$ALLOWED_CC" 2>/dev/null || true
    rm -rf "$WORK"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$WAN" down --prefix "$PREFIX" 2>/dev/null || true
sysctl -q -w net.ipv4.tcp_allowed_congestion_control="reno cubic bbr"
"$WAN" up --prefix "$PREFIX" --sites 2 --rate-mbit "$RATE" >"$WORK/wan-up.out" 2>"$WORK/wan-fwd.err" &
UP_PID=$!
wait_line "$WORK/wan-up.out" "^ready" 30 "locus-wan up" "$UP_PID"
CTL=$(sed -n 's/^ready control=//p' "$WORK/wan-up.out")

counters() { echo "$(wan_counter received | cut -d' ' -f1) $(wan_counter queue_drops | cut -d' ' -f1)"; }
# "MB/s drops%" of one cold copy with each flow capped at $1 bytes/s (0: no cap).
copy() {
    local cap=$1 out=$WORK/recv.out r0 d0 r1 d1 t0 t1
    : >"$out"
    ip netns exec "$NSB" python3 "$ROOT/bench/tcp_copy.py" recv --listen "$IPB:5202" --bytes "$BYTES" --streams $STREAMS >"$out" &
    local rpid=$!
    wait_line "$out" "^listening" 10 "tcp_copy receiver" "$rpid"
    read -r r0 d0 < <(counters)
    t0=$(timeout 120 ip netns exec "$NSA" python3 "$ROOT/bench/tcp_copy.py" send --to "$IPB:5202" --bytes "$BYTES" \
        --streams $STREAMS --cc bbr --max-pacing-rate "$cap")
    wait "$rpid"
    t1=$(tail -1 "$out")
    read -r r1 d1 < <(counters)
    python3 -c "print(f'{$BYTES / ($t1 - $t0) / 1e6:.1f} {100 * ($d1 - $d0) / max($r1 - $r0, 1):.2f}')"
}

ROWS=$WORK/rows.md
for rtt in $RTTS; do
    q=$(python3 -c "print(int($RATE * 1e6 / 8 * $rtt / 1000))")
    set_path "$rtt" "$LOSS" "$q"
    for ((round = 1; round <= ROUNDS; round++)); do
        for share in $SHARES; do
            cap=$(python3 -c "print(int($share * $RATE * 1e6 / 8 / $STREAMS))")
            read -r mbs drops < <(copy "$cap")
            say "RTT $rtt ms, round $round, cap $share x link: $mbs MB/s, drops $drops %"
            printf '| %s | %s | %s | %s | %s | %s |\n' "$rtt" "$round" "$share" \
                "$([[ $cap == 0 ]] && echo none || python3 -c "print(f'{$cap / 1e6:.2f}')")" "$mbs" "$drops" >>"$ROWS"
            sleep 2
        done
    done
done

{
    echo "# Paced starts: 8 fresh BBR flows across the emulated WAN, each capped at its share (bench/tcp-pacing.sh)"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), tree $(cd "$ROOT" && git rev-parse --short HEAD), load average at the end: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores."
    echo "Link $RATE Mbit/s, random loss $LOSS %, drop-tail bottleneck queue of 1 x BDP; bench/tcp_copy.py moving $SIZE_MB MiB A->B"
    echo "on $STREAMS fresh BBR connections (first connect to last byte), each with SO_MAX_PACING_RATE at (share x link) / $STREAMS."
    echo "Drops: packets the bottleneck queue dropped A->B / packets it received A->B during the copy."
    echo
    echo "| RTT ms | round | cap: share of the link | cap per flow MB/s | copy MB/s | tail drops % |"
    echo "|---:|---:|---:|---:|---:|---:|"
    cat "$ROWS"
} >"$OUT"
cat "$OUT"
