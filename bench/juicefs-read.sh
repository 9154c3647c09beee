#!/usr/bin/env bash
# Single site, Locus beside JuiceFS: cold sequential read and PostMark, in one run, interleaved.
# Three FUSE mounts on this machine, each over a directory of the same local disk:
#   locus    `locus up` (meta on SQLite, one node, the mount; TLS as `locus up` sets it up)
#   juicefs  JuiceFS (bench/juicefs-build.sh builds it from its public sources): metadata in
#            SQLite, data blocks in a local directory (`juicefs format --storage file`),
#            `juicefs mount` with its default options but for a cache directory in the scratch
#            directory and no usage report
#   pt       the passthrough FUSE file system of bench/passthrough (the FUSE ceiling)
# Each gets one SIZE_MB file written with dd bs=1M conv=fsync from a random source. Every
# repetition then reads it cold with dd, bs=1M and bs=64k, per target in turn: the daemon is
# restarted (Locus: an empty client cache; JuiceFS: a fresh mount, its --cache-dir emptied
# first) and the page cache dropped (echo 3 > drop_caches) before the read. read_ahead_kb is
# set to RA_KB on all three mounts' bdi (as bench/run.sh does). Then PostMark (bench/lib.sh
# postmark_tps, the parameters of bench/meta-engines.sh) on each mount in turn.
# Prints a Markdown table (rows with the load average at their start, medians, Locus /
# JuiceFS ratios against the issue-11 goals) and writes it to OUT.
#
# Usage (as root):  bench/juicefs-read.sh
# Environment: SIZE_MB=1024  REPS=3  PM_FILES=1000  PM_TX=10000  RA_KB=1024
#              BIN=target/release (locus, passthrough)  OUT=bench/results/juicefs-read.md
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZE_MB=${SIZE_MB:-1024}
REPS=${REPS:-3}
PM_FILES=${PM_FILES:-1000}
PM_TX=${PM_TX:-10000}
RA_KB=${RA_KB:-1024}
BIN=${BIN:-$ROOT/target/release}
OUT=${OUT:-$ROOT/bench/results/juicefs-read.md}
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
((EUID == 0)) || die "run as root (mounts, drop_caches, bdi readahead)"
for b in locus passthrough; do
    [[ -x $BIN/$b ]] || die "no $BIN/$b (cargo build --release -p locus -p passthrough)"
done
command -v postmark >/dev/null || die "postmark not found: apt-get install postmark"
juicefs_bin

W=$(mktemp -d /tmp/bench-juicefs.XXXXXX)
chattr +T "$W" 2>/dev/null || true # fresh ext4 block groups for new directories (see bench/run.sh)
mkdir -p "$W/bin" "$W/log" "$W/pt-backing" "$W/locus-data" "$W/jfs-data"
# Private copies: a concurrent rebuild cannot swap the binaries mid-run.
cp "$BIN/locus" "$BIN/passthrough" "$W/bin/"
TARGETS=(locus juicefs pt)
declare -A PID=() MNT=([locus]=$W/mnt-locus [juicefs]=$W/mnt-juicefs [pt]=$W/mnt-pt)
JFS_META=sqlite3://$W/jfs.db
# Ports of our own, kept across restarts (`locus up` defaults to fixed ones).
LOCUS_PORTS="--meta-listen 127.0.0.1:$(free_port) --node-listen 127.0.0.1:$(free_port)"
cleanup() {
    local rc=$? t
    set +e
    for t in "${TARGETS[@]}"; do stop_mount "${PID[$t]:-}" "${MNT[$t]}"; done
    if findmnt -rn -o TARGET | grep -q "^$W/"; then
        say "a mount under $W is still busy; leaving it in place"
    else
        rm -rf --one-file-system "$W"
    fi
    exit "$rc"
}
trap cleanup EXIT

start() { # target
    local t=$1 log=$W/log/$1.log
    mkdir -p "${MNT[$t]}"
    case $t in
    locus)
        # shellcheck disable=SC2086 # LOCUS_PORTS is a list of flags
        LOCUS_LOG=${LOCUS_LOG:-warn} "$W/bin/locus" up "${MNT[$t]}" --data-dir "$W/locus-data" $LOCUS_PORTS >>"$log" 2>&1 &
        PID[$t]=$!
        wait_mounted "${PID[$t]}" "${MNT[$t]}" "$log"
        ;;
    juicefs)
        juicefs_mount "$JFS_META" "${MNT[$t]}" "$W/jfs-cache" "$log"
        PID[$t]=$JUICEFS_PID
        ;;
    pt)
        "$W/bin/passthrough" "$W/pt-backing" "${MNT[$t]}" >>"$log" 2>&1 &
        PID[$t]=$!
        wait_mounted "${PID[$t]}" "${MNT[$t]}" "$log"
        ;;
    esac
    set_readahead "${MNT[$t]}" "$RA_KB" >/dev/null
    # bench/run.sh restart_locus: a restarted `locus up` can mount before its node has
    # re-registered; the client sees the node's new address at its next 2 s refresh.
    [[ $t != locus ]] || sleep "${LOCUS_RESTART_SETTLE:-3}"
}

