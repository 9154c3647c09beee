#!/usr/bin/env bash
# Metadata rows of the foundation benchmark (create / stat / unlink, bench/meta_bench.py) for
# two locus binaries side by side, plus what each sends per file: the FUSE requests the kernel
# makes and the round trips the client makes to meta (counted from LOCUS_LOG trace lines).
#
# Usage (as root):  bench/meta-ab.sh BIN_A BIN_B [LABEL_A LABEL_B]
# Environment: NFILES=10000 (timed rounds), NCOUNT=1000 (counted run), REPS=3, SCRATCH=/tmp/bench-meta-ab,
#   PHASES="create stat unlink" (bench/meta_bench.py phases, in order; `list` is what `ls -l` does),
#   AS_USER=UID (run the benchmark as that uid instead of root, in a root-owned directory it may
#   write: permission checks are then made, root skips them), PREPARE_A / PREPARE_B (shell run as
#   root on the benchmark directory "$D" before each of that binary's runs, e.g. ACLs to set)
# Rounds are interleaved (A, B, A, B, ...); every round is a fresh `locus up` on an empty data dir.
# The table shows the median of REPS and the load average at the start and the end.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN_A=${1:?usage: meta-ab.sh BIN_A BIN_B [LABEL_A LABEL_B]}
BIN_B=${2:?usage: meta-ab.sh BIN_A BIN_B [LABEL_A LABEL_B]}
LABEL_A=${3:-A}
LABEL_B=${4:-B}
NFILES=${NFILES:-10000}
NCOUNT=${NCOUNT:-1000}
REPS=${REPS:-3}
SCRATCH=${SCRATCH:-/tmp/bench-meta-ab}
PHASES=${PHASES:-create stat unlink}
AS_USER=${AS_USER:-}
PREPARE_A=${PREPARE_A:-}
PREPARE_B=${PREPARE_B:-}
PID=""

stop() {
    [[ -n $PID ]] || return 0
    kill -TERM "$PID" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$PID" 2>/dev/null; then
        umount -l "$SCRATCH/mnt" 2>/dev/null || true
        kill -KILL "$PID" 2>/dev/null || true
    fi
    wait "$PID" 2>/dev/null || true
    PID=""
}
cleanup() {
    stop
    mountpoint -q "$SCRATCH/mnt" 2>/dev/null || rm -rf --one-file-system "$SCRATCH"
}
trap cleanup EXIT

start() { # binary log-filter log-file
    stop
    rm -rf --one-file-system "$SCRATCH"
    mkdir -p "$SCRATCH/mnt" "$SCRATCH/data"
    LOCUS_LOG=$2 "$1" up "$SCRATCH/mnt" --data-dir "$SCRATCH/data" >"$3" 2>&1 &
    PID=$!
    for _ in $(seq 300); do
        kill -0 "$PID" 2>/dev/null || { tail -n 20 "$3" >&2; exit 1; }
        mountpoint -q "$SCRATCH/mnt" && { sleep 2; return 0; }
        sleep 0.1
    done
    echo "meta-ab: $SCRATCH/mnt not mounted within 30 s" >&2
    exit 1
}

# The benchmark directory of a fresh mount, made ready for `label`'s runs.
prepare() { # label
    local prep=$PREPARE_A
    [[ $1 == "$LABEL_B" ]] && prep=$PREPARE_B
    mkdir -p "$SCRATCH/mnt/d"
    [[ -n $AS_USER ]] && chmod 0777 "$SCRATCH/mnt/d"
    [[ -z $prep ]] || D="$SCRATCH/mnt/d" bash -c "$prep"
}

# Runs bench/meta_bench.py with its arguments, as AS_USER when set.
bench() {
    if [[ -n $AS_USER ]]; then
        # The system interpreter: a root-only one (pyenv under /root) is not the user's to run.
        setpriv --reuid="$AS_USER" --regid="$AS_USER" --clear-groups /usr/bin/python3 "$ROOT/bench/meta_bench.py" "$@"
    else
        python3 "$ROOT/bench/meta_bench.py" "$@"
    fi
}

# Per phase: FUSE requests and meta calls per file, by kind.
count() { # binary label
    local log=/tmp/meta-ab-count.log phase from to
    start "$1" "warn,fuse=trace,fuser=warn,client::meta_link=trace" "$log"
    prepare "$2"
    for phase in $PHASES; do
        from=$(wc -l <"$log")
        bench "$SCRATCH/mnt/d" --files "$NCOUNT" --phases "$phase" \
            --settle "$([[ $phase == create ]] && echo 0 || echo 1.2)" >/dev/null
        sleep 0.5 # background calls (Release) finish
        to=$(wc -l <"$log")
        printf '| %s | %s | %s | %s |\n' "$2" "$phase" \
            "$(sed -n "$((from + 1)),${to}p" "$log" | sed "s/\x1b\[[0-9;]*m//g" | grep -o 'fuse request op="[a-z_]*"' | sed 's/.*op="//;s/"//' |
                sort | uniq -c | awk -v n="$NCOUNT" '{printf "%s%s %.2f", sep, $2, $1 / n; sep=", "}')" \
            "$(sed -n "$((from + 1)),${to}p" "$log" | sed "s/\x1b\[[0-9;]*m//g" | grep -o 'meta call request="[A-Za-z]*"' | sed 's/.*request="//;s/"//' |
                sort | uniq -c | awk -v n="$NCOUNT" '{printf "%s%s %.2f", sep, $2, $1 / n; sep=", "}')"
    done
    stop
}

declare -A R
round() { # binary label
    local out
    start "$1" warn /tmp/meta-ab-run.log
    prepare "$2"
    out=$(bench "$SCRATCH/mnt/d" --files "$NFILES" --phases "${PHASES// /,}")
    stop
    echo "  $2: $out" >&2
    for kv in $out; do R["$2|${kv%%=*}"]+="${kv#*=} "; done
}
median() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

echo "# Metadata A/B: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# A = $LABEL_A ($BIN_A), B = $LABEL_B ($BIN_B); $NFILES files, median of $REPS interleaved rounds"
[[ -z $AS_USER ]] || echo "# run as uid $AS_USER in a root-owned directory; A prepared with: ${PREPARE_A:-nothing}; B with: ${PREPARE_B:-nothing}"
echo
echo "Requests per file ($NCOUNT files, LOCUS_LOG trace; FUSE requests answered outside the common"
echo "reply path, such as forget and releasedir, are not counted):"
echo
echo "| Binary | Phase | FUSE requests per file | Meta round trips per file |"
echo "|---|---|---|---|"
count "$BIN_A" "$LABEL_A"
count "$BIN_B" "$LABEL_B"
for _ in $(seq "$REPS"); do
    round "$BIN_A" "$LABEL_A"
    round "$BIN_B" "$LABEL_B"
done
echo
echo "| Phase | $LABEL_A (/s) | $LABEL_B (/s) | B / A |"
echo "|---|---:|---:|---:|"
for p in $PHASES; do
    p=${p}_per_s
    a=$(median "${R[$LABEL_A|$p]}")
    b=$(median "${R[$LABEL_B|$p]}")
    echo "| ${p%_per_s} | $a [${R[$LABEL_A|$p]% }] | $b [${R[$LABEL_B|$p]% }] | $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2f", b / a}') |"
done
echo
echo "# Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
