#!/usr/bin/env bash
# Round trips to PostgreSQL per file for create, stat and unlink through one FUSE mount
# (one meta, one node, PostgreSQL on 127.0.0.1), counted by meta's trace event per round
# trip (LOCUS_LOG=meta::postgres::wire=trace) between phases, 1.5 s apart so the kernel's
# entry and attribute caches (TTL 1 s) have run out, as in bench/meta_bench.py --settle;
# beside them the CPU per file of all PostgreSQL processes and of meta (utime + stime
# from /proc), and the wall time per file. CPU is the figure that compares builds on a
# shared 2-core machine: PostgreSQL, meta, the mount and the workload share the cores.
# Context switches per file of PostgreSQL's processes and of meta's threads beside them.
# TRACE=0 leaves meta's trace logging off (its writes to the log change how answers
# arrive and cost CPU of their own): round trips are then not counted ("-").
# BYTES=N writes N bytes into each file as it is created (a file with data: its
# unlink also removes its extents).
# Environment: BIN=target/release/locus  FILES=300  TRACE=1  BYTES=0
set -euo pipefail
export LOCUS_INSECURE_NO_TLS=true # counts round trips only: no TLS on 127.0.0.1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/locus}
FILES=${FILES:-300}
TRACE=${TRACE:-1}
BYTES=${BYTES:-0}
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
PGBIN=$(pg_bin)
WORK=$(mktemp -d /tmp/locus-rt.XXXXXX)
chmod 755 "$WORK"
PIDS=()
cleanup() {
    umount -l "$WORK/mnt" 2>/dev/null || true
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [[ -d $WORK/pg/data ]] && as_pg "$PGBIN/pg_ctl" stop -m fast -D "$WORK/pg/data" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/mnt" "$WORK/node"
start_pg "$WORK/pg"
(cd "$WORK/pg" && as_pg "$PGBIN/createdb" -h 127.0.0.1 -p "$PGPORT" -U locus bench)
# Starts `locus ROLE ARGS...` in the background (20 s at most to announce itself).
start() { start_announced "$1" "$2" 400 "${@:3}"; }
log=info
[[ $TRACE == 0 ]] || log=meta::postgres::wire=trace
LOCUS_LOG=$log start meta "locus meta listening on" meta --listen 127.0.0.1:0 \
    --db "postgres://locus@127.0.0.1:$PGPORT/bench" --init --admit-node n0
meta=$ANNOUNCED
start node "locus node listening on" node --listen 127.0.0.1:0 --meta "$meta" --data-dir "$WORK/node" --id n0
start mount "locus mounted on" mount "$WORK/mnt" --meta "$meta"
mkdir "$WORK/mnt/d"
count() { sleep 1.5; grep -c 'meta::postgres::wire' "$WORK/meta.log" || true; }
switches() { cat "${@/%//status}" 2>/dev/null | awk '/ctxt_switches/ {n += $2} END {print n + 0}'; } # task dirs...
pg_switches() { switches $(pgrep -x postgres | sed 's|^|/proc/|'); }
meta_switches() { switches /proc/"${PIDS[0]}"/task/*; }
ticks() { cat "${@/#//proc/}" 2>/dev/null | awk '{t += $14 + $15} END {print t + 0}'; } # pids...
pg_ticks() { ticks $(pgrep -x postgres | sed 's|$|/stat|'); }
meta_ticks() { ticks "${PIDS[0]}/stat"; }
phase() { # name python-statement-on-path-p
    local before after pg0 pg1 m0 m1 t0 t1 ps0 ps1 ms0 ms1
    before=$(count)
    ps0=$(pg_switches) ms0=$(meta_switches)
    pg0=$(pg_ticks) m0=$(meta_ticks) t0=$(date +%s.%N)
    python3 -c "import os,sys
for i in range($FILES):
    p='$WORK/mnt/d/f%d' % i
    $2"
    t1=$(date +%s.%N) pg1=$(pg_ticks) m1=$(meta_ticks)
    ps1=$(pg_switches) ms1=$(meta_switches)
    after=$(count)
    python3 -c "hz = $(getconf CLK_TCK); per = lambda a, b: (b - a) * 1e6 / hz / $FILES
trips = '%.2f' % (($after - $before) / $FILES) if $TRACE else '-'
print('%-8s %11s %10.0f %10.0f %8.1f %8.1f %10.0f' % ('$1', trips, per($pg0, $pg1), per($m0, $m1),
      ($ps1 - $ps0) / $FILES, ($ms1 - $ms0) / $FILES, ($t1 - $t0) * 1e6 / $FILES))"
}
echo "per file ($FILES files of $BYTES bytes, $(git -C "$ROOT" rev-parse --short HEAD)), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "phase    round trips  pg cpu us  meta cpu us  pg cs  meta cs  wall us"
write=""
[[ $BYTES == 0 ]] || write="os.write(fd, b'x' * $BYTES); "
phase create "fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644); ${write}os.close(fd)"
phase stat "os.stat(p)"
phase unlink "os.unlink(p)"
