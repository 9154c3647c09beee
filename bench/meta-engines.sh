#!/usr/bin/env bash
# Metadata engines side by side: the same Locus cluster (one `locus meta`, one `locus node`,
# one FUSE mount, all on 127.0.0.1) with meta over SQLite and over PostgreSQL, single site,
# and JuiceFS (built from its public sources by bench/juicefs-build.sh) on the same two
# engines (`juicefs format --storage file`, a sqlite3:// file or a database on the same
# PostgreSQL server; `juicefs mount` with its default options but for a cache directory in
# the scratch directory and no usage report), interleaved round by round. Each round runs bench/meta_bench.py (create, stat, unlink of
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
#              OUT=bench/results/meta-engines.md  JUICEFS=1 (0: Locus only)
#              ENGINES="sqlite postgres" (Locus's engines to run; the ratio rows need both; add
#              `passthrough` for bench/passthrough, a FUSE file system that passes every call
#              to a directory of the same disk: the most any FUSE file system reaches here)
#              PT_BIN=target/release/passthrough (cargo build --release -p passthrough)
set -Eeuo pipefail
export LOCUS_INSECURE_NO_TLS=true
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-$ROOT/target/release/locus}
ROUNDS=${ROUNDS:-3}
FILES=${FILES:-5000}
PM_FILES=${PM_FILES:-1000}
PM_TX=${PM_TX:-10000}
OUT=${OUT:-$ROOT/bench/results/meta-engines.md}
JUICEFS=${JUICEFS:-1}
PT_BIN=${PT_BIN:-$ROOT/target/release/passthrough}
[[ -x $BIN ]] || { echo "no locus binary at $BIN (cargo build --release -p locus)" >&2; exit 1; }
command -v postmark >/dev/null || { echo "postmark not found: apt-get install postmark" >&2; exit 1; }

# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
PGBIN=$(pg_bin)
[[ -x $PGBIN/initdb ]] || { echo "PostgreSQL not found: apt-get install postgresql" >&2; exit 1; }
read -r -a ENGINES <<<"${ENGINES:-sqlite postgres}"
runs() { [[ " ${ENGINES[*]} " == *" $1 "* ]]; }
if runs passthrough && [[ ! -x $PT_BIN ]]; then
    echo "no passthrough binary at $PT_BIN (cargo build --release -p passthrough)" >&2
    exit 1
fi
if [[ $JUICEFS == 1 ]]; then
    juicefs_bin
    ENGINES+=(juicefs-sqlite juicefs-postgres)
fi

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

start_pg "$WORK/pg"
PGVERSION=$("$PGBIN/postgres" --version)

# Starts `locus ROLE ARGS...` in the background (10 s at most to announce itself).
start() { start_announced "$1" "$2" 200 "${@:3}"; }

run() { # engine round; writes "create stat unlink postmark" to $WORK/last
    local engine=$1 r=$2 db
    case $engine in
    sqlite) db=$WORK/meta-$r.db ;;
    juicefs-sqlite) db=sqlite3://$WORK/jfs-$r.db ;;
    postgres | juicefs-postgres)
        db=${engine%postgres}bench$r
        db=${db//-/_}
        (cd "$WORK/pg" && as_pg "$PGBIN/createdb" -h 127.0.0.1 -p "$PGPORT" -U locus "$db")
        db=postgres://locus@127.0.0.1:$PGPORT/$db
        [[ $engine == postgres ]] || db+="?sslmode=disable"
        ;;
    esac
    local meta mnt=$WORK/mnt-$engine-$r
    mkdir -p "$mnt" "$WORK/node-$engine-$r"
    if [[ $engine == passthrough ]]; then
        "$PT_BIN" "$WORK/node-$engine-$r" "$mnt" >>"$WORK/$engine-$r.log" 2>&1 &
        PIDS+=("$!")
        wait_mounted "$!" "$mnt" "$WORK/$engine-$r.log"
    elif [[ $engine == juicefs-* ]]; then
        juicefs_format "$db" "$WORK/node-$engine-$r" "$WORK/$engine-$r.log"
        juicefs_mount "$db" "$mnt" "$WORK/cache-$engine-$r" "$WORK/$engine-$r.log"
        PIDS+=("$JUICEFS_PID")
    else
        start "meta-$engine-$r" "locus meta listening on" meta --listen 127.0.0.1:0 --db "$db" --init --admit-node n0
        meta=$ANNOUNCED
        start "node-$engine-$r" "locus node listening on" node --listen 127.0.0.1:0 --meta "$meta" \
            --data-dir "$WORK/node-$engine-$r" --id n0
        start "mount-$engine-$r" "locus mounted on" mount "$mnt" --meta "$meta"
    fi
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
say "# Metadata engines: SQLite vs PostgreSQL (single site), Locus and JuiceFS"
say
say "bench/meta-engines.sh, $(date -u +%Y-%m-%d), commit $(git -C "$ROOT" rev-parse --short HEAD)," \
    "$(nproc) cores, $FILES empty files in one directory, PostMark $PM_FILES files / $PM_TX transactions,"
say "$ROUNDS rounds; one meta, one node and one FUSE mount as separate processes on 127.0.0.1;"
say "$PGVERSION on the same machine (fsync on). Load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)."
[[ $JUICEFS != 1 ]] || say "JuiceFS: $JUICEFS_BUILD; engines juicefs-*: \`juicefs format --storage file\`, \`juicefs mount\`" \
    "with default options (--cache-dir in the scratch directory, --no-usage-report)."
runs passthrough && say "Engine passthrough: bench/passthrough (fuser, 2 threads with clone_fd, entry/attr TTL 1 s) over a directory" \
    "of the same disk: no Locus, the cost of the FUSE round trips alone."
say
say "| round | engine | load avg | creates/s | stats/s | unlinks/s | postmark tx/s |"
say "|---:|---|---:|---:|---:|---:|---:|"
for r in $(seq 1 "$ROUNDS"); do
    for engine in "${ENGINES[@]}"; do
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
for engine in "${ENGINES[@]}"; do
    for k in 2 3 4 5; do med[$engine$k]=$(awk -v e=$engine -v k=$k '$1==e {print $k}' "$WORK/rows" | median); done
    say "| $engine | ${med[${engine}2]} | ${med[${engine}3]} | ${med[${engine}4]} | ${med[${engine}5]} |"
done
ratios() { # label a-engine b-engine format scale: a row of scale * a / b per column
    local k row="| $1 |"
    for k in 2 3 4 5; do row+=" $(awk -v a="${med[$2$k]}" -v b="${med[$3$k]}" -v f="$4" -v s="$5" 'BEGIN {printf f, s * a / b}') |"; done
    say "$row"
}
if runs sqlite && runs postgres; then ratios "postgres / sqlite" postgres sqlite "%.0f %%" 100; fi
if [[ $JUICEFS == 1 ]]; then
    ratios "juicefs: postgres / sqlite" juicefs-postgres juicefs-sqlite "%.0f %%" 100
    if runs sqlite; then ratios "sqlite: Locus / JuiceFS" sqlite juicefs-sqlite "%.2fx" 1; fi
    if runs postgres; then ratios "postgres: Locus / JuiceFS" postgres juicefs-postgres "%.2fx" 1; fi
    if runs passthrough; then ratios "passthrough FUSE / JuiceFS on SQLite" passthrough juicefs-sqlite "%.2fx" 1; fi
fi
if runs passthrough && runs sqlite; then ratios "sqlite: Locus / passthrough FUSE" sqlite passthrough "%.0f %%" 100; fi
say
say "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
exec 3>&-
mv "$OUT.tmp" "$OUT"
