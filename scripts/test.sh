#!/usr/bin/env bash
# Installs what is missing and runs every test of sluice:
# formatting, clippy, unit and end-to-end tests, the README's demo, and a
# small run of each benchmark (to prove they work; their figures are not
# judged here).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

# Debian packages: fio is the benchmarks' baseline.
DEBS=(fio)
missing=()
for p in "${DEBS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo build"
cargo build --workspace --all-targets
echo "== demo (the README's main command)"
demo_dir="$(mktemp -d)"
trap 'rm -rf "$demo_dir"' EXIT
SLUICE_DATA_DIR="$demo_dir/data" SLUICE_DEVICE_SIZE=1GiB bash scripts/demo.sh
echo "== benchmarks, small"
bench_dir="$demo_dir/bench"
"$CARGO_TARGET_DIR/debug/sluice" --data-dir "$bench_dir" bench scan --bytes 64MiB --runs 1
"$CARGO_TARGET_DIR/debug/sluice" --data-dir "$bench_dir" bench random --bytes 64MiB --reads 500 --runs 1
"$CARGO_TARGET_DIR/debug/sluice" --data-dir "$bench_dir" bench catalog --samples 20000
echo "== cargo test"
cargo test --workspace
