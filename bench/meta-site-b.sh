#!/usr/bin/env bash
# Metadata work at a remote site (issue 9, part 4): sites A (10.99.0.1) and B (10.99.0.2) as
# network namespaces joined by `locus-wan` at RTT_MS round-trip time. A runs the primary
# PostgreSQL, a meta and a node; B runs a streaming hot standby of A's server (asynchronous
# streaming replication, `pg_basebackup -R`), a meta of its own (`--db` A's primary,
# `--read-db` B's standby) and a node. Every PostgreSQL server and locus process runs inside
# its site's namespace and listens on the site's address.
#
# Four configurations, measured side by side in one run, workload by workload:
#   single  a mount at A through A's meta (the single-site baseline)
#   before  a mount at B through A's meta (every metadata operation crosses the WAN)
#   after   a mount at B through B's meta, which reads from B's standby and writes to A's
#           primary statement by statement
#   forward a mount at B through a second meta at B (F), which reads from B's standby and
#           forwards each write to A's meta (`--forward-writes-to`, issue 35 part 4)
#   home-b  (HOMES=1) a mount at B through a third meta at B (H), working in /hb, a metadata
#           home of B's (issue 35): B runs a second PostgreSQL primary, home b's engine, and
#           A a hot standby of it; meta H commits home b's writes there (locally), reads
#           home 0 at B's standby and forwards home 0's writes to A's meta; A's meta reads
#           home b at A's standby and forwards home b's writes to meta H. `single` then
#           works in an A-homed directory (home 0) through a meta holding both homes so.
#           SYNC=1: both primaries replicate synchronously to the other site's standby.
# and, beside them, JuiceFS (bench/juicefs-build.sh) on the same PostgreSQL primary (a
# database of its own, `juicefs format --storage file`, the same tree created at A):
#   jfs-single  a JuiceFS mount at A
#   jfs-b       a JuiceFS mount at B (JuiceFS has no standby reads: its metadata
#               client talks to A's primary across the WAN, as Locus's `before` does)
# Workloads on a tree of DIRS directories of PER_DIR empty files, created once at A at
# 0 ms before the WAN delay is set:
#   ls -lR  `ls -lR` of the directories (output counted: it must list every file)
#   stat    os.stat of every file by its path (python3 loop, no directory listing)
#   create  CR_FILES empty files created (O_CREAT|O_EXCL, close) in a new directory, then
#           each unlinked (python3 loop)
#   busy    `create` at B (after and forward only) while a writer at A, through A's meta,
#           creates and unlinks files flat out: the share of its solo rate B keeps
#   postmark  Debian's postmark 1.53 (PM_FILES files of 500..10000 bytes, PM_TX
#           transactions, seed 42) in a directory of its own per configuration and round
#           (jfs-b: round 1 only, its run takes minutes)
#   move    (home-b only) `locus home move b --to a`, then `--to b` (issue 35): home b holds
#           MOVE_FILES entries more (made once, at B, before the rounds) while a writer at B
#           creates files in /hb and times each; the moves' own report (rows copied, how
#           long the home's writes waited) and the writer's slowest operation
#   rename  (home-b only) RN_FILES files renamed at B within /hb (home b), then each from
#           /hb into a directory of home 0 (two-phase commit coordinated by B's meta, home
#           0's part prepared at A's primary), then each back (coordinated by A's meta, the
#           write forwarded there): each rename(2) timed (python3 loop)
# `before` and `jfs-b` run ls -lR and stat on the first BEFORE_DIRS directories only (every file
# costs it the same WAN round trips: the full 10,000 would take most of an hour) and
# the table also gives its time scaled to all DIRS directories.
# Kernel caches: every measurement runs on a fresh `locus mount` (mounted just before,
# unmounted just after), so the FUSE superblock's dentries, inodes and attributes and the
# client's own caches start empty; no global drop_caches (the machine is shared; the page
# cache of the servers' files stays warm for all three configurations alike).
#
# TLS: on (the default; a CA and a certificate per process, as bench/replication.sh).
#
# Usage (as root):  bench/meta-site-b.sh
# Environment: RTT_MS=50 DIRS=100 PER_DIR=100 BEFORE_DIRS=10 PM_FILES=30 PM_TX=60 CR_FILES=100 ROUNDS=1
#   WORKLOADS="ls stat create busy postmark" SKIP_BUILD=0 STRACE_LS=0 (1: a second ls -lR under
#   `strace -c -w`, its summary in the logs directory as strace-ls-CONFIG-ROUND.txt)
#   CONFIGS="single after forward before" (and home-b with HOMES=1) HOMES=1 SYNC=0
#   JUICEFS=1 (0: Locus only)
#   WORK=/tmp/locus-msb PREFIX=lmsb- OUT=bench/results/meta-site-b.md
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RTT_MS=${RTT_MS:-50}
DIRS=${DIRS:-100}
PER_DIR=${PER_DIR:-100}
FILES=$((DIRS * PER_DIR))
BEFORE_DIRS=${BEFORE_DIRS:-10}
PM_FILES=${PM_FILES:-30}
PM_TX=${PM_TX:-60}
CR_FILES=${CR_FILES:-100}
MOVE_FILES=${MOVE_FILES:-10000}
RN_FILES=${RN_FILES:-20}
WORKLOADS=${WORKLOADS:-ls stat create busy postmark}
ROUNDS=${ROUNDS:-1}
STRACE_LS=${STRACE_LS:-0}
JUICEFS=${JUICEFS:-1}
HOMES=${HOMES:-1}
SYNC=${SYNC:-0}
SKIP_BUILD=${SKIP_BUILD:-0}
WORK=${WORK:-/tmp/locus-msb}
PREFIX=${PREFIX:-lmsb-}
OUT=${OUT:-$ROOT/bench/results/meta-site-b.md}

