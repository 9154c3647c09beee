#!/usr/bin/env bash
# Side-by-side sequential I/O of two locus binaries (e.g. O_DIRECT chunk reads against
# buffered ones): each binary gets its own `locus up` and data directory, the binaries
# interleaved, every round on a freshly restarted `locus up`. Prints a Markdown table of every
# round, the medians and the load average. Only 127.0.0.1 is used (locus up's own ports).
#   MODE=read (default): both hold the same 1 GiB of random data; each round drops the page
#     cache and reads the file cold with dd (bs=1M and bs=64k).
#   MODE=write: each round writes that much random data (from the page cache) into a new file
#     with dd conv=fsync (bs=4k, 64k and 1M).
#   MODE=postmark: each round runs PostMark (PM_FILES files, default 1000; PM_TX transactions,
#     default 20000) in a new directory; its transactions per second (PostMark counts whole
#     seconds: 20000 transactions keep that within ~5 %).
#
# Usage (as root):  [MODE=write|postmark] bench/io-ab.sh A_BINARY B_BINARY [ROUNDS] [SIZE_MB]
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
T_START=$(date +%s)
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
((EUID == 0)) || die "run as root (mounts, drop_caches)"
(($# >= 2)) || die "usage: [MODE=write|postmark] bench/io-ab.sh A_BINARY B_BINARY [ROUNDS] [SIZE_MB]"
ROUNDS=${3:-3} SIZE_MB=${4:-1024} MODE=${MODE:-read} PM_FILES=${PM_FILES:-1000} PM_TX=${PM_TX:-20000}
case $MODE in
read) SIZES=(1M 64k) TITLE="Cold sequential read, ${SIZE_MB} MiB" COLUMN="dd bs" UNIT=MB/s ;;
write) SIZES=(4k 64k 1M) TITLE="Sequential write (dd conv=fsync), ${SIZE_MB} MiB" COLUMN="dd bs" UNIT=MB/s ;;
postmark)
    command -v postmark >/dev/null || die "postmark not found: apt-get install postmark"
    SIZES=(postmark) TITLE="PostMark, $PM_FILES files, $PM_TX transactions" COLUMN=test UNIT=tx/s
    ;;
*) die "MODE is read, write or postmark, not $MODE" ;;
esac
W=/tmp/bench-io-ab
declare -A BIN=([a]=$1 [b]=$2) PORT=([a]=17270 [b]=17272) PID=() RES=()

stop() { # a|b
    [[ -n ${PID[$1]:-} ]] || return 0
    kill -INT "${PID[$1]}" 2>/dev/null || true
    wait "${PID[$1]}" 2>/dev/null || true
    mountpoint -q "$W/$1/mnt" && umount -l "$W/$1/mnt"
    PID[$1]=""
}
start() { # a|b
    HOME=$W/$1/home LOCUS_LOG=warn "$W/$1/locus" up "$W/$1/mnt" --data-dir "$W/$1/data" \
        --meta-listen "127.0.0.1:${PORT[$1]}" --node-listen "127.0.0.1:$((PORT[$1] + 1))" >>"$W/$1.log" 2>&1 &
    PID[$1]=$!
    for _ in $(seq 200); do
        mountpoint -q "$W/$1/mnt" && break
        sleep 0.1
    done
    mountpoint -q "$W/$1/mnt" || die "locus $1 did not mount (see $W/$1.log)"
    local dev
    dev=$(stat -c '%Hd:%Ld' "$W/$1/mnt")
    echo 1024 >"/sys/class/bdi/$dev/read_ahead_kb"
    sleep 3 # the node re-registers (see restart_locus in bench/run.sh)
}
cleanup() { stop a; stop b; rm -rf --one-file-system "$W"; }
trap cleanup EXIT

rm -rf --one-file-system "$W"
for t in a b; do
    mkdir -p "$W/$t/mnt" "$W/$t/data" "$W/$t/home"
    cp "${BIN[$t]}" "$W/$t/locus"
done
[[ $MODE == postmark ]] || head -c $((SIZE_MB << 20)) /dev/urandom >"$W/src"
if [[ $MODE == read ]]; then
    for t in a b; do
        start "$t"
        dd if="$W/src" of="$W/$t/mnt/f" bs=1M conv=fsync status=none
    done
    rm -f "$W/src"
fi

mbps() { awk -v b=$((SIZE_MB << 20)) -v ns="$1" 'BEGIN { printf "%.0f", b * 1000 / ns }'; }
# One measurement of binary $1 (a|b) at block size $2 in round $3, in $UNIT.
measure() {
    local t0 t1
    case $MODE in
    read)
        sync
        echo 3 >/proc/sys/vm/drop_caches
        t0=$(date +%s%N)
        dd if="$W/$1/mnt/f" of=/dev/null bs="$2" status=none
        ;;
    write)
        rm -f "$W/$1/mnt/f"
        cat "$W/src" >/dev/null
        t0=$(date +%s%N)
        dd if="$W/src" of="$W/$1/mnt/f" bs="$2" conv=fsync status=none
        ;;
    postmark)
        postmark_tps "$W/$1/mnt/postmark-$3"
        return
        ;;
    esac
    t1=$(date +%s%N)
    mbps $((t1 - t0))
}
for r in $(seq "$ROUNDS"); do
    for bs in "${SIZES[@]}"; do
        for t in a b; do
            stop "$t"
            start "$t"
            v=$(measure "$t" "$bs" "$r")
            [[ -n $v ]] || die "no result from $t ($bs, round $r)"
            RES["$t|$bs"]+="$v "
            say "round $r $bs $t: $v $UNIT"
        done
    done
done

median() { printf '%s\n' $1 | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "# $TITLE, A/B: $(date -u '+%Y-%m-%d %H:%M UTC'), $ROUNDS rounds"
echo
echo "- A: ${BIN[a]}; B: ${BIN[b]}"
echo "- Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (2 cores, shared host)"
echo
echo "| $COLUMN | A rounds ($UNIT) | B rounds ($UNIT) | A median | B median | B / A |"
echo "|---|---|---|---:|---:|---:|"
for bs in "${SIZES[@]}"; do
    a=$(median "${RES[a|$bs]}") b=$(median "${RES[b|$bs]}")
    echo "| $bs | ${RES[a|$bs]% } | ${RES[b|$bs]% } | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b / a }') |"
done
