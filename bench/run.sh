#!/usr/bin/env bash
# Foundation benchmark: local disk vs a passthrough FUSE mount vs a Locus mount, side by side,
# in one run on one machine. Writes bench/results/foundation.md and prints it.
#
# Usage (as root, from anywhere):  bench/run.sh
# Environment knobs:
#   SIZE_MB=1024    size of the sequential file in MiB (SIZE_MB=64 for a quick check)
#   NFILES=10000    files in the metadata test
#   REPS=3          repetitions of every measurement; tables show the median
#   RA_KB=1024      read_ahead_kb set on the FUSE mounts' bdi after mounting
#   LOCUS_ARGS=     extra flags for `locus up`, e.g. "--readahead-chunks 16 --cache 1G"
#   PROFILE=auto    auto: perf-profile locus on the worst missed goal; 1: always; 0: never
#   SKIP_BUILD=0    1: use the existing target/release binaries
#   SCRATCH=/tmp/bench-foundation   scratch directory (must be on the disk under test)
#   OUT=bench/results/foundation.md   PROFILE_OUT=bench/results/foundation-profile.txt
#
# What is measured, for (a) a directory on the local ext4 disk, (b) the passthrough FUSE file
# system of bench/passthrough over such a directory, (c) `locus up` with a fresh data dir:
#   - sequential write, dd bs=1M and bs=64k, conv=fsync (the time includes durability)
#   - sequential read of the 1M-written file, bs=1M and bs=64k, cold (page cache dropped; Locus
#     restarted so its client cache is empty too) then warm (the same read again right away)
#   - create / stat / unlink of NFILES empty files in one directory (bench/meta_bench.py)
# The data written comes from a random source file (Locus deduplicates chunks by content, so
# zeros would not measure anything); every write reads it at a different 4 KiB offset so no two
# written files share a chunk. The source is kept in the page cache so reading it costs the same
# for every target.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZE_MB=${SIZE_MB:-1024}
NFILES=${NFILES:-10000}
REPS=${REPS:-3}
RA_KB=${RA_KB:-1024}
LOCUS_ARGS=${LOCUS_ARGS:-}
PROFILE=${PROFILE:-auto}
SKIP_BUILD=${SKIP_BUILD:-0}
SCRATCH=${SCRATCH:-/tmp/bench-foundation}
OUT=${OUT:-$ROOT/bench/results/foundation.md}
PROFILE_OUT=${PROFILE_OUT:-$ROOT/bench/results/foundation-profile.txt}

BYTES=$((SIZE_MB * 1048576))
BIN=$SCRATCH/bin
LOG=$SCRATCH/logs
SRC=$SCRATCH/source.bin
LOCAL_DIR=$SCRATCH/local
PT_BACK=$SCRATCH/pt-backing
PT_MNT=$SCRATCH/pt-mnt
LOCUS_DATA=$SCRATCH/locus-data
LOCUS_MNT=$SCRATCH/locus-mnt
TARGETS=(local pt locus)
declare -A DIR=([local]=$LOCAL_DIR [pt]=$PT_MNT [locus]=$LOCUS_MNT)
declare -A NAME=([local]="local disk" [pt]="passthrough FUSE" [locus]="Locus")
declare -A RES=()   # "test|target" -> space-separated values, one per repetition
PT_PID=""
LOCUS_PID=""
PERF_PID=""
RA_NOTES=()
RA_BEFORE="?"
T_START=$(date +%s)

say() { printf '[%4ss] %s\n' "$(($(date +%s) - T_START))" "$*" >&2; }
die() {
    say "FAILED: $*"
    exit 1
}

# ---------------------------------------------------------------- processes, mounts, cleanup

