#!/usr/bin/env bash
# Side-by-side metadata benchmark of two locus binaries (e.g. before and after a change):
# each round starts `locus up` with a fresh data directory for each binary in turn and runs
# bench/meta_bench.py (create, stat, unlink of FILES empty files) on it. Prints a Markdown
# table of every round and the medians. Only 127.0.0.1 is used (locus up's own ports).
#
# Usage (as root):  bench/meta-ab.sh OLD_BINARY NEW_BINARY [ROUNDS] [FILES]
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OLD=$1 NEW=$2 ROUNDS=${3:-5} FILES=${4:-5000}
WORK=$(mktemp -d /tmp/meta-ab.XXXXXX)
cleanup() { for m in "$WORK"/mnt-*; do umount -l "$m" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

run() { # binary label round -> "create stat unlink"
    # A fresh mount point and data directory every time: nothing carries over.
    local bin=$1 data=$WORK/data-$2-$3 MNT=$WORK/mnt-$2-$3
    mkdir -p "$data" "$MNT"
    "$bin" up "$MNT" --data-dir "$data" >"$WORK/$2.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 200); do grep -q " $MNT fuse" /proc/mounts && break; sleep 0.05; done
    grep -q " $MNT fuse" /proc/mounts || { echo "locus up ($2) did not mount; its log:" >&2; cat "$WORK/$2.log" >&2; exit 1; }
    mkdir -p "$MNT/bench"
    python3 "$ROOT/bench/meta_bench.py" "$MNT/bench" --files "$FILES" |
        sed -E 's/create_per_s=([0-9]+) stat_per_s=([0-9]+) unlink_per_s=([0-9]+)/\1 \2 \3/'
    kill -INT "$pid"; wait "$pid" 2>/dev/null || true
    umount -l "$MNT" 2>/dev/null || true
}

echo "| round | binary | creates/s | stats/s | unlinks/s |"
echo "|---:|---|---:|---:|---:|"
for r in $(seq 1 "$ROUNDS"); do
    for side in old new; do
        bin=$OLD; [[ $side == new ]] && bin=$NEW
        read -r c s u < <(run "$bin" "$side" "$r")
        echo "$side $c $s $u" >>"$WORK/rows"
        echo "| $r | $side | $c | $s | $u |"
    done
done
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| median | creates/s | stats/s | unlinks/s |"
echo "|---|---:|---:|---:|"
for side in old new; do
    c=$(awk -v s=$side '$1==s {print $2}' "$WORK/rows" | median)
    s=$(awk -v s=$side '$1==s {print $3}' "$WORK/rows" | median)
    u=$(awk -v s=$side '$1==s {print $4}' "$WORK/rows" | median)
    echo "| $side | $c | $s | $u |"
done
