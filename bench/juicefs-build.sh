#!/usr/bin/env bash
# Builds JuiceFS from its public sources, for the benchmarks that measure it beside Locus
# (bench/meta-engines.sh, bench/juicefs-read.sh). The module source comes from the Go module
# proxy (`go mod download`, since `go install pkg@version` refuses JuiceFS's replace
# directives), is copied to a scratch directory (the module cache is read-only) and built
# with `go build -p 2` (the machine is shared) into $JFS_DIR/juicefs-VERSION/juicefs, which
# later runs reuse (the binary of the committed results was built by this script's first version,
# with -s -w -trimpath and no revision: it reports 1.4.1+unknown). Prints the binary's path on stdout; the version and build time go to
# build.txt beside it.
#
# Usage:  bench/juicefs-build.sh
# Environment: JUICEFS_VERSION=v1.4.1 (the newest 1.4.x tag the proxy serves here: its
#              version list is refused, v1.4.2 is not served)  JFS_DIR=/var/tmp/locus-bench
#              GO=go from PATH or /usr/local/go/bin/go
set -Eeuo pipefail
VERSION=${JUICEFS_VERSION:-v1.4.1}
JFS_DIR=${JFS_DIR:-/var/tmp/locus-bench}
DEST=$JFS_DIR/juicefs-$VERSION
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
if [[ -x $DEST/juicefs ]]; then echo "$DEST/juicefs"; exit 0; fi
[[ -x $GO ]] || { echo "juicefs-build: no Go toolchain (set GO= or install Go >= 1.23)" >&2; exit 1; }
MOD=github.com/juicedata/juicefs
INFO=$("$GO" mod download -json "$MOD@$VERSION" 2>&1) || {
    echo "juicefs-build: cannot download $MOD@$VERSION from the module proxy ($("$GO" env GOPROXY)):" >&2
    echo "$INFO" >&2
    exit 1
}
SRC=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])' <<<"$INFO")
[[ -d $SRC ]] || { echo "juicefs-build: module source missing: $INFO" >&2; exit 1; }
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/juicefs-src.XXXXXX")
trap 'chmod -R u+w "$SCRATCH"; rm -rf "$SCRATCH"' EXIT
cp -r "$SRC/." "$SCRATCH/"
chmod -R u+w "$SCRATCH"
mkdir -p "$DEST"
start=$(date +%s)
REV=$(python3 -c 'import json,sys; print(json.load(sys.stdin).get("Origin", {}).get("Hash", "unknown"))' <<<"$INFO")
# The flags of its Makefile's `juicefs` target (revision and date from the proxy's record of the tag).
REVDATE=$(python3 -c 'import json,sys; print(json.load(open(json.load(sys.stdin)["Info"]))["Time"][:10])' <<<"$INFO")
(cd "$SCRATCH" && CGO_ENABLED=1 "$GO" build -p 2 \
    -ldflags "-X $MOD/pkg/version.revision=${REV:0:7} -X $MOD/pkg/version.revisionDate=$REVDATE" \
    -o "$DEST/juicefs.tmp" .) >&2 || { echo "juicefs-build: go build failed" >&2; exit 1; }
mv "$DEST/juicefs.tmp" "$DEST/juicefs"
{
    echo "$MOD $VERSION (git $REV), $("$GO" version)"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(($(date +%s) - start)) s with go build -p 2 on $(nproc) cores"
} >"$DEST/build.txt"
cat "$DEST/build.txt" >&2
echo "$DEST/juicefs"
