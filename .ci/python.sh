#!/usr/bin/env bash
# The Python package's tests: builds `locus` (crates/python, PyO3) with maturin from this
# repository into a virtual environment of its own, with fsspec, pytest, pandas and
# pyarrow from PyPI, and runs crates/python/tests against a real cluster of the
# workspace's debug `locus` binary (a meta, a node and, as root with /dev/fuse, a mount).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${LOCUS_PY_VENV:-$ROOT/target/python-venv}
[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "maturin>=1.5,<2" "fsspec>=2023.1" pytest pandas pyarrow
cargo build -q -p locus --bin locus
VIRTUAL_ENV=$VENV "$VENV/bin/maturin" develop -q --manifest-path crates/python/Cargo.toml
LOCUS_BIN=$ROOT/target/debug/locus "$VENV/bin/python" -m pytest -q -p no:cacheprovider crates/python/tests "$@"