NSA=${PREFIX}s0
NSB=${PREFIX}s1
IPA=10.99.0.1
IPB=10.99.0.2
META_A=$IPA:7070
META_B=$IPB:7070
META_F=$IPB:7071
META_H=$IPB:7072
PGPORT=5432
HOME_PGPORT=5433
DB=locus
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
[[ $(id -u) == 0 ]] || die "needs root (network namespaces, FUSE, PostgreSQL as the postgres user)"
command -v postmark >/dev/null || die "postmark not installed (apt-get install postmark)"
PGBIN=$(pg_bin)
[[ -x $PGBIN/initdb ]] || die "PostgreSQL not found: apt-get install postgresql"

read -ra CONFIGS <<<"${CONFIGS:-single after forward before$([[ $HOMES == 1 ]] && echo " home-b")}"
if [[ $JUICEFS == 1 ]]; then
    juicefs_bin
    CONFIGS+=(jfs-single jfs-b)
fi

if [[ $SKIP_BUILD != 1 ]]; then
    say "cargo build --release (locus, locus-wan)"
    (cd "$ROOT" && cargo build --release -p locus -p testkit --bin locus --bin locus-wan) || die "build failed"
fi

PIDS=() MOUNT_PID="" MNT="" UP_PID=""
as_pg_in() { # ns cmd... : a PostgreSQL tool as the postgres user inside namespace ns
    local ns=$1; shift
    ip netns exec "$ns" runuser -u postgres -- "$@"
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [[ -n $MNT ]] && { umount "$MNT" 2>/dev/null || umount -l "$MNT" 2>/dev/null || true; }
    stop_pid "$MOUNT_PID" 50
    for p in "${PIDS[@]}"; do stop_pid "$p" 50; done
    for s in a b hb hba; do
        [[ -d $WORK/pg-$s/data ]] && as_pg_in "${PREFIX}s$([[ $s == *a ]] && echo 0 || echo 1)" \
            "$PGBIN/pg_ctl" stop -m fast -D "$WORK/pg-$s/data" >/dev/null 2>&1 || true
    done
    stop_pid "$UP_PID" 50
    [[ -x $WORK/bin/locus-wan ]] && "$WORK/bin/locus-wan" down --prefix "$PREFIX" 2>/dev/null || true
    rm -rf "$WORK"/pg-* "$WORK"/node-* "$WORK"/mnt-* "$WORK"/jfs-* 2>/dev/null || true
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rm -rf "$WORK"
mkdir -p "$WORK/bin" "$WORK/logs" "$WORK/node-a" "$WORK/node-b"
chmod 755 "$WORK"
cp "$ROOT/target/release/locus" "$ROOT/target/release/locus-wan" "$WORK/bin/"
LOCUS=$WORK/bin/locus
WAN=$WORK/bin/locus-wan
LOG=$WORK/logs
"$WAN" down --prefix "$PREFIX" 2>/dev/null || true

TLS_DIR=$WORK/tls
bench_pki "meta meta-a a" "meta meta-b b" "meta meta-f b" "meta meta-h b" "node node-a a" "node node-b b" "client client-a a" "client client-b b" \
    "admin admin a"

set_rtt() { # ms
    "$WAN" ctl --control "$CTL" set delay_ms="$(python3 -c "print($1/2)")" loss_pct=0 rate_mbit=1000 \
        queue_bytes=auto >/dev/null
    sleep 0.3
}

say "WAN emulator: 2 sites"
"$WAN" up --prefix "$PREFIX" --sites 2 --rate-mbit 1000 >"$LOG/wan-up.out" 2>"$LOG/wan-fwd.err" &
UP_PID=$!
wait_line "$LOG/wan-up.out" "^ready" 30 "locus-wan up"
CTL=$(sed -n 's/^ready control=//p' "$LOG/wan-up.out")
set_rtt 0

# PostgreSQL: A's primary, then B's standby from a base backup taken across the WAN.
pg_start() { # dir ns ip port
    as_pg_in "$2" "$PGBIN/pg_ctl" start -w -t 60 -D "$WORK/pg-$1/data" -l "$WORK/pg-$1/server.log" \
        -o "-p $4 -k $WORK/pg-$1 -c listen_addresses=$3 -c max_connections=200 -c max_prepared_transactions=64" >/dev/null
}
psql_at() { # ns ip sql [port]
    (cd /tmp && as_pg_in "$1" "$PGBIN/psql" -h "$2" -p "${4:-$PGPORT}" -U locus -d "$DB" -At -c "$3")
}
pg_pair() { # primary-dir primary-ns primary-ip standby-dir standby-ns standby-ip port: a primary, a standby of it
    local d
    for d in "$1" "$4"; do mkdir -p "$WORK/pg-$d" && chown postgres: "$WORK/pg-$d"; done
    (cd "$WORK/pg-$1" && as_pg_in "$2" "$PGBIN/initdb" -D "$WORK/pg-$1/data" -U locus -A trust -E UTF8 --locale=C >/dev/null)
    # The sites' own network (the namespaces reach nothing else) may connect and replicate.
    printf 'host all all 10.99.0.0/24 trust\nhost replication all 10.99.0.0/24 trust\n' >>"$WORK/pg-$1/data/pg_hba.conf"
    (cd "$WORK/pg-$1" && pg_start "$1" "$2" "$3" "$7")
    (cd "$WORK/pg-$1" && as_pg_in "$2" "$PGBIN/createdb" -h "$3" -p "$7" -U locus "$DB")
    (cd "$WORK/pg-$4" && as_pg_in "$5" "$PGBIN/pg_basebackup" -h "$3" -p "$7" -U locus -D "$WORK/pg-$4/data" \
        -R -X stream -c fast)
    (cd "$WORK/pg-$4" && pg_start "$4" "$5" "$6" "$7")
    [[ $(psql_at "$5" "$6" "SELECT pg_is_in_recovery()" "$7") == t ]] || die "pg-$4 is not a standby"
    if [[ $SYNC == 1 ]]; then
        psql_at "$2" "$3" "ALTER SYSTEM SET synchronous_standby_names = '*'" "$7" >/dev/null
        psql_at "$2" "$3" "SELECT pg_reload_conf()" "$7" >/dev/null
    fi
}
REPLICATION=$([[ $SYNC == 1 ]] && echo synchronous || echo asynchronous)
say "PostgreSQL primary at A, hot standby at B ($REPLICATION)"
pg_pair a "$NSA" "$IPA" b "$NSB" "$IPB" "$PGPORT"
PGVERSION=$("$PGBIN/postgres" --version)
PRIMARY=postgres://locus@$IPA:$PGPORT/$DB
STANDBY=postgres://locus@$IPB:$PGPORT/$DB
HOME_FLAGS=() SITES_A=() SITES_H=()
if [[ $HOMES == 1 ]]; then
    say "home b: PostgreSQL primary at B, hot standby at A ($REPLICATION)"
    pg_pair hb "$NSB" "$IPB" hba "$NSA" "$IPA" "$HOME_PGPORT"
    HOME_FLAGS=(--home "b=postgres://locus@$IPB:$HOME_PGPORT/$DB")
    # Each site's server and meta, as each meta reaches them, so that home b can move.
    SITE_DBS=(--site-db "a=$PRIMARY" --site-db "b=postgres://locus@$IPB:$HOME_PGPORT/$DB")
    SITES_A=(--site a "${SITE_DBS[@]}" --site-read-db "b=postgres://locus@$IPA:$HOME_PGPORT/$DB" --site-meta "b=$META_H")
    SITES_H=(--site b "${SITE_DBS[@]}" --site-read-db "a=$STANDBY" --site-meta "a=$META_A")
fi

say "metas and nodes"
# A's meta holds home 0 and, with HOMES=1, reads home b at A's standby and forwards its writes to meta H.
ip netns exec "$NSA" "$LOCUS" meta --listen "$META_A" --db "$PRIMARY" --init --admit-node node-a --admit-node node-b \
    --no-root-squash a --no-root-squash b $(tls meta-a) "${HOME_FLAGS[@]}" "${SITES_A[@]}" \
    $([[ $HOMES == 1 ]] && echo "--read-db b=postgres://locus@$IPA:$HOME_PGPORT/$DB --forward-writes-to b=$META_H") \
    >"$LOG/meta-a.out" 2>"$LOG/meta-a.err" &
PIDS+=($!)
wait_line "$LOG/meta-a.out" listening 30 "meta A"
if [[ $HOMES == 1 ]]; then
    ip netns exec "$NSB" "$LOCUS" meta --listen "$META_H" --db "$PRIMARY" --read-db "$STANDBY" --forward-writes-to "$META_A" \
        "${HOME_FLAGS[@]}" "${SITES_H[@]}" --no-root-squash a --no-root-squash b $(tls meta-h) \
        >"$LOG/meta-h.out" 2>"$LOG/meta-h.err" &
    PIDS+=($!)
    wait_line "$LOG/meta-h.out" listening 60 "meta H"
fi
ip netns exec "$NSB" "$LOCUS" meta --listen "$META_B" --db "$PRIMARY" --read-db "$STANDBY" \
    --no-root-squash a --no-root-squash b $(tls meta-b) >"$LOG/meta-b.out" 2>"$LOG/meta-b.err" &
PIDS+=($!)
wait_line "$LOG/meta-b.out" listening 60 "meta B"
ip netns exec "$NSB" "$LOCUS" meta --listen "$META_F" --db "$PRIMARY" --read-db "$STANDBY" --forward-writes-to "$META_A" \
    --no-root-squash a --no-root-squash b $(tls meta-f) >"$LOG/meta-f.out" 2>"$LOG/meta-f.err" &
PIDS+=($!)
wait_line "$LOG/meta-f.out" listening 60 "meta F"
ip netns exec "$NSA" "$LOCUS" node --listen "$IPA:7101" --meta "$META_A" --data-dir "$WORK/node-a" --id node-a \
    --site a $(tls node-a) >"$LOG/node-a.out" 2>"$LOG/node-a.err" &
PIDS+=($!)
wait_line "$LOG/node-a.out" listening 30 "node A"
ip netns exec "$NSB" "$LOCUS" node --listen "$IPB:7102" --meta "$META_B" --data-dir "$WORK/node-b" --id node-b \
    --site b $(tls node-b) >"$LOG/node-b.out" 2>"$LOG/node-b.err" &
PIDS+=($!)
wait_line "$LOG/node-b.out" listening 30 "node B"

NMOUNT=0
mount_at() { # site meta: a fresh mount; sets MNT and MOUNT_PID
    local site=$1 meta=$2 ns
    ns=$([[ $site == a ]] && echo "$NSA" || echo "$NSB")
    NMOUNT=$((NMOUNT + 1))
    MNT=$WORK/mnt-$NMOUNT
    mkdir -p "$MNT"
    nsenter --net="/run/netns/$ns" "$LOCUS" mount "$MNT" --meta "$meta" --site "$site" $(tls "client-$site") \
        >"$LOG/mount-$NMOUNT.out" 2>"$LOG/mount-$NMOUNT.err" &
    MOUNT_PID=$!
    wait_line "$LOG/mount-$NMOUNT.out" mounted 60 "mount $NMOUNT ($site through $meta)"
}
JFS_URL="postgres://locus@$IPA:$PGPORT/jfs?sslmode=disable"
jfs_mount_at() { # site: a fresh JuiceFS mount (and cache directory); sets MNT and MOUNT_PID
    local ns
    ns=$([[ $1 == a ]] && echo "$NSA" || echo "$NSB")
    NMOUNT=$((NMOUNT + 1))
    MNT=$WORK/mnt-$NMOUNT
    mkdir -p "$MNT"
    nsenter --net="/run/netns/$ns" "$JUICEFS_BIN" mount --no-usage-report --cache-dir "$WORK/jfs-cache-$NMOUNT" \
        "$JFS_URL" "$MNT" >>"$LOG/juicefs.log" 2>&1 9>&- &
    MOUNT_PID=$!
    wait_mounted "$MOUNT_PID" "$MNT" "$LOG/juicefs.log"
}
unmount() {
    umount "$MNT" 2>/dev/null || umount -l "$MNT"
    stop_pid "$MOUNT_PID" 50
    MOUNT_PID="" MNT=""
}
now() { date +%s.%N; }
busy_start() { # a mount at A and a writer in it creating and unlinking flat out, until busy_stop
    mount_at a "$META_A"
    BUSY_MNT=$MNT BUSY_PID=$MOUNT_PID
    rm -f "$WORK/busy.stop"
    python3 - "$BUSY_MNT/busy-$NMOUNT" "$WORK/busy.stop" "$WORK/busy.rate" <<'EOF' &
import os, sys, time
top, stop, rate = sys.argv[1:4]
os.mkdir(top)
n, t0 = 0, time.monotonic()
while not os.path.exists(stop) and n < 1_000_000:
    p = f"{top}/f{n % 100}"
    os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
    os.unlink(p)
    n += 1
open(rate, "w").write(f"{2 * n / (time.monotonic() - t0):.0f}")
EOF
    BUSY_WRITER=$!
    sleep 2 # A writes flat out before B starts
}
busy_stop() { # -> BUSY_RATE: A's writer's operations per second
    touch "$WORK/busy.stop"
    wait "$BUSY_WRITER"
    BUSY_RATE=$(cat "$WORK/busy.rate")
    MNT=$BUSY_MNT MOUNT_PID=$BUSY_PID
    unmount
}

base_of() { case $1 in home-b) echo hb/ ;; *) echo "" ;; esac; } # where a configuration writes
make_tree() { # the tree and postmark's directories in the mount at $MNT; prints the seconds taken
    local t0
    t0=$(now)
    python3 - "$MNT/tree" "$DIRS" "$PER_DIR" <<'EOF'
import os, sys
top, dirs, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.mkdir(top)
for i in range(dirs):
    os.mkdir(f"{top}/d{i:03d}")
    for j in range(per):
        os.close(os.open(f"{top}/d{i:03d}/f{j:03d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
EOF
    python3 -c "print(f'{$(now) - $t0:.1f}')"
    for config in "${CONFIGS[@]}"; do
        for r in $(seq 1 "$ROUNDS"); do mkdir "$MNT/$(base_of "$config")pm-$config-$r"; done
    done
}
say "creating $FILES files in $DIRS directories at A"
if [[ $HOMES == 1 ]]; then
    ip netns exec "$NSA" "$LOCUS" home create /hb b --mode 777 --meta "$META_A" >"$LOG/home-create.out" || die "locus home create failed"
fi
mount_at a "$META_A"
CREATE_S=$(make_tree)
unmount
say "created in $CREATE_S s"
if [[ $JUICEFS == 1 ]]; then
    say "JuiceFS ($JUICEFS_BUILD): a volume on A's primary (database jfs), the same tree created at A"
    (cd "$WORK/pg-a" && as_pg_in "$NSA" "$PGBIN/createdb" -h "$IPA" -p "$PGPORT" -U locus jfs)
    ip netns exec "$NSA" "$JUICEFS_BIN" format --storage file --bucket "$WORK/jfs-data/" "$JFS_URL" msb \
        >>"$LOG/juicefs.log" 2>&1 || die "juicefs format failed (see $LOG/juicefs.log)"
    jfs_mount_at a
    JFS_CREATE_S=$(make_tree)
    unmount
    say "created in $JFS_CREATE_S s"
fi

if [[ " $WORKLOADS " == *" move "* ]]; then
    say "home b: $MOVE_FILES entries more, made at B"
    mount_at b "$META_H"
    python3 - "$MNT/hb/mtree" "$MOVE_FILES" <<'EOF'
import os, sys
top, n = sys.argv[1], int(sys.argv[2])
os.mkdir(top)
for i in range(0, n, 100):
    os.mkdir(f"{top}/d{i // 100:04d}")
    for j in range(i, min(n, i + 100)):
        os.close(os.open(f"{top}/d{i // 100:04d}/f{j:05d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
EOF
    unmount
fi

# B's standby must hold the whole tree before anything reads there.
LSN=$(psql_at "$NSA" "$IPA" "SELECT pg_current_wal_flush_lsn()")
for _ in $(seq 300); do
    [[ $(psql_at "$NSB" "$IPB" "SELECT pg_last_wal_replay_lsn() >= '$LSN'::pg_lsn") == t ]] && break
    sleep 0.1
done
set_rtt "$RTT_MS"
# The RTT as a TCP connect from B to A's PostgreSQL sees it (a SYN and its SYN-ACK).
PING=$(ip netns exec "$NSB" python3 -c '
import socket, sys, time
best = 1e9
for _ in range(5):
    t = time.perf_counter(); socket.create_connection((sys.argv[1], int(sys.argv[2]))).close()
    best = min(best, time.perf_counter() - t)
print(f"{best * 1000:.1f}")' "$IPA" "$PGPORT")
say "WAN at $RTT_MS ms (TCP connect B->A: $PING ms)"

site_of() { case $1 in single | jfs-single) echo a ;; *) echo b ;; esac; }
meta_of() { case $1 in after) echo "$META_B" ;; forward) echo "$META_F" ;; home-b) echo "$META_H" ;; *) echo "$META_A" ;; esac; }
dirs_of() { case $1 in before | jfs-b) echo "$BEFORE_DIRS" ;; *) echo "$DIRS" ;; esac; }
work() { # config workload -> RESULT = seconds (and checks the result)
    local config=$1 workload=$2 t0 t1 n dirs
    dirs=$(dirs_of "$config")
    [[ $workload == busy ]] && busy_start
    case $config in
    jfs-*) jfs_mount_at "$(site_of "$config")" ;;
    *) mount_at "$(site_of "$config")" "$(meta_of "$config")" ;;
    esac
    case $workload in
    ls)
        local list=()
        for i in $(seq 0 $((dirs - 1))); do list+=("$(printf '%s/tree/d%03d' "$MNT" "$i")"); done
        t0=$(now)
        n=$(ls -lR "${list[@]}" | grep -c '^-')
        t1=$(now)
        # Where ls's time goes, on the same mount once more (after the timed run).
        [[ $STRACE_LS == 1 ]] && strace -c -w -o "$LOG/strace-ls-$config-$ROUND.txt" ls -lR "${list[@]}" >/dev/null
        [[ $n == $((dirs * PER_DIR)) ]] || die "ls -lR ($config) listed $n files, not $((dirs * PER_DIR))"
        ;;
    stat)
        t0=$(now)
        python3 - "$MNT/tree" "$dirs" "$PER_DIR" <<'EOF'
