#!/usr/bin/env bash
# Installs what is missing (Debian packages, the Python venv with the
# client package, Rust components) and runs every test of sluice: the
# structure checks (scripts/structure.py), formatting, clippy, unit and
# end-to-end tests, the Python tests against the real server (and, for
# ingest from object stores, a real S3 server), the README's demo, a
# small run of each benchmark (to prove they work; their figures are not
# judged here) and a seconds-long
# run of each fuzz target. The SPDK backend's tests run when SPDK_DIR
# points at an SPDK build (docs/spdk.md); otherwise they are skipped, and
# the last line says so.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
source scripts/prune.sh
SLUICE_EXTRA_DEBS="chromium" source scripts/deps.sh
source scripts/venv.sh
source scripts/s3server.sh
source scripts/stores.sh
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy

echo "== structure (guides, circles, floors, sizes)"
python3 scripts/structure.py
echo "== cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path tests/fuzz/Cargo.toml -- --check
echo "== cargo build, with clippy's lints (-D warnings)"
# clippy's own driver compiles our crates, as `cargo clippy --all-targets
# -- -D warnings` has it do over `cargo check`: the same lints, in the
# build itself, so the dependencies are built once. (`cargo clippy` beside
# `cargo build` built them twice: once checked, once compiled.) Every
# cargo command below sees the same wrapper, so nothing is rebuilt for
# it; the fuzz build, a workspace of its own, does not.
export RUSTC_WORKSPACE_WRAPPER
RUSTC_WORKSPACE_WRAPPER="$(rustup which clippy-driver)"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
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
truncate -s 64M "$demo_dir/bench-device.img"
"$CARGO_TARGET_DIR/debug/sluice" --device-backend uring --device "$demo_dir/bench-device.img" \
  bench device --seconds 1 --runs 1
"$CARGO_TARGET_DIR/debug/sluice" --data-dir "$bench_dir" bench epoch --samples 2000,20000
"$VENV/bin/python" scripts/bench_udfs.py --sluice "$CARGO_TARGET_DIR/debug/sluice" \
  --small 20 --large 2 --clips 2 --runs 1
"$VENV/bin/python" scripts/bench_placement.py --sluice "$CARGO_TARGET_DIR/debug/sluice" \
  --small 8 --large 1 --vols 2 --clips 2 --photos 8 --links 1Gbit --runs 1 --seconds 0 \
  --work "$demo_dir/placement"
"$VENV/bin/python" scripts/bench_flight.py --sluice "$CARGO_TARGET_DIR/debug/sluice" \
  --samples 64 --runs 1 --work "$demo_dir/flight"
"$VENV/bin/python" scripts/bench_train.py --sluice "$CARGO_TARGET_DIR/debug/sluice" \
  --per-class 8 --runs 1 --work "$demo_dir/train"
"$VENV/bin/python" scripts/bench_torch.py --sluice "$CARGO_TARGET_DIR/debug/sluice" \
  --per-class 4 --crop 64 --runs 1 --work "$demo_dir"
"$VENV/bin/python" scripts/bench_checkpoint.py --sluice "$CARGO_TARGET_DIR/debug/sluice" \
  --sizes 8 --runs 1 --work "$demo_dir"
if [ "$(id -u)" = 0 ]; then  # the rig needs root
  "$VENV/bin/python" scripts/bench_cluster_checkpoint.py --sluice "$CARGO_TARGET_DIR/debug/sluice" \
    --size 8 --runs 1 --links unlimited --layouts 1x1,2x1 --work "$demo_dir"
fi
# MLPerf Storage's workloads under memory cgroups, caches dropped: root,
# a writable memory controller and drop_caches (the tests run DLIO anyway).
if [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/drop_caches ] \
  && { [ -w /sys/fs/cgroup/memory ] || [ -w /sys/fs/cgroup/cgroup.subtree_control ]; }; then
  "$VENV/bin/python" scripts/bench_dlio.py --sluice "$CARGO_TARGET_DIR/debug/sluice" \
    --workload unet3d,retinanet,llama3 --ranks 1 --files 48 --epochs 1 --saves 1 --loads 1 --rounds 1 \
    --work "$demo_dir/dlio"
fi
"$VENV/bin/python" scripts/bench_load.py --sluice "$CARGO_TARGET_DIR/debug/sluice" \
  --streams 8 --per-class 8 --size 32 --work "$demo_dir"
"$CARGO_TARGET_DIR/debug/sluice" --data-dir "$bench_dir" udfs --calibrate
echo "== cargo test"
cargo test --workspace
echo "== fuzz targets, a few seconds each"
env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS bash scripts/fuzz.sh 5
echo "== python tests"
# The dashboard's browser test saves its screenshots under artifacts/.
# The object-store tests must find their S3 server (installed above).
SLUICE_BIN="$CARGO_TARGET_DIR/debug/sluice" SLUICE_REQUIRE_S3=1 "$VENV/bin/python" -m pytest -q tests/python
echo "== SPDK backend"
if [[ -n "${SPDK_DIR:-}" ]]; then
  cargo clippy -p sluice -p sluice-storage --features sluice/spdk,sluice-storage/spdk \
    --all-targets -- -D warnings
  cargo test -p sluice-storage --features spdk --test storage spdk::
  cargo build -p sluice --features spdk
  SLUICE_BIN="$CARGO_TARGET_DIR/debug/sluice" SLUICE_SPDK_BIN="$CARGO_TARGET_DIR/debug/sluice" \
    "$VENV/bin/python" -m pytest -q -rs tests/python/test_spdk.py
  # The comparison with bdevperf, small (figures on a debug build mean nothing).
  "$VENV/bin/python" scripts/bench_spdk.py --sluice "$CARGO_TARGET_DIR/debug/sluice" \
    --size 64 --seconds 1 --runs 1 --work "$demo_dir"
else
  echo "SKIP: SPDK backend tests (storage-exec/tests/spdk.rs, tests/python/test_spdk.py):" \
    "SPDK_DIR is not set. They need an SPDK build tree or install prefix;" \
    "no package registry ships SPDK. See docs/spdk.md."
fi
