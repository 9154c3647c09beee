#!/usr/bin/env bash
# The client library without a mount (issue 39), side by side in one run on `locus up`
# (SQLite meta, one node and its mount in one process, TLS on): FILES empty files created
# (O_CREAT|O_EXCL, close), stated and unlinked, THREADS at a time, and a sequential read
# of a READ_MB file, through
#   mount    a FUSE mount in a process of its own (`locus mount`, a client of the cluster
#            like the other two; python3, THREADS processes each doing its share)
#   library  the Rust client library (`locus bench`: THREADS tasks on one client, in a
#            process of its own)
#   python   the `locus` Python package (THREADS threads on one locus.Client; each call
#            releases the GIL)
# The file read (distinct random blocks: repeated ones would be one chunk, read from the
# client's cache) is written through the library, so no page cache holds it; the mount
# reads it after POSIX_FADV_DONTNEED on it, in 8 MiB reads; the library and the Python
# package each from a process of their own (their chunk caches start empty). `locus up`'s
# own mount is not measured: it reads the node's store in its process, without TLS.
#
# Usage (as root):  bench/library.sh
# Environment: FILES=10000 THREADS=8 READ_MB=1024 ROUNDS=2 SKIP_BUILD=0
#   WORK=/tmp/locus-lib OUT=bench/results/library.md
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FILES=${FILES:-10000}
THREADS=${THREADS:-8}
READ_MB=${READ_MB:-1024}
ROUNDS=${ROUNDS:-2}
SKIP_BUILD=${SKIP_BUILD:-0}
WORK=${WORK:-/tmp/locus-lib}
OUT=${OUT:-$ROOT/bench/results/library.md}
LOCUS=$ROOT/target/release/locus
VENV=$ROOT/target/python-venv
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
[[ $(id -u) == 0 && -e /dev/fuse ]] || die "needs root and /dev/fuse (locus up mounts)"