import os, sys
top, dirs, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(dirs):
    for j in range(per):
        if os.stat(f"{top}/d{i:03d}/f{j:03d}").st_size != 0:
            sys.exit(f"{top}/d{i:03d}/f{j:03d} is not empty")
EOF
        t1=$(now)
        ;;
    create | busy)
        t0=$(now)
        python3 - "$MNT/$(base_of "$config")cr-$config-$workload-$ROUND" "$CR_FILES" <<'EOF'
import os, sys
top, n = sys.argv[1], int(sys.argv[2])
os.mkdir(top)
for i in range(n):
    os.close(os.open(f"{top}/f{i:04d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
for i in range(n):
    os.unlink(f"{top}/f{i:04d}")
EOF
        t1=$(now)
        ;;
    move)
        # A writer at B in home b, each operation timed, while the home moves to A and back.
        rm -f "$WORK/mover.stop"
        python3 - "$MNT/hb/mv-$ROUND" "$WORK/mover.stop" "$WORK/mover.out" <<'EOF' &
import os, sys, time
top, stop, out = sys.argv[1:4]
os.mkdir(top)
worst, n, errors = 0.0, 0, 0
while not os.path.exists(stop) and n < 1_000_000:
    t = time.monotonic()
    try:
        os.close(os.open(f"{top}/f{n}", os.O_CREAT | os.O_WRONLY, 0o644))
    except OSError:
        errors += 1
    worst = max(worst, time.monotonic() - t)
    n += 1
open(out, "w").write(f"{worst * 1000:.0f} {n} {errors}")
EOF
        local writer=$! t2 t3 there back
        sleep 1
        t0=$(now)
        ip netns exec "$NSB" "$LOCUS" home move b --to a --meta "$META_H" >"$LOG/move-$ROUND-to-a.out" || die "move to a failed"
        t1=$(now)
        sleep 1
        t2=$(now)
        ip netns exec "$NSA" "$LOCUS" home move b --to b --meta "$META_A" >"$LOG/move-$ROUND-to-b.out" || die "move to b failed"
        t3=$(now)
        sleep 1
        touch "$WORK/mover.stop"
        wait "$writer"
        there=$(sed -n 's/.*: \([0-9]*\) rows copied, writes paused \([0-9]*\) ms/\1 \2/p' "$LOG/move-$ROUND-to-a.out")
        back=$(sed -n 's/.*: \([0-9]*\) rows copied, writes paused \([0-9]*\) ms/\1 \2/p' "$LOG/move-$ROUND-to-b.out")
        MOVES[$ROUND]="$(python3 -c "print(f'{$t1 - $t0:.2f} {$t3 - $t2:.2f}')") $there $back $(cat "$WORK/mover.out")"
        ;;
    rename)
        t0=$(now)
        RENAMES[$ROUND]=$(python3 - "$MNT/hb/rn-$ROUND" "$MNT/rn-$ROUND" "$RN_FILES" <<'EOF'
import os, statistics, sys, time
inside, top, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.mkdir(inside)
os.mkdir(top)
for i in range(n):
    os.close(os.open(f"{inside}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
def timed(pairs):
    took = []
    for src, dst in pairs:
        t = time.perf_counter()
        os.rename(src, dst)
        took.append((time.perf_counter() - t) * 1000)
    return f"{statistics.median(took):.1f}/{max(took):.1f}"
within = timed((f"{inside}/f{i}", f"{inside}/g{i}") for i in range(n))
out = timed((f"{inside}/g{i}", f"{top}/g{i}") for i in range(n))
back = timed((f"{top}/g{i}", f"{inside}/h{i}") for i in range(n))
if sorted(os.listdir(inside)) != sorted(f"h{i}" for i in range(n)) or os.listdir(top):
    sys.exit("renames between the homes left the wrong names")
print(within, out, back)
EOF
        ) || die "renames ($config) failed"
        t1=$(now)
        ;;
    postmark)
        printf 'set location %s\nset number %s\nset transactions %s\nset size 500 10000\nset seed 42\nrun\nquit\n' \
            "$MNT/$(base_of "$config")pm-$config-$ROUND" "$PM_FILES" "$PM_TX" >"$WORK/pm-$config.cfg"
        t0=$(now)
        postmark "$WORK/pm-$config.cfg" >"$LOG/postmark-$config-$ROUND.out" 2>&1 || die "postmark ($config) failed"
        t1=$(now)
        ;;
    esac
    unmount
    [[ $workload == busy ]] && busy_stop
    RESULT=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
}

