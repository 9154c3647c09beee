#!/usr/bin/env bash
# The failover drill of issue 9 part 5, ROUNDS times: runs the real-process test
# `failover_to_the_standby_site_loses_no_acknowledged_write` (crates/locus/tests/postgres.rs)
# and writes the figures it prints (lines "FAILOVER key value") as a Markdown table to
# bench/results/failover.md. Loopback only (127.0.0.1); needs root, /dev/fuse and
# Debian's postgresql package.
#
# Usage (as root):  bench/failover.sh [ROUNDS]
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${1:-3}
OUT=$ROOT/bench/results/failover.md
LOGS=$(mktemp -d /tmp/locus-failover.XXXXXX)
trap 'rm -rf "$LOGS"' EXIT
cd "$ROOT"
for r in $(seq 1 "$ROUNDS"); do
    cargo test -q -p locus --test postgres -- failover_to_the_standby_site_loses_no_acknowledged_write \
        --exact --nocapture >"$LOGS/round-$r.log" 2>&1 || { tail -50 "$LOGS/round-$r.log"; exit 1; }
done
field() { grep -h "^FAILOVER $1 " "$LOGS/round-$2.log" | cut -d' ' -f3-; }
{
    echo "# Failover drill (issue 9, part 5)"
    echo
    echo "Produced by \`bench/failover.sh $ROUNDS\` on $(date -u +%Y-%m-%d) ($(nproc) cores, shared machine)."
    echo "$(grep -h '^FAILOVER loopback' "$LOGS/round-1.log" | cut -d' ' -f2-)."
    echo "Site A: primary PostgreSQL (synchronous standby at B), meta, node a0, a mount; site B: hot standby,"
    echo "meta (--read-db at the standby), node b0, a mount; \`/w\` under \`sync\` a,b; both mounts write"
    echo "64 KiB files with fsync. Cut: A's PostgreSQL crashed (immediate stop) and node a0 killed (SIGKILL);"
    echo "A's meta and mount keep running. Then \`locus meta promote\` at B, B's meta restarted on the"
    echo "promoted standby, \`/w\` set to site b alone. Lease $(field lease_ms 1) ms."
    echo
    echo "| round | acked before cut (A / B) | promote + restart + policy (ms) | B accepts writes again (ms) | acked ops lost | writes accepted at A after cut | fsck after A rejoins |"
    echo "|---|---|---|---|---|---|---|"
    for r in $(seq 1 "$ROUNDS"); do
        echo "| $r | $(field acknowledged_before_cut "$r") | $(field procedure_done_ms "$r") | $(field b_accepts_writes_again_ms "$r") | $(field acknowledged_ops_lost "$r") | $(field writes_accepted_at_a_after_cut "$r") | $(field fsck_after_rejoin "$r") |"
    done
} >"$OUT"
cat "$OUT"
