#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang, ASan + UBSan) into ./build-fuzz and runs each for a
# bounded time from its seed corpus. Usage: scripts/fuzz.sh [seconds per fuzzer, default 60] [fuzzer...]
# A finding stops the run and leaves crash-<hash> in build-fuzz/findings/<fuzzer>/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-60}"
shift || true
BUILD_DIR="${KVB_FUZZ_BUILD_DIR:-build-fuzz}"
export CCACHE_BASEDIR="$PWD"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DKVB_BUILD_FUZZ=ON -DKVB_BUILD_TESTS=OFF -DKVB_BUILD_BENCH=OFF -DKVB_WITH_CUDA=OFF >&2
fuzzers=("$@")
if [ ${#fuzzers[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.cpp; do fuzzers+=("$(basename "$f" .cpp)"); done
fi
targets=()
for f in "${fuzzers[@]}"; do targets+=(--target "$f"); done
cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}" >&2
for f in "${fuzzers[@]}"; do
  corpus="$BUILD_DIR/corpus/$f"    # grows as the fuzzer finds new paths; seeded from the tree
  findings="$BUILD_DIR/findings/$f"
  mkdir -p "$corpus" "$findings"
  seeds="tests/fuzz/corpus/${f#fuzz_}"
  echo "== $f: ${SECONDS_EACH}s (seeds: $seeds)" >&2
  "$BUILD_DIR/tests/fuzz/$f" -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 \
    -artifact_prefix="$findings/" -print_final_stats=1 "$corpus" "$seeds"
done
