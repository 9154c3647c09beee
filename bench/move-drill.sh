#!/usr/bin/env bash
# The move drill of issue 35: runs the real-process test
# `homes_move_back_and_forth_under_writes_and_cuts` (crates/locus/tests/homes.rs: sites A
# and B as network namespaces joined by locus-wan at 20 ms RTT, a PostgreSQL server per
# site with a hot standby of the other's, writers at both sites fsyncing files into home
# b while it moves B -> A -> B, the WAN cut for 3 s at a different moment of the move back
# each round) for ROUNDS rounds in one cluster, and writes the "DRILL" lines it prints as
# a Markdown table to bench/results/homes-move-drill.md. Needs root, /dev/fuse, `ip
# netns`, ethtool and Debian's postgresql package.
#
# Usage (as root):  bench/move-drill.sh [ROUNDS]   (CI runs one round, as the test's default)
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${1:-10}
OUT=$ROOT/bench/results/homes-move-drill.md
TEST=homes_move_back_and_forth_under_writes_and_cuts
LOG=$(mktemp /tmp/locus-move-drill.XXXXXX)
trap 'rm -f "$LOG"' EXIT
cd "$ROOT"
COMMIT=$(git describe --always --dirty)
cargo build -q -p testkit --bin locus-wan
start=$(date +%s)
result=passed
if ! LOCUS_DRILL_ROUNDS=$ROUNDS cargo test -q -p locus --test homes -- "$TEST" --exact --nocapture >"$LOG" 2>&1; then
    tail -40 "$LOG"
    result="FAILED: $(grep -m1 -A1 'panicked at' "$LOG" | tail -1 | cut -c1-200 | tr '|' '/')"
fi
# "key=value" of one DRILL line.
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }
{
    echo "# Move drill (issue 35)"
    echo
    echo "Produced by \`bench/move-drill.sh $ROUNDS\` on $(date -u +%Y-%m-%d), commit $COMMIT" \
        "($(nproc) cores, shared machine; debug build, as the test runs; load $(cut -d' ' -f1-3 /proc/loadavg))."
    echo "Sites A and B (network namespaces, locus-wan, 20 ms RTT), a PostgreSQL server per site and a hot standby"
    echo "of the other's; home 0 at A, home b at B; \`--db-timeout 5s\`, leases 2 s. Each round: a writer per site"
    echo "writes and fsyncs a file into home b every 20 ms; the home moves B -> A (no cut), then back A -> B with"
    echo "the WAN cut (100 % loss both ways) for 3 s starting \`cut after\` ms into the move. A move that fails"
    echo "across the cut leaves the home where it was (then moved back without a cut). \`settled\`: from the end"
    echo "of the cut until both metas place the home at the same site with no move in progress. At the end every"
    echo "acknowledged file is read back at both sites (content checked) and fsck runs."
    echo
    echo "| round | cut after (ms) | move back: ok:pause ms, or its error | home after the cut | settled (ms) | acked A / B | failed A / B |"
    echo "|---|---|---|---|---|---|---|"
    grep '^DRILL round=' "$LOG" | while read -r line; do
        echo "| $(field "$line" round) | $(field "$line" cut_after_ms) | $(field "$line" move_back | tr '_' ' ' | cut -c1-160) |" \
            "$(field "$line" placed_after_cut) | $(field "$line" settled_ms) | $(field "$line" acked_a) / $(field "$line" acked_b) |" \
            "$(field "$line" failed_a) / $(field "$line" failed_b) |"
    done
    total=$(grep '^DRILL total' "$LOG" || true)
    echo
    echo "Acknowledged files: $(field "$total" acked); lost or wrong: $(field "$total" lost); fsck clean: $(field "$total" fsck)."
    echo "Result: $result in $(($(date +%s) - start)) s."
} >"$OUT"
cat "$OUT"