declare -A SECS BUSY MOVES RENAMES
LOADS=()
for r in $(seq 1 "$ROUNDS"); do
    ROUND=$r
    # Odd rounds run the configurations in the given order, even rounds in reverse, so
    # neither is always first after the other's run.
    ORDER=("${CONFIGS[@]}")
    ((r % 2)) || mapfile -t ORDER < <(printf '%s\n' "${CONFIGS[@]}" | tac)
    for workload in $WORKLOADS; do
        for config in "${ORDER[@]}"; do
            # JuiceFS at B takes minutes a postmark run: round 1 only.
            [[ $workload == postmark && $r -gt 1 && $config == jfs-b ]] && continue
            [[ $workload == busy && $config != after && $config != forward && $config != home-b ]] && continue
            [[ ($workload == move || $workload == rename) && $config != home-b ]] && continue
            work "$config" "$workload"
            SECS[$r,$workload,$config]=$RESULT
            [[ $workload == busy ]] && BUSY[$r,$config]=$BUSY_RATE
            say "round $r $workload $config: $RESULT s"
        done
        LOADS+=("$(cut -d' ' -f1-3 /proc/loadavg)")
    done
done

label() { case $1 in ls) echo "ls -lR" ;; stat) echo "stat" ;; create) echo "create+unlink ($CR_FILES files)" ;; postmark) echo "postmark ($PM_FILES files, $PM_TX transactions)" ;; esac; }
for_all_files() { # round|median workload config: its seconds, scaled to all DIRS directories if it ran on fewer ("-": not run)
    local secs r
    if [[ $1 == median ]]; then # the median over the rounds: one slow round on a shared machine moves it little
        secs=$(for r in $(seq 1 "$ROUNDS"); do echo "${SECS[$r,$2,$3]:-}"; done |
            python3 -c 'import statistics, sys; v = [float(l) for l in sys.stdin if l.strip()]; print(statistics.median(v) if v else "")')
    else
        secs=${SECS[$1,$2,$3]:-}
    fi
    [[ -n $secs ]] || { echo "-"; return; }
    if [[ $2 == postmark || $2 == create ]]; then echo "$secs"; else python3 -c "print(f'{$secs * $DIRS / $(dirs_of "$3"):.2f}')"; fi
}
each_row() { # printer: runs `printer ROUND WORKLOAD` for every round and workload measured
    local r workload
    for r in $(seq 1 "$ROUNDS"); do
        for workload in $WORKLOADS; do
            [[ $workload == busy || $workload == move || $workload == rename ]] && continue
            [[ -n ${SECS[$r,$workload,single]:-} ]] || continue
            "$1" "$r" "$workload"
        done
    done
    if [[ $ROUNDS -ge 3 ]]; then
        for workload in $WORKLOADS; do
            [[ $workload == busy || $workload == move || $workload == rename ]] || "$1" median "$workload"
        done
    fi
}
LOCUS_CONFIGS=() JFS_CONFIGS=()
for config in "${CONFIGS[@]}"; do
    case $config in jfs-*) JFS_CONFIGS+=("$config") ;; *) LOCUS_CONFIGS+=("$config") ;; esac
