#!/usr/bin/env bash
# Runs pjdfstest (the POSIX file-system conformance suite) on a Locus mount and prints the
# summary table of bench/results/pjdfstest.md.
#
# Usage (as root, from anywhere):  bench/pjdfstest.sh [DIR...]
#   DIR: test directories of the suite (chmod, chown, ..., utimensat); default: all.
# Environment knobs:
#   PJDFSTEST_SRC=/tmp/pjdfstest-src   a checkout of https://github.com/pjd/pjdfstest; cloned
#                    there if absent. Without network access, that is the one manual step:
#                    copy a checkout (any machine's `git clone`) to this directory.
#   LOCUS_BIN=       the locus binary; default: target/release/locus, built if missing
#   LOCUS_ARGS=      extra flags for `locus up`, e.g. "--attr-ttl 0"
#   WORK=/tmp/pjdfstest-run   scratch directory (mount point, data, logs); deleted at the end
#
# pjdfstest is built without autotools: a config.h for Linux and one `cc` call.
# `locus up` gets ports picked at run time (127.0.0.1 only) and its own state directory, so it
# collides with no other cluster. A subtest marked `# TODO` is one pjdfstest expects to fail
# on Linux; it is counted apart. Exits 1 if any other subtest failed.
set -Eeuo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=${PJDFSTEST_SRC:-/tmp/pjdfstest-src}
WORK=${WORK:-/tmp/pjdfstest-run}
LOCUS_ARGS=${LOCUS_ARGS:-}

say() { echo "pjdfstest.sh: $*" >&2; }
die() { say "$*"; exit 2; }

[[ $(id -u) == 0 ]] || die "needs root (FUSE mount, chown tests)"
[[ -e /dev/fuse ]] || die "needs /dev/fuse"
for tool in cc prove python3; do
    command -v "$tool" >/dev/null || die "needs $tool (apt-get install build-essential perl python3)"
done

# 1. The suite.
if [[ ! -f $SRC/pjdfstest.c ]]; then
    say "cloning pjdfstest into $SRC"
    git clone -q --depth 1 https://github.com/pjd/pjdfstest "$SRC" ||
        die "cannot clone pjdfstest; copy a checkout of https://github.com/pjd/pjdfstest to $SRC and rerun"
fi
if [[ ! -x $SRC/pjdfstest || $SRC/pjdfstest.c -nt $SRC/pjdfstest ]]; then
    say "building $SRC/pjdfstest"
    cat >"$SRC/config.h" <<'EOF'
/* Written by Locus's bench/pjdfstest.sh for Linux/glibc (instead of autotools). */
#define HAVE_SYS_SYSMACROS_H 1
#define HAVE_FACCESSAT 1
#define HAVE_FCHMODAT 1
#define HAVE_FCHOWNAT 1
#define HAVE_FSTATAT 1
#define HAVE_LINKAT 1
#define HAVE_MKDIRAT 1
#define HAVE_MKFIFOAT 1
#define HAVE_MKNODAT 1
#define HAVE_OPENAT 1
#define HAVE_POSIX_FALLOCATE 1
#define HAVE_READLINKAT 1
#define HAVE_RENAMEAT 1
#define HAVE_SYMLINKAT 1
#define HAVE_UNLINKAT 1
#define HAVE_UTIMENSAT 1
#define HAVE_STRUCT_STAT_ST_ATIM 1
#define HAVE_STRUCT_STAT_ST_CTIM 1
#define HAVE_STRUCT_STAT_ST_MTIM 1
EOF
    cc -O2 -Wall -D_GNU_SOURCE -I"$SRC" -o "$SRC/pjdfstest" "$SRC/pjdfstest.c"
fi

# 2. Locus.
BIN=${LOCUS_BIN:-$ROOT/target/release/locus}
if [[ ! -x $BIN ]]; then
    say "cargo build --release -p locus"
    (cd "$ROOT" && cargo build --release -p locus)
fi

# 3. Mount.
rm -rf "$WORK"
mkdir -p "$WORK/mnt" "$WORK/logs" "$WORK/state"
UP_PID=
cleanup() {
    if [[ -n $UP_PID ]]; then
        kill -INT "$UP_PID" 2>/dev/null || true
        wait "$UP_PID" 2>/dev/null || true
    fi
    umount -l "$WORK/mnt" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# shellcheck disable=SC2086 # LOCUS_ARGS is a list of flags
XDG_STATE_HOME=$WORK/state "$BIN" up "$WORK/mnt" --data-dir "$WORK/data" \
    --meta-listen "127.0.0.1:$(free_port)" --node-listen "127.0.0.1:$(free_port)" $LOCUS_ARGS \
    >"$WORK/logs/up.out" 2>"$WORK/logs/up.err" &
UP_PID=$!
for _ in $(seq 300); do
    grep -q "^locus mounted on" "$WORK/logs/up.out" 2>/dev/null && break
    kill -0 "$UP_PID" 2>/dev/null || { cat "$WORK/logs/up.err" >&2; die "locus up exited"; }
    sleep 0.1
done
grep -q "^locus mounted on" "$WORK/logs/up.out" || die "locus up did not mount within 30 s"

# 4. Run, one directory at a time, from inside the mount.
if [[ $# -gt 0 ]]; then
    dirs=("$@")
else
    mapfile -t dirs < <(find "$SRC/tests" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort)
fi
for d in "${dirs[@]}"; do
    [[ -d $SRC/tests/$d ]] || die "no test directory $SRC/tests/$d"
    say "running $d"
    (cd "$WORK/mnt" && prove -rv "$SRC/tests/$d" >"$WORK/logs/$d.tap" 2>&1) || true
done

# 5. Summary.
python3 - "$WORK/logs" "$SRC/tests" "${dirs[@]}" <<'EOF'
import pathlib, re, sys
logs, tests, dirs = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
print("| directory | test files | subtests | failed | TODO (expected on Linux) |")
print("|---|---:|---:|---:|---:|")
total_failed = 0
for d in dirs:
    files = len(list((tests / d).rglob("*.t")))
    lines = (logs / f"{d}.tap").read_text(errors="replace").splitlines()
    oks = [l for l in lines if re.match(r"^(not )?ok \d+", l)]
    todo = [l for l in oks if l.startswith("not ok") and "# TODO" in l]
    failed = [l for l in oks if l.startswith("not ok") and "# TODO" not in l]
    # A test file that dies before its plan is a failure too.
    died = [l for l in lines if re.search(r"Dubious|Bad plan|No plan found|Parse errors", l)]
    n_failed = len(failed) + len(died)
    total_failed += n_failed
    print(f"| {d} | {files} | {len(oks)} | {'**%d**' % n_failed if n_failed else 0} | {len(todo)} |")
for d in dirs:
    for l in (logs / f"{d}.tap").read_text(errors="replace").splitlines():
        if (l.startswith("not ok") and "# TODO" not in l) or re.search(r"Dubious|Bad plan|No plan found", l):
            print(f"  {d}: {l}", file=sys.stderr)
sys.exit(1 if total_failed else 0)
EOF
