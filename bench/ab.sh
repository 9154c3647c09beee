#!/usr/bin/env bash
# Side-by-side benchmark of two locus binaries (e.g. before and after a change): each round
# starts `locus up` with a fresh data directory for each binary in turn, writes 256 MiB of
# random data with `dd bs=64k conv=fsync` (the write path, fsync included), then runs
# bench/meta_bench.py (create, stat, unlink of FILES empty files). Prints a Markdown table
# of every round and the medians. Only 127.0.0.1 is used (locus up's own ports).
#
# Usage (as root):  bench/ab.sh OLD_BINARY NEW_BINARY [ROUNDS] [FILES]
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OLD=$1 NEW=$2 ROUNDS=${3:-5} FILES=${4:-5000}
WORK=$(mktemp -d /tmp/locus-ab.XXXXXX)
SRC=$(mktemp /tmp/locus-ab-src.XXXXXX)
head -c $((256 << 20)) /dev/urandom >"$SRC"
cleanup() { rm -f "$SRC"; for m in "$WORK"/mnt-*; do umount -l "$m" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

run() { # binary label round -> "write_mbs create stat unlink"
    # A fresh mount point and data directory every time: nothing carries over.
    local bin=$1 data=$WORK/data-$2-$3 MNT=$WORK/mnt-$2-$3
    mkdir -p "$data" "$MNT"
    "$bin" up "$MNT" --data-dir "$data" >"$WORK/$2.log" 2>&1 &
    local pid=$!
    for _ in $(seq 1 200); do grep -q " $MNT fuse" /proc/mounts && break; sleep 0.05; done
    grep -q " $MNT fuse" /proc/mounts || { echo "locus up ($2) did not mount; its log:" >&2; cat "$WORK/$2.log" >&2; exit 1; }
    mkdir -p "$MNT/bench"
    local t0 t1
    t0=$(date +%s.%N)
    dd if="$SRC" of="$MNT/written" bs=64k conv=fsync status=none
    t1=$(date +%s.%N)
    local mbs
    mbs=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f", 268435456 / (b - a) / 1e6}')
    python3 "$ROOT/bench/meta_bench.py" "$MNT/bench" --files "$FILES" |
        sed -E "s/create_per_s=([0-9]+) stat_per_s=([0-9]+) unlink_per_s=([0-9]+)/$mbs \1 \2 \3/"
    kill -INT "$pid"; wait "$pid" 2>/dev/null || true
    umount -l "$MNT" 2>/dev/null || true
}

echo "| round | binary | write bs=64k fsync (MB/s) | creates/s | stats/s | unlinks/s |"
echo "|---:|---|---:|---:|---:|---:|"
for r in $(seq 1 "$ROUNDS"); do
    for side in old new; do
        bin=$OLD; [[ $side == new ]] && bin=$NEW
        read -r w c s u < <(run "$bin" "$side" "$r")
        echo "$side $w $c $s $u" >>"$WORK/rows"
        echo "| $r | $side | $w | $c | $s | $u |"
    done
done
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo
echo "| median | write bs=64k fsync (MB/s) | creates/s | stats/s | unlinks/s |"
echo "|---|---:|---:|---:|---:|"
for side in old new; do
    cols=()
    for k in 2 3 4 5; do cols+=("$(awk -v s=$side -v k=$k '$1==s {print $k}' "$WORK/rows" | median)"); done
    echo "| $side | ${cols[0]} | ${cols[1]} | ${cols[2]} | ${cols[3]} |"
done
