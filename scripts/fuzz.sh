#!/usr/bin/env bash
# Runs every fuzz target of tests/fuzz for SECONDS each (default 5: the
# smoke run of the test command; the long runs use 600 and more).
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET…]
#
# Built with cargo fuzz on the stable toolchain without a sanitizer
# (`-s none`: the sanitizers need nightly): libFuzzer's coverage guidance,
# its crash, leak-free out-of-memory (-rss_limit_mb) and per-input
# timeout (-timeout) detection. Each target starts from its seed corpus
# (tests/fuzz/corpus/TARGET, never written to) and a scratch corpus; what
# it finds is left under tests/fuzz/artifacts/TARGET and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
seconds="${1:-5}"
shift || true
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list --fuzz-dir tests/fuzz)
fi
cargo fuzz build --fuzz-dir tests/fuzz -s none --dev
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "$work/$t"
  echo "== fuzz $t (${seconds} s)"
  # -timeout: an input taking over 10 s is a hang; -rss_limit_mb: growth
  # past 2 GiB is a finding (the targets' decode limits are far below).
  status=0
  cargo fuzz run --fuzz-dir tests/fuzz -s none --dev "$t" "$work/$t" "tests/fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    >"$work/$t.log" 2>&1 || status=$?
  grep -E "^(stat::number_of_executed_units|stat::new_units_added|==[0-9]+==|SUMMARY)|panicked" \
    "$work/$t.log" || true
  if [ "$status" -ne 0 ]; then
    tail -40 "$work/$t.log"
    echo "fuzz target $t failed (its input is under tests/fuzz/artifacts/$t)"
    exit 1
  fi
done