if [[ $SKIP_BUILD != 1 ]]; then
    say "cargo build --release (locus); the Python package in release into $VENV"
    (cd "$ROOT" && cargo build --release -p locus --bin locus) || die "build failed"
    [[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2"
    VIRTUAL_ENV=$VENV "$VENV/bin/maturin" develop -q --release --manifest-path "$ROOT/crates/python/Cargo.toml" ||
        die "the Python package did not build"
fi
PY=$VENV/bin/python

UP_PID=""
MOUNT_PID=""
cleanup() {
    [[ -n $MOUNT_PID ]] && kill -INT "$MOUNT_PID" 2>/dev/null && wait "$MOUNT_PID" 2>/dev/null
    [[ -n $UP_PID ]] && kill -INT "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null
    umount -l "$WORK/client-mnt" 2>/dev/null || true
    umount -l "$WORK/mnt" 2>/dev/null || true
}
trap cleanup EXIT
start_up
"$LOCUS" ca issue --dir "$TLS_DIR" --role client --name bench --site default >/dev/null
export LOCUS_CA=$TLS_DIR/ca.pem LOCUS_CERT=$TLS_DIR/bench.pem LOCUS_KEY=$TLS_DIR/bench.key LOCUS_META=$META
MNT=$WORK/client-mnt
mkdir -p "$MNT"
"$LOCUS" mount "$MNT" --meta "$META" --site default >"$WORK/mount.out" 2>"$WORK/mount.err" &
MOUNT_PID=$!
wait_line "$WORK/mount.out" "mounted on" 60 "locus mount" "$MOUNT_PID"
say "locus up: meta $META; measured mount $MNT"

# The mount's share of each op in THREADS processes; prints "create s", "stat s", "unlink s".
mount_ops() { # dir
    "$PY" - "$1" "$FILES" "$THREADS" <<'PYEOF'
import os, sys, time
from multiprocessing import Pool
top, files, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.mkdir(top)
def create(t):
    for i in range(t, files, threads):
        os.close(os.open(f"{top}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
def stat(t):
    for i in range(t, files, threads):
        os.stat(f"{top}/f{i}")
def unlink(t):
    for i in range(t, files, threads):
        os.unlink(f"{top}/f{i}")
with Pool(threads) as pool:
    for op in (create, stat, unlink):
        t0 = time.perf_counter()
        pool.map(op, range(threads))
        print(op.__name__, f"{time.perf_counter() - t0:.3f}")
os.rmdir(top)
PYEOF
}

# The Python package's: THREADS threads on one client.
python_ops() { # dir
    "$PY" - "$1" "$FILES" "$THREADS" <<'PYEOF'
import sys, time, threading
import locus
top, files, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = locus.connect()
c.mkdir(top)
ops = {
    "create": lambda p: c.open(p, "xb").close(),
    "stat": c.stat,
    "unlink": c.remove,
}
for name, op in ops.items():
    def share(t):
        for i in range(t, files, threads):
            op(f"{top}/f{i}")
    t0 = time.perf_counter()
    ts = [threading.Thread(target=share, args=(t,)) for t in range(threads)]
    for t in ts: t.start()
    for t in ts: t.join()
    print(name, f"{time.perf_counter() - t0:.3f}")
c.rmdir(top)
c.close()
PYEOF
}

library_ops() { # -> "create s" ... from `locus bench`
    "$LOCUS" bench --meta "$META" --files "$FILES" --threads "$THREADS" | awk 'NR > 1 { print $1, $3 }'
}

say "a $READ_MB MiB file written through the library"
"$PY" - "$READ_MB" <<'PYEOF'
import os, sys
import locus
c = locus.connect()
with c.open("/big", "wb") as f:
    for _ in range(int(sys.argv[1]) // 8):
        f.write(os.urandom(8 << 20))
c.close()
PYEOF

read_mount() { # -> seconds
    "$PY" - "$MNT/big" <<'PYEOF'
import os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
t0 = time.perf_counter()
while os.read(fd, 8 << 20):
    pass
print(f"{time.perf_counter() - t0:.3f}")
os.close(fd)
PYEOF
}
read_python() {
    "$PY" - <<'PYEOF'
import time
import locus
c = locus.connect()
t0 = time.perf_counter()
with c.open("/big", "rb") as f:
    while f.read(8 << 20):
        pass
print(f"{time.perf_counter() - t0:.3f}")
c.close()
PYEOF
}
read_library() {
    "$LOCUS" bench --meta "$META" --files 1 --threads 1 --read /big | sed -n 's/^read .* in \([0-9.]*\) s,.*/\1/p'
}

declare -A SECS
for r in $(seq 1 "$ROUNDS"); do
    for way in mount library python; do
        case $way in
        mount) out=$(mount_ops "$MNT/m$r") ;;
        library) out=$(library_ops) ;;
        python) out=$(python_ops "/p$r") ;;
        esac
        while read -r op secs; do SECS[$r,$op,$way]=$secs; done <<<"$out"
        SECS[$r,read,$way]=$(read_"$way")
        say "round $r $way: $(echo "$out" | tr '\n' ' ') read ${SECS[$r,read,$way]} s"
    done
done

rate() { python3 -c "print(f'{$1 / $2:.0f}')"; }
{
    echo "# The client library without a mount (issue 39)"
    echo
    echo "bench/library.sh, release build of $(git -C "$ROOT" rev-parse --short HEAD), $(date -u +%Y-%m-%d), $(nproc) cores"
    echo "(shared machine; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)). \`locus up\` (SQLite meta and one node"
    echo "in one process; TLS on). $FILES empty files, $THREADS at a time: mount = python3 with $THREADS processes"
    echo "on a \`locus mount\` of its own; library = \`locus bench\` ($THREADS tasks, one client, a process of its own); python = the"
    echo "\`locus\` package ($THREADS threads, one client). Read: a $READ_MB MiB file written through the library, read"
    echo "in 8 MiB reads (the mount after POSIX_FADV_DONTNEED; the others from a fresh process)."
    echo
    echo "| round | op | mount /s | library /s | python /s | library / mount | python / library |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    for r in $(seq 1 "$ROUNDS"); do
        for op in create stat unlink; do
            m=${SECS[$r,$op,mount]} l=${SECS[$r,$op,library]} p=${SECS[$r,$op,python]}
            echo "| $r | $op | $(rate "$FILES" "$m") | $(rate "$FILES" "$l") | $(rate "$FILES" "$p") |" \
                "$(ratio "$m" "$l") | $(ratio "$l" "$p") |"
        done
        m=${SECS[$r,read,mount]} l=${SECS[$r,read,library]} p=${SECS[$r,read,python]}
        echo "| $r | read MB/s | $(rate $((READ_MB * 1048576 / 1000000)) "$m") | $(rate $((READ_MB * 1048576 / 1000000)) "$l") |" \
            "$(rate $((READ_MB * 1048576 / 1000000)) "$p") | $(ratio "$m" "$l") | $(ratio "$l" "$p") |"
    done
} >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
cat "$OUT"
