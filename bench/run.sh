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
#   PROFILE=auto    auto: perf-profile locus on the worst missed data-path goal and the worst
#                   missed metadata goal; 1: on those worst cases even if met; 0: never;
#                   or a list of tests, e.g. PROFILE=cold_1M,create
#   SKIP_BUILD=0    1: use the existing target/release binaries
#   PHASES=all      read: only the bs=1M write (the file the reads need) and the read rows, no
#                   metadata test (about a minute per repetition at SIZE_MB=1024)
#   QUIET_BUDGET=240  seconds, in all, the run may wait for other processes on this shared host
#                   to go idle before a measurement (each measurement records what they used)
#   LOCUS_RESTART_SETTLE=3  seconds to wait after restarting locus (see restart_locus)
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
# for every target. Each measurement is interleaved across the three targets, REPS times; the
# script cleans up (unmounts, stops its daemons, deletes the scratch directory) on any exit.
# Only 127.0.0.1 is used (locus up binds meta and node there).
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SIZE_MB=${SIZE_MB:-1024}
NFILES=${NFILES:-10000}
REPS=${REPS:-3}
RA_KB=${RA_KB:-1024}
LOCUS_ARGS=${LOCUS_ARGS:-}
PROFILE=${PROFILE:-auto}
SKIP_BUILD=${SKIP_BUILD:-0}
PHASES=${PHASES:-all}
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
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

# ---------------------------------------------------------------- processes, mounts, cleanup

LOCKED=0
cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    ((LOCKED)) || exit "$rc" # nothing of ours to clean up (and maybe another run's files)
    if [[ -n $PERF_PID ]]; then
        kill -INT "$PERF_PID" 2>/dev/null
        wait "$PERF_PID" 2>/dev/null
    fi
    stop_mount "$LOCUS_PID" "$LOCUS_MNT"
    stop_mount "$PT_PID" "$PT_MNT"
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
    rm -f "$SCRATCH.lock"
    ((rc == 0)) || say "exit status $rc (cleaned up)"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Raises the kernel readahead of a FUSE mount (its bdi is named after the mount's MAJ:MIN).
raise_readahead() { # mountpoint label
    RA_BEFORE=$(set_readahead "$1" "$RA_KB")
    RA_NOTES+=("$2 bdi $(mountpoint -d "$1")")
}

start_pt() {
    "$BIN/passthrough" "$PT_BACK" "$PT_MNT" >>"$LOG/passthrough.log" 2>&1 9>&- &
    PT_PID=$!
    PID_OF[pt]=$PT_PID
    wait_mounted "$PT_PID" "$PT_MNT" "$LOG/passthrough.log"
    raise_readahead "$PT_MNT" passthrough
}

start_locus() {
    # shellcheck disable=SC2086 # LOCUS_ARGS is a list of flags
    LOCUS_LOG=${LOCUS_LOG:-warn} "$BIN/locus" up "$LOCUS_MNT" --data-dir "$LOCUS_DATA" $LOCUS_ARGS \
        >>"$LOG/locus.log" 2>&1 9>&- &
    LOCUS_PID=$!
    PID_OF[locus]=$LOCUS_PID
    wait_mounted "$LOCUS_PID" "$LOCUS_MNT" "$LOG/locus.log"
    raise_readahead "$LOCUS_MNT" locus
}

# Known issue (reported): after a restart, `locus up` can mount before its node has re-registered,
# and the client then dials the node's previous (persisted) address: reads fail with EIO until
# the client's next node-list refresh (every 2 s heartbeat). Wait that out before measuring.
restart_locus() {
    stop_mount "$LOCUS_PID" "$LOCUS_MNT"
    LOCUS_PID=""
    start_locus
    sleep "${LOCUS_RESTART_SETTLE:-3}"
}

# This is a shared 2-core machine. "Others" are the live processes outside this script's process
# group, kernel threads excluded: their user+system time (a lower bound: processes that start and
# end between two samples are missed; counting reaped children instead would bill a child's whole
# life to the moment it is reaped).
MY_PGID=$(ps -o pgid= -p $$ | tr -d ' ')
others_ticks() {
    { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v me="$MY_PGID" '{
        pid = $1; line = $0; sub(/^.*\) /, "", line); split(line, f, " ")
        # f[2] ppid, f[3] pgrp, f[12] utime, f[13] stime
        if (f[3] != me && f[2] != 2 && pid != 2) sum += f[12] + f[13]
    } END { print sum + 0 }'
}