# Stops a daemon by pid (SIGTERM unmounts), falling back to a lazy unmount and SIGKILL.
stop_daemon() { # pid mountpoint
    local pid=$1 mnt=$2 i
    [[ -n $pid ]] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for i in $(seq 300); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "pid $pid did not exit within 30 s of SIGTERM: lazy unmount and SIGKILL"
            umount -l "$mnt" 2>/dev/null || true
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    wait "$pid" 2>/dev/null || true
    if mountpoint -q "$mnt" 2>/dev/null; then
        umount -l "$mnt" 2>/dev/null || true
    fi
}

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    if [[ -n $PERF_PID ]]; then
        kill -INT "$PERF_PID" 2>/dev/null
        wait "$PERF_PID" 2>/dev/null
    fi
    stop_daemon "$LOCUS_PID" "$LOCUS_MNT"
    stop_daemon "$PT_PID" "$PT_MNT"
    if mountpoint -q "$LOCUS_MNT" 2>/dev/null || mountpoint -q "$PT_MNT" 2>/dev/null; then
        say "a mount under $SCRATCH is still busy; leaving $SCRATCH in place"
    elif [[ -d $SCRATCH ]]; then
        if ((rc != 0)) && [[ -d $LOG ]]; then
            mkdir -p "/tmp/bench-foundation-logs"
            cp -r "$LOG/." /tmp/bench-foundation-logs/ 2>/dev/null
            say "logs kept in /tmp/bench-foundation-logs"
        fi
        rm -rf --one-file-system "$SCRATCH"
    fi
    ((rc == 0)) || say "exit status $rc (cleaned up)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

wait_mounted() { # pid mountpoint logfile
    local pid=$1 mnt=$2 logfile=$3 i
    for i in $(seq 300); do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$logfile" >&2 || true
            die "the daemon for $mnt exited before mounting"
        fi
        mountpoint -q "$mnt" && return 0
        sleep 0.1
    done
    die "$mnt was not mounted within 30 s"
}

# Raises the kernel readahead of a FUSE mount (its bdi is named after the mount's MAJ:MIN).
raise_readahead() { # mountpoint label
    local dev ra
    dev=$(mountpoint -d "$1")
    ra=/sys/class/bdi/$dev/read_ahead_kb
    [[ -w $ra ]] || die "no $ra for $1"
    RA_BEFORE=$(cat "$ra")
    echo "$RA_KB" >"$ra"
    [[ $(cat "$ra") == "$RA_KB" ]] || die "$ra reads $(cat "$ra") after writing $RA_KB"
    RA_NOTES+=("$2 bdi $dev")
}

start_pt() {
    "$BIN/passthrough" "$PT_BACK" "$PT_MNT" >>"$LOG/passthrough.log" 2>&1 &
    PT_PID=$!
    wait_mounted "$PT_PID" "$PT_MNT" "$LOG/passthrough.log"
    raise_readahead "$PT_MNT" passthrough
}

start_locus() {
    # shellcheck disable=SC2086 # LOCUS_ARGS is a list of flags
    LOCUS_LOG=${LOCUS_LOG:-warn} "$BIN/locus" up "$LOCUS_MNT" --data-dir "$LOCUS_DATA" $LOCUS_ARGS \
        >>"$LOG/locus.log" 2>&1 &
    LOCUS_PID=$!
    wait_mounted "$LOCUS_PID" "$LOCUS_MNT" "$LOG/locus.log"
    raise_readahead "$LOCUS_MNT" locus
}

restart_locus() {
    stop_daemon "$LOCUS_PID" "$LOCUS_MNT"
    LOCUS_PID=""
    start_locus
}

drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

# ---------------------------------------------------------------- measurements

# Runs a command and prints its wall time in nanoseconds.
time_ns() {
    local t0 t1
    t0=$(date +%s%N)
    "$@" 2>>"$LOG/commands.log" || die "command failed: $* (see $LOG/commands.log)"
    t1=$(date +%s%N)
    echo $((t1 - t0))
}

mbps() { awk -v b="$BYTES" -v ns="$1" 'BEGIN { printf "%.0f", b * 1000 / ns }'; }
record() { RES["$1|$2"]+="$3 "; }

check_size() { # file
    local got
    got=$(stat -c %s "$1")
    [[ $got == "$BYTES" ]] || die "$1 has $got bytes, expected $BYTES"
}

WRITE_INDEX=0
declare -A W1M_OFFSET=()

