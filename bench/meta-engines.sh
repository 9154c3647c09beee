#!/usr/bin/env bash
# Metadata engines side by side: the same Locus cluster (one `locus meta`, one `locus node`,
# one FUSE mount, all on 127.0.0.1) with meta over SQLite and over PostgreSQL, single site,
# interleaved round by round. Each round runs bench/meta_bench.py (create, stat, unlink of
# FILES empty files in one directory) and then PostMark (Debian's `postmark` 1.51:
# PM_FILES files in one directory, PM_TX transactions of create/delete and read/append,
# its default sizes of 500 to 10,000 bytes) on a fresh database and data directory.
# Prints a Markdown table of every round (with the load average at its start) and the
# medians, and writes it to OUT.
#
# PostgreSQL: a server of its own, started by this script (initdb into the scratch directory
# as the `postgres` user when run as root, a free loopback port, default durability settings:
# fsync on, as SQLite's durable commits), stopped on exit. Binaries from PATH or
# /usr/lib/postgresql/*/bin (Debian's postgresql package).
#
# Every process runs with --insecure-no-tls (LOCUS_INSECURE_NO_TLS): this compares the
# engines, not the transport (bench/tls.sh measures what TLS costs).
#
# Usage (as root):  bench/meta-engines.sh
# Environment: BIN=target/release/locus  ROUNDS=3  FILES=5000  PM_FILES=1000  PM_TX=10000
#              OUT=bench/results/meta-engines.md
set -Eeuo pipefail
export LOCUS_INSECURE_NO_TLS=true
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/locus}
ROUNDS=${ROUNDS:-3}
FILES=${FILES:-5000}
PM_FILES=${PM_FILES:-1000}
PM_TX=${PM_TX:-10000}
OUT=${OUT:-$ROOT/bench/results/meta-engines.md}
[[ -x $BIN ]] || { echo "no locus binary at $BIN (cargo build --release -p locus)" >&2; exit 1; }
command -v postmark >/dev/null || { echo "postmark not found: apt-get install postmark" >&2; exit 1; }

# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
PGBIN=$(pg_bin)
[[ -x $PGBIN/initdb ]] || { echo "PostgreSQL not found: apt-get install postgresql" >&2; exit 1; }
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