# Before each measurement, wait until others use < 0.2 cores (at most QUIET_BUDGET s in all).
QUIET_BUDGET=${QUIET_BUDGET:-240}
QUIET_WAITED=0
wait_quiet() {
    local o0 o1 busy quiet=0
    while :; do
        o0=$(others_ticks)
        sleep 0.5
        o1=$(others_ticks)
        busy=$(awk -v o="$((o1 - o0))" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", o / hz / 0.5 }')
        if ge 0.2 "$busy"; then
            quiet=$((quiet + 1))
            ((quiet < 2)) || return 0 # quiet for a whole second
            continue
        fi
        quiet=0
        ((QUIET_WAITED < QUIET_BUDGET)) || return 0
        ((QUIET_WAITED % 20 == 0)) &&
            say "waiting for other processes to go idle ($busy cores; busiest: $(ps -eo pgid=,comm= --sort=-pcpu |
                awk -v me="$MY_PGID" '$1 != me { printf "%s ", $2; if (++n == 3) exit }'))"
        sleep 0.5
        QUIET_WAITED=$((QUIET_WAITED + 1))
    done
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

# CPU accounting around a measurement: the daemon's user+system time and the whole machine's
# busy time, both as average cores busy over the wall time.
CLK_TCK=$(getconf CLK_TCK)
declare -A PID_OF=()
proc_ticks() { if [[ -n $1 ]]; then awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; else echo 0; fi; }
sys_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
cpu_begin() { # target
    CPU_PID=${PID_OF[$1]:-}
    CPU_P0=$(proc_ticks "$CPU_PID")
    read -r CPU_B0 CPU_T0 < <(sys_ticks)
    CPU_O0=$(others_ticks)
    CPU_NS0=$(date +%s%N)
}
cpu_end() { # -> "daemon-cores machine-cores others-cores"
    local p1 b1 t1 ns1 o1
    ns1=$(date +%s%N)
    p1=$(proc_ticks "$CPU_PID")
    read -r b1 t1 < <(sys_ticks)
    o1=$(others_ticks)
    awk -v p="$((p1 - CPU_P0))" -v hz="$CLK_TCK" -v ns="$((ns1 - CPU_NS0))" -v b="$((b1 - CPU_B0))" \
        -v t="$((t1 - CPU_T0))" -v n="$(nproc)" -v o="$((o1 - CPU_O0))" \
        'BEGIN { s = ns / 1e9; printf "%.2f %.2f %.2f", p / hz / s, (t > 0 ? b / t * n : 0), (o > 0 ? o / hz / s : 0) }'
}
record_cpu() { # test target "daemon machine others"
    local v=($3)
    RES["cpud_$1|$2"]+="${v[0]} "
    RES["cpum_$1|$2"]+="${v[1]} "
    RES["cpuo|all"]+="${v[2]} "
    RES["cpuo_$1|all"]+="${v[2]} "
    NOTE=""
    ge "${v[2]}" 0.2 && NOTE=" (other processes used ${v[2]} cores meanwhile)"
    return 0
}
NOTE=""

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
    wait_quiet
    cpu_begin "$t"
    ns=$(time_ns dd if="$SRC" of="$file" bs="$bs" count="$count" iflag=skip_bytes skip="$off" conv=fsync status=none)
    record_cpu "write_$bs" "$t" "$(cpu_end)"
    check_size "$file"
    [[ $bs == 1M ]] && W1M_OFFSET[$t]=$off
    [[ $bs == 64k ]] && rm -f "$file"
    record "write_$bs" "$t" "$(mbps "$ns")"
    say "  write bs=$bs ${NAME[$t]}: $(mbps "$ns") MB/s$NOTE"
}