seq_write() { # target bs-label
    local t=$1 bs=$2 d=${DIR[$1]} off count file ns
    off=$((WRITE_INDEX * 4096)) # distinct offset per write: no chunk is shared with any other
    WRITE_INDEX=$((WRITE_INDEX + 1))
    if [[ $bs == 1M ]]; then count=$SIZE_MB file=$d/w1m; else count=$((SIZE_MB * 16)) file=$d/w64k; fi
    rm -f "$file"
    cat "$SRC" >/dev/null # keep the source in the page cache
    sync
    ns=$(time_ns dd if="$SRC" of="$file" bs="$bs" count="$count" iflag=skip_bytes skip="$off" conv=fsync status=none)
    check_size "$file"
    [[ $bs == 1M ]] && W1M_OFFSET[$t]=$off
    [[ $bs == 64k ]] && rm -f "$file"
    record "write_$bs" "$t" "$(mbps "$ns")"
    say "  write bs=$bs ${NAME[$t]}: $(mbps "$ns") MB/s"
}

seq_read() { # target bs-label rep
    local t=$1 bs=$2 rep=$3 file=${DIR[$1]}/w1m cold warm
    [[ $t == locus ]] && restart_locus
    drop_caches
    cold=$(time_ns dd if="$file" of=/dev/null bs="$bs" status=none)
    warm=$(time_ns dd if="$file" of=/dev/null bs="$bs" status=none)
    record "cold_$bs" "$t" "$(mbps "$cold")"
    record "warm_$bs" "$t" "$(mbps "$warm")"
    say "  read bs=$bs ${NAME[$t]}: cold $(mbps "$cold") MB/s, warm $(mbps "$warm") MB/s"
    if [[ $rep == 1 && $bs == 1M ]]; then
        # Once per run, make sure the fast numbers come with the right bytes.
        cmp -s -n "$BYTES" -i "${W1M_OFFSET[$t]}:0" "$SRC" "$file" || die "${NAME[$t]}: $file differs from what was written"
    fi
}

