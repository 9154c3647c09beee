#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/fuzz_targets) for a short, bounded time over its
# committed corpus (fuzz/corpus/TARGET; new inputs go to a scratch copy, so the committed
# corpus stays small). FUZZ_SECONDS=20 per target. Needs the nightly toolchain; installs
# cargo-fuzz when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${FUZZ_SECONDS:-20}
rustup toolchain list | grep -q '^nightly' || { echo "fuzz: needs the nightly toolchain (rustup toolchain install nightly)"; exit 1; }
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for target in $(cargo +nightly fuzz list); do
  mkdir -p "$scratch/$target"
  cp -r "fuzz/corpus/$target/." "$scratch/$target/" 2>/dev/null || true
  echo "fuzz: $target for ${SECONDS_EACH}s"
  cargo +nightly fuzz run "$target" "$scratch/$target" -- -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 2>&1 | tail -n 3
done