seq_read() { # target bs-label rep
    local t=$1 bs=$2 rep=$3 file=${DIR[$1]}/w1m cold warm
    [[ $t == locus ]] && restart_locus
    wait_quiet
    drop_caches
    cpu_begin "$t"
    cold=$(time_ns dd if="$file" of=/dev/null bs="$bs" status=none)
    record_cpu "cold_$bs" "$t" "$(cpu_end)"
    local note=${NOTE:+ cold:$NOTE}
    cpu_begin "$t"
    warm=$(time_ns dd if="$file" of=/dev/null bs="$bs" status=none)
    record_cpu "warm_$bs" "$t" "$(cpu_end)"
    note+=${NOTE:+ warm:$NOTE}
    record "cold_$bs" "$t" "$(mbps "$cold")"
    record "warm_$bs" "$t" "$(mbps "$warm")"
    say "  read bs=$bs ${NAME[$t]}: cold $(mbps "$cold") MB/s, warm $(mbps "$warm") MB/s$note"
    if [[ $rep == 1 && $bs == 1M ]]; then
        # Once per run, make sure the fast numbers come with the right bytes.
        cmp -s -n "$BYTES" -i "${W1M_OFFSET[$t]}:0" "$SRC" "$file" || die "${NAME[$t]}: $file differs from what was written"
    fi
}