meta() { # target rep
    local t=$1 d=${DIR[$1]}/meta.$2 out v k kv
    out=$(python3 "$ROOT/bench/meta_bench.py" "$d" --files "$NFILES" 2>>"$LOG/commands.log") ||
        die "meta_bench failed on ${NAME[$t]} (see $LOG/commands.log)"
    rmdir "$d"
    for kv in $out; do
        k=${kv%%=*} v=${kv#*=}
        record "${k%_per_s}" "$t" "$v"
    done
    say "  metadata ${NAME[$t]}: $out"
}

# ---------------------------------------------------------------- statistics and report

median() { # test target
    # shellcheck disable=SC2086 # values are space separated on purpose
    printf '%s\n' ${RES["$1|$2"]} | sort -g | awk '{ v[NR] = $1 } END {
        if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.0f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

spread() { # test target -> "min–max"
    # shellcheck disable=SC2086
    printf '%s\n' ${RES["$1|$2"]} | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s–%s", lo, hi }'
}

cell() { # test target
    if ((REPS > 1)); then echo "$(median "$1" "$2") ($(spread "$1" "$2"))"; else median "$1" "$2"; fi
}

pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.0f%%", 100 * a / b; else print "n/a" }'; }
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }

declare -A TEST_LABEL=(
    [write_1M]="Seq write, dd bs=1M conv=fsync (MB/s)"
    [write_64k]="Seq write, dd bs=64k conv=fsync (MB/s)"
    [cold_1M]="Seq read cold, bs=1M (MB/s)"
    [cold_64k]="Seq read cold, bs=64k (MB/s)"
    [warm_1M]="Seq read warm, bs=1M (MB/s)"
    [warm_64k]="Seq read warm, bs=64k (MB/s)"
    [create]="Create empty file (files/s)"
    [stat]="Stat, kernel cache expired (files/s)"
    [unlink]="Unlink (files/s)"
)
TESTS=(write_1M write_64k cold_1M cold_64k warm_1M warm_64k create stat unlink)

# Goals: key, description, measured expression, target, unit. Ratios are Locus / baseline.
GOALS=()
declare -A GOAL_SCORE=() GOAL_TEST=()
goal() { # key label measured target shown-measured shown-target test
    local met=no
    ge "$3" "$4" && met=yes
    GOALS+=("| $2 | $5 | $6 | $met |")
    GOAL_SCORE[$1]=$(awk -v a="$3" -v b="$4" 'BEGIN { printf "%.4f", a / b }')
    GOAL_TEST[$1]=$7
}

evaluate_goals() {
    local bs r
    for bs in 1M 64k; do
        r=$(awk -v a="$(median "cold_$bs" locus)" -v b="$(median "cold_$bs" pt)" 'BEGIN { print a / b }')
        goal "cold_$bs" "Locus cold seq read / passthrough cold seq read, bs=$bs" "$r" 0.6 \
            "$(pct "$(median "cold_$bs" locus)" "$(median "cold_$bs" pt)")" "≥ 60%" "cold_$bs"
    done
    for bs in 1M 64k; do
        r=$(awk -v a="$(median "write_$bs" locus)" -v b="$(median "write_$bs" pt)" 'BEGIN { print a / b }')
        goal "write_$bs" "Locus seq write / passthrough seq write, bs=$bs" "$r" 0.5 \
            "$(pct "$(median "write_$bs" locus)" "$(median "write_$bs" pt)")" "≥ 50%" "write_$bs"
    done
    goal create "Locus creates/s" "$(median create locus)" 3000 "$(median create locus)" "≥ 3000" create
    goal stat "Locus stats/s" "$(median stat locus)" 10000 "$(median stat locus)" "≥ 10000" stat
}

write_report() {
    local cpu commit test row
    cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
    commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    git -C "$ROOT" diff --quiet HEAD -- crates 2>/dev/null || commit="$commit + uncommitted changes in crates/"
    {
        echo "# Locus foundation benchmark"
        echo
        echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "- Kernel: $(uname -r); CPU: $cpu, $(nproc) cores; RAM: $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
        echo "- Disk: $(findmnt -n -o SOURCE,FSTYPE --target "$SCRATCH" | tr -s ' ' ' ') (scratch $SCRATCH), bdi read_ahead_kb $LOCAL_RA"
        echo "- Locus: commit $commit; \`locus up\` defaults${LOCUS_ARGS:+ plus \`$LOCUS_ARGS\`} (chunk 4M, cache 512M, readahead 8 chunks, upload window 16, attr TTL 1 s)"
        echo "- Passthrough: bench/passthrough (fuser 0.18, 2 threads with clone_fd, max_write 1 MiB, TTL 1 s, pread/pwrite)"
        echo "- FUSE readahead: /sys/class/bdi/<MAJ:MIN of the mount>/read_ahead_kb raised from $RA_BEFORE to $RA_KB after each of the ${#RA_NOTES[@]} FUSE mounts of this run (every Locus restart is a new bdi), verified by reading it back"
        echo "- Sizes: ${SIZE_MB} MiB sequential file; $NFILES files in the metadata test; median of $REPS runs (min–max in brackets)"
        echo "- MB/s = 10^6 bytes/s of wall time around dd (writes include conv=fsync); cold = after \`echo 3 > drop_caches\` (Locus also restarted: empty client cache; its chunk files are cold too)"
        echo "- Stat/unlink run 1.2 s after the previous phase so the 1 s entry/attr TTL has expired and FUSE requests reach the daemon; local disk serves them from the dcache"
        echo
        echo "| Test | Local disk | Passthrough FUSE | Locus | Locus / passthrough | Locus / local |"
        echo "|---|---:|---:|---:|---:|---:|"
        for test in "${TESTS[@]}"; do
            row="| ${TEST_LABEL[$test]} | $(cell "$test" local) | $(cell "$test" pt) | $(cell "$test" locus)"
            row+=" | $(pct "$(median "$test" locus)" "$(median "$test" pt)") | $(pct "$(median "$test" locus)" "$(median "$test" local)") |"
            echo "$row"
        done
        echo
        echo "| Goal | Measured | Target | Met |"
        echo "|---|---:|---:|:---:|"
        printf '%s\n' "${GOALS[@]}"
        echo
        echo "Passthrough / local disk: write bs=1M $(pct "$(median write_1M pt)" "$(median write_1M local)"), cold read bs=1M $(pct "$(median cold_1M pt)" "$(median cold_1M local)"), creates $(pct "$(median create pt)" "$(median create local)") (the FUSE ceiling of this machine)."
        echo
        echo "Generated by \`bench/run.sh\` in $(($(date +%s) - T_START)) s."
    } >"$OUT"
}

# ---------------------------------------------------------------- profiling

PERF=""
find_perf() {
    local p
    for p in perf $(compgen -c perf_ 2>/dev/null | sort -u); do
        if command -v "$p" >/dev/null && "$p" --version >/dev/null 2>&1; then
            PERF=$p
            return 0
        fi
    done
    say "perf missing: apt-get install -y linux-perf"
    apt-get install -y -qq linux-perf >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null; } || return 1
    for p in perf $(compgen -c perf_ 2>/dev/null | sort -u); do
        command -v "$p" >/dev/null && "$p" --version >/dev/null 2>&1 && PERF=$p && return 0
    done
    return 1
}