done
describe() { # config: one line saying what it is
    case $1 in
    single) echo "mount at A through A's meta (single-site baseline), working in an A-homed directory" ;;
    after) echo "mount at B through B's meta, reading from B's standby (writes still go to A's primary)" ;;
    forward) echo "mount at B through meta F at B, reading from B's standby and forwarding each write to A's meta (\`--forward-writes-to\`)" ;;
    before) echo "mount at B through A's meta (every metadata operation crosses the WAN); ls -lR and stat on the first $BEFORE_DIRS directories ($((BEFORE_DIRS * PER_DIR)) files), scaled to $FILES files in the table" ;;
    home-b) echo "mount at B through meta H at B, creating and running postmark in /hb, a home of B's (its engine B's primary; reads of the tree at B's standby of A)" ;;
    jfs-single) echo "JuiceFS mount at A" ;;
    jfs-b) echo "JuiceFS mount at B (its metadata client talks to A's primary across the WAN); ls -lR and stat on the first $BEFORE_DIRS directories, scaled to $FILES files in the table" ;;
    esac
}
table() { # baseline configs...: seconds of each (scaled to all files), and each / baseline
    local base=$1 head="| round | workload" rule="|---|---" c
    shift
    for c in "$@"; do head+=" | $c s"; rule+="|---:"; done
    for c in "$@"; do [[ $c == "$base" ]] || { head+=" | $c / $base"; rule+="|---:"; }; done
    echo "$head |"
    echo "$rule|"
    row() { # round workload
        local line="| $1 | $(label "$2")" c
        for c in "${CONFIGS_OF_TABLE[@]}"; do line+=" | $(for_all_files "$1" "$2" "$c")"; done
        local base this
        base=$(for_all_files "$1" "$2" "$BASE_OF_TABLE")
        for c in "${CONFIGS_OF_TABLE[@]}"; do
            [[ $c == "$BASE_OF_TABLE" ]] && continue
            this=$(for_all_files "$1" "$2" "$c")
            if [[ $this == - || $base == - ]]; then
                line+=" | -"
            elif [[ $1 == median ]]; then # the median of the rounds' ratios: each round's pair ran side by side
                line+=" | $(for r in $(seq 1 "$ROUNDS"); do echo "$(for_all_files "$r" "$2" "$c") $(for_all_files "$r" "$2" "$BASE_OF_TABLE")"; done |
                    python3 -c 'import statistics, sys; v = [float(a) / float(b) for a, b in (l.split() for l in sys.stdin) if "-" not in (a, b)]; print(f"{statistics.median(v):.2f}x")')"
            else
                line+=" | $(ratio "$this" "$base")"
            fi
        done
        echo "$line |"
    }
    CONFIGS_OF_TABLE=("$@") BASE_OF_TABLE=$base
    each_row row
}
{
    echo "# Metadata at site B over a ${RTT_MS} ms WAN (issue 9 part 4, issue 35)"
    echo
    echo "bench/meta-site-b.sh, release build of $(git -C "$ROOT" rev-parse --short HEAD), $(date -u +%Y-%m-%d)," \
        "$(nproc) cores (shared machine; load average at the start of each workload: ${LOADS[*]})."
    echo "Sites A ($IPA) and B ($IPB) are network namespaces joined by locus-wan at $RTT_MS ms RTT" \
        "(TCP connect B->A, best of 5: $PING ms), 1000 Mbit/s."
    echo "A: $PGVERSION primary (fsync on), meta, node; B: hot standby ($REPLICATION streaming), metas with"
    echo "\`--read-db\` at the standby, node.$([[ $HOMES == 1 ]] && echo " Home b: a second primary at B, a hot standby of it at A ($REPLICATION).") TLS on."
    echo "Tree: $DIRS directories of $PER_DIR empty files ($FILES), created at A through A's meta at 0 ms RTT in"
    echo "$CREATE_S s. Every measurement on a fresh mount (no kernel dentry/attribute cache, no client cache);"
    echo "configurations interleaved workload by workload (in reverse order in even rounds)$([[ $ROUNDS -ge 3 ]] && echo "; the median rows give each configuration's median over the rounds and the median of the rounds' ratios")."
    echo
    for c in "${CONFIGS[@]}"; do echo "- $c: $(describe "$c")"; done
    echo
    table single "${LOCUS_CONFIGS[@]}"
    if [[ ${#JFS_CONFIGS[@]} -gt 0 ]]; then
        echo
        echo "JuiceFS ($JUICEFS_BUILD) on the same primary (a database of its own), its tree created at A in"
        echo "$JFS_CREATE_S s; the Locus configurations beside, as ratios to JuiceFS at B:"
        echo
        table jfs-b "${JFS_CONFIGS[@]}" "${LOCUS_CONFIGS[@]}"
    fi
    if [[ " $WORKLOADS " == *" busy "* ]]; then
        echo
        echo "Fairness: B's create+unlink of $CR_FILES files alone (\`create\` above) and while a writer at A, through A's"
        echo "meta, creates and unlinks files flat out in home 0 (its operations per second during B's run beside)."
        echo
        echo "| round | config | B alone s | B beside A s | B keeps (alone / beside) | A's writer ops/s |"
        echo "|---|---|---:|---:|---:|---:|"
        for r in $(seq 1 "$ROUNDS"); do
            for config in "${CONFIGS[@]}"; do
                [[ -n ${SECS[$r,busy,$config]:-} && -n ${SECS[$r,create,$config]:-} ]] || continue
                echo "| $r | $config | ${SECS[$r,create,$config]} | ${SECS[$r,busy,$config]} |" \
                    "$(python3 -c "print(f'{100 * ${SECS[$r,create,$config]} / ${SECS[$r,busy,$config]}:.0f} %')") | ${BUSY[$r,$config]} |"
            done
        done
        echo
    fi
    if [[ " $WORKLOADS " == *" move "* ]]; then
        echo "Moves of home b ($MOVE_FILES entries and the rest of /hb): \`locus home move b --to a\` at meta H, then"
        echo "\`--to b\` at A's meta, while a writer at B (through meta H) creates files in /hb back to back. A"
        echo "move's wall time includes making the new database and the holder opening it; the writes"
        echo "wait only from the fence to both metas taking the home up (\"paused\", as the move reports it)."
        echo
        echo "| round | to A s | rows | paused ms | to B s | rows | paused ms | writer's slowest op ms | writer ops | failed |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        for r in $(seq 1 "$ROUNDS"); do
            [[ -n ${MOVES[$r]:-} ]] || continue
            read -r to_a to_b rows_a paused_a rows_b paused_b worst ops failed <<<"${MOVES[$r]}"
            echo "| $r | $to_a | $rows_a | $paused_a | $to_b | $rows_b | $paused_b | $worst | $ops | $failed |"
        done
        echo
        echo "Where each move's time went, as the destination's meta logs it (ms from the move's start: the new"
        echo "database made (created), then opened by the holder across the WAN while writes go on (prepared);"
        echo "from the pause's start: the holder fenced (handed), the rows copied, both metas holding the home at"
        echo "its new place (paused)):"
        echo
        echo '```'
        cat "$LOG/meta-a.err" "$LOG/meta-h.err" | sed 's/\x1b\[[0-9;]*m//g' | grep 'home moved' | sort |
            sed 's/^\([^ ]*\) .*home moved /\1 /; s/_ms=/=/g'
        echo '```'
        echo
    fi
    if [[ " $WORKLOADS " == *" rename "* ]]; then
        echo "Renames at B ($RN_FILES files, each rename(2) timed; median/slowest ms; RTT $PING ms): within home b,"
        echo "from home b into home 0 (two-phase commit coordinated by B's meta, home 0's part prepared at A's"
        echo "primary across the WAN), and back (coordinated by A's meta, the request forwarded there):"
        echo
        echo "| round | within home b | home b -> home 0 | in RTTs | home 0 -> home b | in RTTs |"
        echo "|---|---:|---:|---:|---:|---:|"
        for r in $(seq 1 "$ROUNDS"); do
            [[ -n ${RENAMES[$r]:-} ]] || continue
            read -r within out back <<<"${RENAMES[$r]}"
            echo "| $r | $within | $out | $(python3 -c "print(f'{${out%/*} / $PING:.1f}')") | $back |" \
                "$(python3 -c "print(f'{${back%/*} / $PING:.1f}')") |"
        done
        echo
    fi
    if [[ " $WORKLOADS " == *" postmark "* ]]; then
        echo "postmark's own report per configuration (transactions per second):"
        echo
        for r in $(seq 1 "$ROUNDS"); do
            for config in "${CONFIGS[@]}"; do
                [[ -f $LOG/postmark-$config-$r.out ]] || continue
                echo "- round $r, $config: $(grep -m1 'seconds of transactions' "$LOG/postmark-$config-$r.out" | sed 's/^[[:space:]]*//')"
            done
        done
    fi
} >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
cat "$OUT"