meta() { # target rep
    # A new directory per target and repetition, kept (empty) until the end: ext4's Orlov
    # allocator puts a new subdirectory of a TOPDIR directory in the block group with the fewest
    # directories, so removing it would send the next target's files into the group whose inodes
    # were just freed (see the chattr +T comment).
    local t=$1 d=${DIR[$1]}/meta.$1.$2 out v k kv p0
    wait_quiet
    p0=$(proc_ticks "${PID_OF[$t]:-}")
    cpu_begin "$t"
    out=$(python3 "$ROOT/bench/meta_bench.py" "$d" --files "$NFILES" 2>>"$LOG/commands.log") ||
        die "meta_bench failed on ${NAME[$t]} (see $LOG/commands.log)"
    record_cpu meta "$t" "$(cpu_end)"
    RES["cpu_meta|$t"]+="$(awk -v p="$(($(proc_ticks "${PID_OF[$t]:-}") - p0))" -v hz="$CLK_TCK" -v n="$NFILES" \
        'BEGIN { printf "%.0f", p / hz * 1e6 / n }') "
    for kv in $out; do
        k=${kv%%=*} v=${kv#*=}
        record "${k%_per_s}" "$t" "$v"
    done
    say "  metadata ${NAME[$t]}: $out$NOTE"
}

# ---------------------------------------------------------------- statistics and report

median() { # test target
    # shellcheck disable=SC2086 # values are space separated on purpose
    printf '%s\n' ${RES["$1|$2"]} | sort -g | awk '{ v[NR] = $1 } END {
        if (NR == 0) print "n/a"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

spread() { # test target -> "min–max"
    # shellcheck disable=SC2086
    printf '%s\n' ${RES["$1|$2"]} | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.0f–%.0f", lo, hi }'
}

maxval() { # test target
    # shellcheck disable=SC2086
    printf '%s\n' ${RES["$1|$2"]} | sort -g | tail -n 1
}

num() { awk -v v="$1" -v f="${2:-%.0f}" 'BEGIN { if (v == "n/a" || v == "") print "n/a"; else printf f "\n", v }'; }

cell() { # test target
    if ((REPS > 1)); then echo "$(num "$(median "$1" "$2")") ($(spread "$1" "$2"))"; else num "$(median "$1" "$2")"; fi
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
        goal "cold_$bs" "Locus cold seq read / passthrough cold seq read, bs=$bs" "$r" 0.8 \
            "$(pct "$(median "cold_$bs" locus)" "$(median "cold_$bs" pt)")" "≥ 80%" "cold_$bs"
    done
    for bs in 1M 64k; do
        r=$(awk -v a="$(median "write_$bs" locus)" -v b="$(median "write_$bs" pt)" 'BEGIN { print a / b }')
        goal "write_$bs" "Locus seq write / passthrough seq write, bs=$bs" "$r" 0.5 \
            "$(pct "$(median "write_$bs" locus)" "$(median "write_$bs" pt)")" "≥ 50%" "write_$bs"
    done
    goal create "Locus creates/s" "$(median create locus)" 3000 "$(num "$(median create locus)")" "≥ 3000" create
    goal stat "Locus stats/s" "$(median stat locus)" 10000 "$(num "$(median stat locus)")" "≥ 10000" stat
}

write_report() {
    local cpu commit test row k
    cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
    commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    git -C "$ROOT" diff --quiet HEAD -- crates 2>/dev/null || commit="$commit + uncommitted changes in crates/"
    {
        echo "# Locus foundation benchmark"
        echo
        echo "- Date: $(date -u '+%Y-%m-%d %H:%M UTC')"
        echo "- Kernel: $(uname -r); CPU: $cpu, $(nproc) cores; RAM: $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)"
        echo "- Disk: $(findmnt -n -o SOURCE,FSTYPE --target "$SCRATCH" | tr -s ' ' ' ') (scratch $SCRATCH), bdi read_ahead_kb $LOCAL_RA, journal $([[ -n $(ls /proc/fs/jbd2 2>/dev/null) ]] && echo yes || echo none); scratch directories flagged ext4 TOPDIR (\`chattr +T\`, new subdirectories go to fresh block groups): $TOPDIR_NOTE"
        echo "- Locus: commit $commit; \`locus up\` defaults${LOCUS_ARGS:+ plus \`$LOCUS_ARGS\`} (chunk 4M, cache 512M, readahead 8 chunks, upload window 32, attr TTL 1 s)"
        echo "- Passthrough: bench/passthrough (fuser 0.18, 2 threads with clone_fd, max_write 1 MiB, TTL 1 s, pread/pwrite)"
        echo "- FUSE readahead: /sys/class/bdi/<MAJ:MIN of the mount>/read_ahead_kb raised from $RA_BEFORE to $RA_KB after each of the ${#RA_NOTES[@]} FUSE mounts of this run (every Locus restart is a new bdi), verified by reading it back"
        echo "- Sizes: ${SIZE_MB} MiB sequential file; $NFILES files in the metadata test; median of $REPS runs (min–max in brackets)"
        echo "- MB/s = 10^6 bytes/s of wall time around dd (writes include conv=fsync); cold = after \`echo 3 > drop_caches\` (Locus also restarted: empty client cache; its chunk files are cold too)"
        echo "- Other load (processes outside this script; the host is shared): before each measurement the script waited until they used < 0.2 cores (waited ${QUIET_WAITED}×1 s of a ${QUIET_BUDGET} s budget); during the measurements they used $(num "$(median cpuo all)" %.2f) cores median, $(num "$(maxval cpuo all)" %.2f) max"
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
        echo "CPU use while each test ran, average cores busy (this machine has $(nproc)), medians: the daemon's own"
        echo "user+system time; the whole machine (dd, kernel, daemon, and anything else); and the largest share"
        echo "other processes on this shared host took in any run of the test. Metadata row: daemon CPU µs per"
        echo "file for create+stat+unlink together."
        echo
        echo "| Test | Passthrough daemon | Locus daemon | Machine: local disk | Machine: passthrough | Machine: Locus | Other processes, max |"
        echo "|---|---:|---:|---:|---:|---:|---:|"
        for test in write_1M write_64k cold_1M cold_64k warm_1M warm_64k; do
            row="| ${TEST_LABEL[$test]%% (*}"
            for k in "cpud_$test pt" "cpud_$test locus" "cpum_$test local" "cpum_$test pt" "cpum_$test locus"; do
                # shellcheck disable=SC2086 # "test target" pairs
                row+=" | $(num "$(median $k)" %.2f)"
            done
            echo "$row | $(num "$(maxval "cpuo_$test" all)" %.2f) |"
        done
        echo "| Metadata, daemon CPU µs per file | $(num "$(median cpu_meta pt)") | $(num "$(median cpu_meta locus)") | | | | $(num "$(maxval cpuo_meta all)" %.2f) |"
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
    local test=$1 d=$LOCUS_MNT/profile.meta result="" bs ns cpu off count
    find_perf || {
        say "no working perf: skipping the profile"
        return 0
    }
    say "profiling Locus during: ${TEST_LABEL[$test]}"
    case $test in
    write_*)
        bs=${test#write_} off=$((WRITE_INDEX * 4096)) count=$SIZE_MB
        WRITE_INDEX=$((WRITE_INDEX + 1))
        [[ $bs == 64k ]] && count=$((SIZE_MB * 16))
        rm -f "$LOCUS_MNT/w1m"
        cat "$SRC" >/dev/null
        sync
        perf_start
        cpu_begin locus
        ns=$(time_ns dd if="$SRC" of="$LOCUS_MNT/w1m" bs="$bs" count="$count" iflag=skip_bytes skip="$off" conv=fsync status=none)
        cpu=$(cpu_end)
        perf_stop
        result="$(mbps "$ns") MB/s"
        ;;
    cold_*)
        bs=${test#cold_}
        restart_locus
        drop_caches
        perf_start
        cpu_begin locus
        ns=$(time_ns dd if="$LOCUS_MNT/w1m" of=/dev/null bs="$bs" status=none)
        cpu=$(cpu_end)
        perf_stop
        result="$(mbps "$ns") MB/s"
        ;;
    create | stat)
        if [[ $test == stat ]]; then
            python3 "$ROOT/bench/meta_bench.py" "$d" --files "$NFILES" --phases create >/dev/null
            sleep 1.2
        fi
        perf_start
        cpu_begin locus
        result=$(python3 "$ROOT/bench/meta_bench.py" "$d" --files "$NFILES" --phases "$test" --settle 0)
        cpu=$(cpu_end)
        perf_stop
        python3 "$ROOT/bench/meta_bench.py" "$d" --files "$NFILES" --phases unlink --settle 0 >/dev/null
        rmdir "$d"
        ;;
    esac
    local report=("$PERF" report -i "$SCRATCH/perf.data" --stdio --no-children -g none --percentage absolute)
    # awk reads its whole input: cutting the pipe early would kill perf with SIGPIPE.
    summarize() { grep -v '^#' | grep -v '^$' | sed 's/[[:space:]]*$//' | awk -v n="$1" 'NR <= n'; }
    {
        echo "# CPU profile of the locus process (\`locus up\`) during: ${TEST_LABEL[$test]}"
        echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), kernel $(uname -r), $(nproc) cores; ${SIZE_MB} MiB file / $NFILES files"
        echo "# Why this case: furthest below its goal in its group (measured/target = ${GOAL_SCORE[$test]:-n/a})."
        local c=($cpu)
        echo "# This rerun under perf measured: $result; locus used ${c[0]} cores on average, the whole machine ${c[1]} of $(nproc) (other processes ${c[2]})."
        echo "# Command: $PERF record -e cpu-clock -g -p <locus pid>; $PERF report --no-children (self time)."
        echo "# Percentages are of all samples of the locus process; [k] = kernel, [.] = user space."
        echo
        echo "## By thread"
        "${report[@]}" -F overhead,sample,comm 2>/dev/null | summarize 12
        echo
        echo "## By binary"
        "${report[@]}" -F overhead,sample,dso 2>/dev/null | summarize 12
        echo
        echo "## Top symbols (self time, at least 0.5%)"
        "${report[@]}" --percent-limit 0.5 -F overhead,sample,dso,sym 2>/dev/null | summarize 50
        echo
        echo "## Top symbols in the locus binary itself"
        "${report[@]}" --dsos locus --percent-limit 0.2 -F overhead,sample,sym 2>/dev/null | summarize 30
        echo
        echo "## Inclusive time (self + callees), by symbol: which syscalls and library calls the time is under"
        echo "# Kernel stacks are complete; user-space frames are partial (no frame pointers in the release"
        echo "# build), so user-space inclusive figures are lower bounds."
        "$PERF" report -i "$SCRATCH/perf.data" --stdio --children --percentage absolute --sort sym -g none \
            2>/dev/null | summarize 60
        echo
        echo
    } >>"$PROFILE_OUT"
    say "profile summary written to $PROFILE_OUT"
}

# ---------------------------------------------------------------- main

((EUID == 0)) || die "run as root (mounts, drop_caches, bdi readahead)"
[[ -e /dev/fuse ]] || die "no /dev/fuse"
for c in dd python3 mountpoint findmnt cmp awk flock chattr; do command -v "$c" >/dev/null || die "missing $c"; done
[[ $SCRATCH == /tmp/bench-* ]] || die "SCRATCH must be a /tmp/bench-* directory"

# One run at a time per scratch directory: a second run would unmount and delete the first's.
exec 9>"$SCRATCH.lock"
flock -n 9 || die "another bench/run.sh is using $SCRATCH (lock $SCRATCH.lock); wait for it or set SCRATCH=/tmp/bench-other"
LOCKED=1
# A leftover from an interrupted run: unmount it first, never delete through a mount.
for m in "$LOCUS_MNT" "$PT_MNT"; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
rm -rf --one-file-system "$SCRATCH"
mkdir -p "$BIN" "$LOG" "$LOCAL_DIR" "$PT_BACK" "$PT_MNT" "$LOCUS_DATA" "$LOCUS_MNT" "$(dirname "$OUT")"
# This ext4 has no journal, and then its inode allocator skips every inode freed in the last 60 s
# (300 s while the inode table block is dirty) by reading the inode table (ialloc.c
# recently_deleted): creating files in a block group where many files were just deleted, by an
# earlier repetition or by anyone else in /tmp, ran 20x slower (1.6k instead of 40k creates/s).
# The TOPDIR flag makes ext4 place each new subdirectory (and its files) in a fresh block group.
TOPDIR_NOTE="yes"
chattr +T "$SCRATCH" "$LOCAL_DIR" "$PT_BACK" "$LOCUS_DATA" 2>/dev/null || TOPDIR_NOTE="no (chattr +T failed)"

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
        [[ $PHASES == read && $bs == 64k ]] && continue
        for t in "${TARGETS[@]}"; do seq_write "$t" "$bs"; done
    done
    for bs in 1M 64k; do
        for t in "${TARGETS[@]}"; do seq_read "$t" "$bs" "$rep"; done
    done
    [[ $PHASES == read ]] && continue
    for t in "${TARGETS[@]}"; do meta "$t" "$rep"; done
done

evaluate_goals
write_report

# Which cases to profile: per group (data path, metadata) the goal furthest below its target.
PROFILE_LIST=()
case $PROFILE in
0) ;;
auto | 1)
    for group in "cold_1M cold_64k write_1M write_64k" "create stat"; do
        [[ $PHASES == read && $group == "create stat" ]] && continue
        worst=""
        for k in $group; do
            s=${GOAL_SCORE[$k]}
            if [[ $PROFILE == 1 ]] || ! ge "$s" 1; then
                if [[ -z $worst ]] || ! ge "$s" "${GOAL_SCORE[$worst]}"; then worst=$k; fi
            fi
        done
        [[ -z $worst ]] || PROFILE_LIST+=("${GOAL_TEST[$worst]}")
    done
    ;;
*) IFS=, read -ra PROFILE_LIST <<<"$PROFILE" ;;
esac
if ((${#PROFILE_LIST[@]})); then
    : >"$PROFILE_OUT"
    for test in "${PROFILE_LIST[@]}"; do
        [[ -n ${TEST_LABEL[$test]:-} && $test != warm_* && $test != unlink ]] || die "cannot profile $test"
        wait_quiet
        profile "$test"
    done
elif [[ $PROFILE != 0 ]]; then
    say "all goals met: no profile taken"
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'): every goal was met in this run; no profile taken." >"$PROFILE_OUT"
fi

rm -f "$LOCAL_DIR/w1m" "$PT_MNT/w1m" "$LOCUS_MNT/w1m"
say "done in $(($(date +%s) - T_START)) s; results in $OUT"
echo
cat "$OUT"