perf_start() {
    "$PERF" record -e cpu-clock -g -p "$LOCUS_PID" -o "$SCRATCH/perf.data" >>"$LOG/perf.log" 2>&1 &
    PERF_PID=$!
    sleep 1 # let perf attach
}

perf_stop() {
    kill -INT "$PERF_PID" 2>/dev/null || true
    wait "$PERF_PID" 2>/dev/null || true
    PERF_PID=""
}

# Re-runs one workload on Locus under `perf record` and writes a text summary.
profile() { # test
    local test=$1 d=$LOCUS_MNT/profile.meta result="" bs
    find_perf || {
        say "no working perf: skipping the profile"
        return 0
    }
    say "profiling Locus during: ${TEST_LABEL[$test]}"
    case $test in
    write_*)
        bs=${test#write_}
        rm -f "$LOCUS_MNT/w1m"
        cat "$SRC" >/dev/null
        sync
        perf_start
        local ns off=$((WRITE_INDEX * 4096)) count=$SIZE_MB
        WRITE_INDEX=$((WRITE_INDEX + 1))
        [[ $bs == 64k ]] && count=$((SIZE_MB * 16))
        ns=$(time_ns dd if="$SRC" of="$LOCUS_MNT/w1m" bs="$bs" count="$count" iflag=skip_bytes skip="$off" conv=fsync status=none)
        perf_stop
        result="$(mbps "$ns") MB/s"
        ;;
    cold_*)
        bs=${test#cold_}
        restart_locus
        drop_caches
        perf_start
        local ns
        ns=$(time_ns dd if="$LOCUS_MNT/w1m" of=/dev/null bs="$bs" status=none)
        perf_stop
        result="$(mbps "$ns") MB/s"
        ;;
    create)
        perf_start
        result=$(python3 "$ROOT/bench/meta_bench.py" "$d" --files "$NFILES" --phases create)
        perf_stop
        python3 "$ROOT/bench/meta_bench.py" "$d" --files "$NFILES" --phases unlink --settle 0 >/dev/null
        rmdir "$d"
        ;;
    stat)
        python3 "$ROOT/bench/meta_bench.py" "$d" --files "$NFILES" --phases create >/dev/null
        sleep 1.2
        perf_start
        result=$(python3 "$ROOT/bench/meta_bench.py" "$d" --files "$NFILES" --phases stat --settle 0)
        perf_stop
        python3 "$ROOT/bench/meta_bench.py" "$d" --files "$NFILES" --phases unlink --settle 0 >/dev/null
        rmdir "$d"
        ;;
    esac
    local report=("$PERF" report -i "$SCRATCH/perf.data" --stdio --no-children -g none --percent-limit 0.7)
    {
        echo "# CPU profile of the locus process (\`locus up\`) during: ${TEST_LABEL[$test]}"
        echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), kernel $(uname -r), $(nproc) cores; ${SIZE_MB} MiB / $NFILES files"
        echo "# Why this case: worst missed goal (measured/target = ${GOAL_SCORE[$test]:-n/a}); this rerun measured: $result"
        echo "# Command: $PERF record -e cpu-clock -g -p <locus pid>, then $PERF report --no-children (self time)"
        echo "# Samples are 4 kHz cpu-clock ticks of any locus thread; [k] = kernel, [.] = user space."
        echo
        echo "## Where the samples are, by thread"
        "${report[@]}" --sort comm 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 15
        echo
        echo "## By binary (kernel vs locus vs libc)"
        "${report[@]}" --sort dso 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 15
        echo
        echo "## Top symbols (self time)"
        "${report[@]}" --sort dso,symbol 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 45
        echo
        echo "## Top symbols of the locus binary only"
        "${report[@]}" --dsos locus --sort symbol 2>/dev/null | grep -v '^#' | grep -v '^$' | head -n 30
    } >"$PROFILE_OUT"
    say "profile summary written to $PROFILE_OUT"
}

