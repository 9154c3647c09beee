#!/usr/bin/env bash
# The failover drill of issue 9 part 5, ROUNDS times: runs the real-process test
# `failover_across_a_cut_wan_loses_no_acknowledged_write` (crates/locus/tests/postgres.rs:
# sites A and B as network namespaces joined by locus-wan, A cut off by 100 % loss with
# every process of A still running) and writes the figures it prints (lines "FAILOVER key
# value") as a Markdown table to bench/results/failover.md. Needs root, /dev/fuse, `ip
# netns`, ethtool, python3 and Debian's postgresql package.
#
# Usage (as root):  bench/failover.sh [ROUNDS]
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${1:-3}
OUT=$ROOT/bench/results/failover.md
TEST=failover_across_a_cut_wan_loses_no_acknowledged_write
LOGS=$(mktemp -d /tmp/locus-failover.XXXXXX)
trap 'rm -rf "$LOGS"' EXIT
cd "$ROOT"
cargo build -q -p testkit --bin locus-wan
for r in $(seq 1 "$ROUNDS"); do
    start=$(date +%s)
    if cargo test -q -p locus --test postgres -- "$TEST" --exact --nocapture >"$LOGS/round-$r.log" 2>&1; then
        echo "FAILOVER result passed" >>"$LOGS/round-$r.log"
    else
        # A failed round stays in the table (its assertion below it), not hidden.
        tail -40 "$LOGS/round-$r.log"
        echo "FAILOVER result FAILED: $(grep -m1 -A1 'panicked at' "$LOGS/round-$r.log" | tail -1 | cut -c1-160 | tr '|' '/')" \
            >>"$LOGS/round-$r.log"
    fi
    echo "FAILOVER test_seconds $(($(date +%s) - start))" >>"$LOGS/round-$r.log"
    echo "FAILOVER load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$LOGS/round-$r.log"
done
field() { grep -h "^FAILOVER $1 " "$LOGS/round-$2.log" | cut -d' ' -f3- || true; }
{
    echo "# Failover drill (issue 9, part 5)"
    echo
    echo "Produced by \`bench/failover.sh $ROUNDS\` on $(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD)" \
        "($(nproc) cores, shared machine; debug build, as the test runs)."
    echo "$(grep -h '^FAILOVER setting' "$LOGS/round-1.log" | cut -d' ' -f3-)."
    echo "Site A: primary PostgreSQL (B's standby synchronous), meta, node a0, a mount; site B: hot standby,"
    echo "meta (--read-db at the standby, writes to A's primary), node b0, a mount; \`/w\` under \`sync\` a,b;"
    echo "both mounts write 64 KiB files with fsync, back to back (a python3 process per site). Cut: 100 % loss"
    echo "both ways at the emulator; A's PostgreSQL, meta, node and mount keep running. Then \`locus meta promote\`"
    echo "at B, B's meta restarted on the promoted standby, \`/w\` set to site b alone. After the lease plus 3 s,"
    echo "a fresh create at A (another mount at A). Rejoin: the cut healed, A's PostgreSQL stopped and discarded,"
    echo "A's meta replaced by one over B's primary, node a0 (never stopped) re-registers; policy a,b; fsck."
    echo "Lease $(field lease_ms 1) ms."
    echo
    echo "| round | acked before cut (A / B) | SSI failures at A's primary | promote + restart + policy (ms) | B accepts writes again (ms) | acked ops lost | writes acked at A after cut / after lease | fresh write at A after lease | asked / answered after cut (ms) | rejoin + fsck (ms) | fsck after A rejoins | test s | result | load |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for r in $(seq 1 "$ROUNDS"); do
        echo "| $r | $(field acknowledged_before_cut "$r") | $(field serialization_failures_at_a_primary "$r") |" \
            "$(field procedure_done_ms "$r") | $(field b_accepts_writes_again_ms "$r") | $(field acknowledged_ops_lost "$r") |" \
            "$(field writes_accepted_at_a_after_cut "$r") / $(field writes_accepted_at_a_after_lease "$r") |" \
            "$(field write_at_a_after_lease "$r") | $(field write_at_a_started_after_cut_ms "$r") / $(field write_at_a_answered_after_cut_ms "$r") |" \
            "$(field rejoin_and_fsck_ms "$r") | $(field fsck_after_rejoin "$r") | $(field test_seconds "$r") | $(field result "$r") |" \
            "$(field load "$r") |"
    done
} >"$OUT"
cat "$OUT"