WORK=$(mktemp -d /tmp/locus-engines.XXXXXX)
chmod 755 "$WORK"
PIDS=()
cleanup() {
    for m in "$WORK"/mnt-*; do umount -l "$m" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [[ -d $WORK/pg/data ]] && as_pg "$PGBIN/pg_ctl" stop -m fast -D "$WORK/pg/data" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

mkdir -p "$WORK/pg"
[[ $(id -u) == 0 ]] && chown postgres: "$WORK/pg"
PGPORT=$(free_port)
(cd "$WORK/pg" && as_pg "$PGBIN/initdb" -D "$WORK/pg/data" -U locus -A trust -E UTF8 --locale=C >/dev/null)
(cd "$WORK/pg" && as_pg "$PGBIN/pg_ctl" start -w -D "$WORK/pg/data" -l "$WORK/pg/server.log" \
    -o "-p $PGPORT -k $WORK/pg -c listen_addresses=127.0.0.1" >/dev/null)
PGVERSION=$("$PGBIN/postgres" --version)

# Starts `locus ROLE ARGS...` in the background and sets ANNOUNCED to the address or
# mount point it announces (bounded wait).
start() {
    local name=$1 prefix=$2; shift 2
    "$BIN" "$@" >"$WORK/$name.out" 2>"$WORK/$name.log" &
    PIDS+=($!)
    for _ in $(seq 1 200); do
        if grep -qs "^$prefix" "$WORK/$name.out"; then ANNOUNCED=$(sed -n "s/^$prefix //p" "$WORK/$name.out"); return; fi
        sleep 0.05
    done
    echo "$name did not start; its log:" >&2; cat "$WORK/$name.log" >&2; exit 1
}

# PostMark's transactions per second in directory $1 (it reports whole seconds, so
# PM_TX should keep it busy for 20 s or more).
postmark_tps() {
    mkdir -p "$1"
    printf 'set location %s\nset number %s\nset transactions %s\nrun\nquit\n' "$1" "$PM_FILES" "$PM_TX" |
        (cd "$1" && postmark) | sed -n 's/.* seconds of transactions (\([0-9]*\) per second).*/\1/p'
}

run() { # engine round; writes "create stat unlink postmark" to $WORK/last
    local engine=$1 r=$2 db
    if [[ $engine == sqlite ]]; then
        db=$WORK/meta-$r.db
    else
        (cd "$WORK/pg" && as_pg "$PGBIN/createdb" -h 127.0.0.1 -p "$PGPORT" -U locus "bench$r")
        db=postgres://locus@127.0.0.1:$PGPORT/bench$r
    fi
    local meta mnt=$WORK/mnt-$engine-$r
    mkdir -p "$mnt" "$WORK/node-$engine-$r"
    start "meta-$engine-$r" "locus meta listening on" meta --listen 127.0.0.1:0 --db "$db" --init --admit-node n0
    meta=$ANNOUNCED
    start "node-$engine-$r" "locus node listening on" node --listen 127.0.0.1:0 --meta "$meta" \
        --data-dir "$WORK/node-$engine-$r" --id n0
    start "mount-$engine-$r" "locus mounted on" mount "$mnt" --meta "$meta"
    python3 "$ROOT/bench/meta_bench.py" "$mnt/bench" --files "$FILES" |
        sed -E 's/create_per_s=([0-9]+) stat_per_s=([0-9]+) unlink_per_s=([0-9]+)/\1 \2 \3/' >"$WORK/last"
    local tps
    tps=$(postmark_tps "$mnt/postmark")
    [[ -n $tps ]] || { echo "postmark gave no result on $engine" >&2; exit 1; }
    echo "$(cat "$WORK/last") $tps" >"$WORK/last"
    umount "$mnt" 2>/dev/null || umount -l "$mnt"
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
}

exec 3>"$OUT.tmp"
say() { echo "$@"; echo "$@" >&3; }
say "# Metadata engines: SQLite vs PostgreSQL (single site)"
say
say "bench/meta-engines.sh, $(date -u +%Y-%m-%d), commit $(git -C "$ROOT" rev-parse --short HEAD)," \
    "$(nproc) cores, $FILES empty files in one directory, PostMark $PM_FILES files / $PM_TX transactions,"
say "$ROUNDS rounds; one meta, one node and one FUSE mount as separate processes on 127.0.0.1;"
say "$PGVERSION on the same machine (fsync on). Load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)."
say
say "| round | engine | load avg | creates/s | stats/s | unlinks/s | postmark tx/s |"
say "|---:|---|---:|---:|---:|---:|---:|"
for r in $(seq 1 "$ROUNDS"); do
    for engine in sqlite postgres; do
        load=$(cut -d' ' -f1 /proc/loadavg)
        run "$engine" "$r"
        read -r c s u p <"$WORK/last"
        echo "$engine $c $s $u $p" >>"$WORK/rows"
        say "| $r | $engine | $load | $c | $s | $u | $p |"
    done
done
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
say
say "| median | creates/s | stats/s | unlinks/s | postmark tx/s |"
say "|---|---:|---:|---:|---:|"
declare -A med
for engine in sqlite postgres; do
    for k in 2 3 4 5; do med[$engine$k]=$(awk -v e=$engine -v k=$k '$1==e {print $k}' "$WORK/rows" | median); done
    say "| $engine | ${med[${engine}2]} | ${med[${engine}3]} | ${med[${engine}4]} | ${med[${engine}5]} |"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.0f %%", 100 * a / b}'; }
say "| postgres / sqlite | $(ratio "${med[postgres2]}" "${med[sqlite2]}") | $(ratio "${med[postgres3]}" "${med[sqlite3]}") |" \
    "$(ratio "${med[postgres4]}" "${med[sqlite4]}") | $(ratio "${med[postgres5]}" "${med[sqlite5]}") |"
say
say "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
exec 3>&-
mv "$OUT.tmp" "$OUT"