# A cold start of a target: daemon stopped, its client-side caches emptied, started again.
restart() { # target
    stop_mount "${PID[$1]}" "${MNT[$1]}"
    [[ $1 != juicefs ]] || rm -rf --one-file-system "$W/jfs-cache"
    start "$1"
}

mbps() { awk -v b="$((SIZE_MB * 1048576))" -v ns="$1" 'BEGIN { printf "%.0f", b * 1000 / ns }'; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

juicefs_format "$JFS_META" "$W/jfs-data" "$W/log/juicefs.log"
for t in "${TARGETS[@]}"; do start "$t"; done
say "random source file: $SIZE_MB MiB"
head -c $((SIZE_MB * 1048576)) /dev/urandom >"$W/source.bin"
for t in "${TARGETS[@]}"; do
    say "write $SIZE_MB MiB to $t"
    dd if="$W/source.bin" of="${MNT[$t]}/file" bs=1M conv=fsync status=none
done

exec 3>"$OUT.tmp"
out() { echo "$@"; echo "$@" >&3; }
out "# Cold sequential read and PostMark, single site: Locus, JuiceFS (SQLite + local directory), passthrough FUSE"
out
out "bench/juicefs-read.sh, $(date -u +%Y-%m-%d), commit $(git -C "$ROOT" rev-parse --short HEAD), $(nproc) cores," \
    "a $SIZE_MB MiB file read cold with dd (daemon restarted, JuiceFS cache directory emptied, page cache dropped)," \
    "read_ahead_kb=$RA_KB on every mount; PostMark $PM_FILES files / $PM_TX transactions; $REPS repetitions."
out "JuiceFS: $JUICEFS_BUILD; \`juicefs mount\` default options (--cache-dir in the scratch directory, --no-usage-report)."
out "Load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)."
out
out "| rep | test | target | load avg | value |"
out "|---:|---|---|---:|---:|"
for rep in $(seq "$REPS"); do
    for bs in 1M 64k; do
        for t in "${TARGETS[@]}"; do
            restart "$t"
            drop_caches
            load=$(cut -d' ' -f1 /proc/loadavg)
            t0=$(date +%s%N)
            dd if="${MNT[$t]}/file" of=/dev/null bs="$bs" status=none
            v=$(mbps $(($(date +%s%N) - t0)))
            if [[ $rep == 1 && $bs == 1M ]]; then
                cmp -s "$W/source.bin" "${MNT[$t]}/file" || die "$t: the file read back differs from what was written"
            fi
            echo "cold_$bs $t $v" >>"$W/rows"
            out "| $rep | cold read bs=$bs (MB/s) | $t | $load | $v |"
        done
    done
    for t in "${TARGETS[@]}"; do
        load=$(cut -d' ' -f1 /proc/loadavg)
        v=$(postmark_tps "${MNT[$t]}/postmark-$rep")
        [[ -n $v ]] || die "postmark gave no result on $t"
        echo "postmark $t $v" >>"$W/rows"
        out "| $rep | postmark (tx/s) | $t | $load | $v |"
    done
done

declare -A med
out
out "| median | locus | juicefs | pt | locus / juicefs | goal (issue 11) |"
out "|---|---:|---:|---:|---:|---|"
for test in cold_1M cold_64k postmark; do
    for t in "${TARGETS[@]}"; do med[$t]=$(awk -v k="$test" -v t="$t" '$1 == k && $2 == t {print $3}' "$W/rows" | median); done
    r=$(awk -v a="${med[locus]}" -v b="${med[juicefs]}" 'BEGIN { printf "%.2f", a / b }')
    goal=1.5
    [[ $test != postmark ]] || goal=3
    met=$(awk -v r="$r" -v g="$goal" 'BEGIN { print (r >= g) ? "met" : "missed" }')
    out "| $test | ${med[locus]} | ${med[juicefs]} | ${med[pt]} | ${r}x | ≥ ${goal}x: $met |"
done
out
out "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
exec 3>&-
mv "$OUT.tmp" "$OUT"
