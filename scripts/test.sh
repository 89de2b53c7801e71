#!/usr/bin/env bash
# Installs what is missing and runs every test of sluice:
# formatting, clippy, unit and end-to-end tests, the README's demo, and a
# small run of each benchmark (to prove they work; their figures are not
# judged here).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

# Debian packages: FFmpeg's libraries and libclang (ffmpeg-next's bindgen) for
# the video UDFs, libjpeg-turbo for JPEG decoding, fio for the storage
# benchmarks' baseline.
DEBS=(pkg-config libclang-dev libavcodec-dev libavformat-dev libavutil-dev libswscale-dev
      libswresample-dev libavfilter-dev libavdevice-dev libturbojpeg0-dev fio)
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
# Python: pyarrow to read sluice's Arrow output, Pillow and PyAV as the
# benchmarks' baselines, pytest. The venv lives beside the target dir.
VENV="${SLUICE_VENV:-$(dirname "$CARGO_TARGET_DIR")/venv}"
if ! "$VENV/bin/python" -c "import pyarrow, numpy, PIL, av, pytest" 2>/dev/null; then
  echo "== python venv $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -r python/requirements-dev.txt
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
"$VENV/bin/python" scripts/bench_udfs.py --sluice "$CARGO_TARGET_DIR/debug/sluice" \
  --small 20 --large 2 --clips 2 --runs 1
"$VENV/bin/python" scripts/bench_placement.py --sluice "$CARGO_TARGET_DIR/debug/sluice" \
  --small 8 --large 1 --vols 2 --clips 2 --runs 1 --work "$demo_dir/placement"
"$CARGO_TARGET_DIR/debug/sluice" --data-dir "$bench_dir" udfs --calibrate
echo "== cargo test"
cargo test --workspace
echo "== python tests"
SLUICE_BIN="$CARGO_TARGET_DIR/debug/sluice" "$VENV/bin/python" -m pytest -q tests/python
