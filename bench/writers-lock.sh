#!/usr/bin/env bash
# Single-site cost of the writers' fairness lock (crates/meta/src/postgres/,
# `writers_lock`): every PostgreSQL write transaction of meta sends
# `SELECT pg_advisory_xact_lock_shared(K)` in the round trip of its first statement.
# pgbench on a server of its own (initdb in a scratch directory, loopback), one client,
# prepared statements, each transaction pipelined as meta sends it (BEGIN SERIALIZABLE,
# an UPDATE of a row and an INSERT, COMMIT; synchronous_commit off as meta's writer),
# with and without the lock statement, in interleaved rounds. Writes
# bench/results/writers-lock.md.
#
# Usage:  bench/writers-lock.sh [ROUNDS] [SECONDS]
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${1:-3}
SECS=${2:-10}
OUT=$ROOT/bench/results/writers-lock.md
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
PGBIN=$(pg_bin)
[[ -x $PGBIN/pgbench ]] || die "pgbench not found: apt-get install postgresql"
WORK=$(mktemp -d /tmp/locus-writers-lock.XXXXXX)
chmod 755 "$WORK"
cleanup() {
    [[ -d $WORK/data ]] && as_pg "$PGBIN/pg_ctl" stop -m fast -D "$WORK/data" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
start_pg "$WORK"
PORT=$PGPORT
PSQL=("$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U locus -d postgres -qAt)
"${PSQL[@]}" -c "CREATE TABLE t (k BIGINT PRIMARY KEY, v BIGINT NOT NULL)" \
    -c "INSERT INTO t SELECT g, 0 FROM generate_series(1, 100000) g" \
    -c "CREATE TABLE e (k BIGINT NOT NULL, v BIGINT NOT NULL)"
txn() {
    echo '\set k random(1, 100000)'
    echo '\startpipeline'
    echo 'BEGIN ISOLATION LEVEL SERIALIZABLE;'
    [[ $1 == locked ]] && echo 'SELECT pg_advisory_xact_lock_shared(7483620001);'
    echo 'UPDATE t SET v = v + 1 WHERE k = :k;'
    echo 'INSERT INTO e (k, v) VALUES (:k, 1);'
    echo 'COMMIT;'
    echo '\endpipeline'
}
txn plain >"$WORK/plain.sql"
txn locked >"$WORK/locked.sql"
declare -A TPS
for r in $(seq 1 "$ROUNDS"); do
    for v in plain locked; do
        TPS[$v,$r]=$(PGOPTIONS="-c synchronous_commit=off" "$PGBIN/pgbench" -h 127.0.0.1 -p "$PORT" -U locus -n \
            -M prepared -c 1 -T "$SECS" -f "$WORK/$v.sql" postgres 2>/dev/null |
            sed -n 's/^tps = \([0-9.]*\).*/\1/p')
        say "round $r $v: ${TPS[$v,$r]} tps"
    done
done
# The lock statement's own latency: the locked transaction unpipelined, per statement.
grep -v pipeline "$WORK/locked.sql" >"$WORK/each.sql"
PGOPTIONS="-c synchronous_commit=off" "$PGBIN/pgbench" -h 127.0.0.1 -p "$PORT" -U locus -n -M prepared -c 1 \
    -T "$SECS" -r -f "$WORK/each.sql" postgres 2>/dev/null | sed -n '/statement latencies/,$p' >"$WORK/each.txt"
{
    echo "# Single-site cost of the writers' fairness lock"
    echo
    echo "Produced by \`bench/writers-lock.sh $ROUNDS $SECS\` on $(date -u +%Y-%m-%d), commit $(git -C "$ROOT" rev-parse --short HEAD)," \
        "$(nproc) cores, shared machine, load $(cut -d' ' -f1-3 /proc/loadavg) at the end; $("$PGBIN/postgres" --version)."
    echo "pgbench, 1 client, prepared statements (as meta), each transaction one pipeline (BEGIN SERIALIZABLE, UPDATE, INSERT,"
    echo "COMMIT), synchronous_commit off; \"locked\" adds \`SELECT pg_advisory_xact_lock_shared(K)\` after the BEGIN,"
    echo "as meta sends it. Rounds interleaved, $SECS s each."
    echo
    echo "| round | plain tps | locked tps | locked / plain |"
    echo "|---|---|---|---|"
    for r in $(seq 1 "$ROUNDS"); do
        echo "| $r | ${TPS[plain,$r]} | ${TPS[locked,$r]} | $(python3 -c "print(f'{${TPS[locked,$r]} / ${TPS[plain,$r]}:.3f}')") |"
    done
    echo
    ratios=$(for r in $(seq 1 "$ROUNDS"); do python3 -c "print(${TPS[locked,$r]} / ${TPS[plain,$r]})"; done)
    echo "Median of locked / plain over the rounds: $(printf '%s\n' "$ratios" | sort -g |
        python3 -c 'import sys; v=[float(l) for l in sys.stdin]; print(f"{sorted(v)[len(v)//2]:.3f}")')."
    echo
    echo "The locked transaction unpipelined (one round trip per statement), latency per statement (pgbench -r):"
    echo
    echo '```'
    cat "$WORK/each.txt"
    echo '```'
} >"$OUT"
cat "$OUT"