# ---------------------------------------------------------------- main

((EUID == 0)) || die "run as root (mounts, drop_caches, bdi readahead)"
[[ -e /dev/fuse ]] || die "no /dev/fuse"
for c in dd python3 mountpoint findmnt cmp awk; do command -v "$c" >/dev/null || die "missing $c"; done
[[ $SCRATCH == /tmp/bench-* ]] || die "SCRATCH must be a /tmp/bench-* directory"

# A leftover from an interrupted run: unmount it first, never delete through a mount.
for m in "$LOCUS_MNT" "$PT_MNT"; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
rm -rf --one-file-system "$SCRATCH"
mkdir -p "$BIN" "$LOG" "$LOCAL_DIR" "$PT_BACK" "$PT_MNT" "$LOCUS_DATA" "$LOCUS_MNT" "$(dirname "$OUT")"

need_mb=$((SIZE_MB * (2 * REPS + 5) + 2048))
free_mb=$(df -Pm "$SCRATCH" | awk 'NR == 2 { print $4 }')
((free_mb > need_mb)) || die "need about $need_mb MB free on $(findmnt -n -o SOURCE --target "$SCRATCH"), have $free_mb"

if [[ $SKIP_BUILD != 1 ]]; then
    for attempt in 1 2 3 4 5; do
        say "cargo build --release -p locus -p passthrough (attempt $attempt)"
        if (cd "$ROOT" && cargo build --release -p locus -p passthrough) >"$LOG/build.log" 2>&1; then
            break
        fi
        tail -n 15 "$LOG/build.log" >&2
        ((attempt < 5)) || die "build failed 5 times"
        say "build failed (crates may be mid-edit); retrying in 60 s"
        sleep 60
    done
fi
# Private copies: a concurrent rebuild cannot swap the binaries mid-run.
cp "$ROOT/target/release/locus" "$ROOT/target/release/passthrough" "$BIN/"

LOCAL_RA=$(cat "/sys/class/bdi/$(stat -c '%Hd:%Ld' "$SCRATCH")/read_ahead_kb" 2>/dev/null || echo "?")
say "random source file: $((SIZE_MB + 1)) MiB"
head -c $(((SIZE_MB + 1) * 1048576)) /dev/urandom >"$SRC"

start_pt
start_locus
say "mounted: passthrough on $PT_MNT, Locus on $LOCUS_MNT; read_ahead_kb=$RA_KB on ${RA_NOTES[*]}"

for rep in $(seq "$REPS"); do
    say "repetition $rep/$REPS"
    for bs in 1M 64k; do
        for t in "${TARGETS[@]}"; do seq_write "$t" "$bs"; done
    done
    for bs in 1M 64k; do
        for t in "${TARGETS[@]}"; do seq_read "$t" "$bs" "$rep"; done
    done
    for t in "${TARGETS[@]}"; do meta "$t" "$rep"; done
done

evaluate_goals
write_report

worst=""
for k in "${!GOAL_SCORE[@]}"; do
    s=${GOAL_SCORE[$k]}
    if [[ $PROFILE == 1 ]] || { [[ $PROFILE == auto ]] && ! ge "$s" 1; }; then
        if [[ -z $worst ]] || ! ge "$s" "${GOAL_SCORE[$worst]}"; then worst=$k; fi
    fi
done
if [[ -n $worst ]]; then
    profile "${GOAL_TEST[$worst]}"
elif [[ $PROFILE != 0 ]]; then
    say "all goals met: no profile taken"
fi

rm -f "$LOCAL_DIR/w1m" "$PT_MNT/w1m" "$LOCUS_MNT/w1m"
say "done in $(($(date +%s) - T_START)) s; results in $OUT"
echo
cat "$OUT"
