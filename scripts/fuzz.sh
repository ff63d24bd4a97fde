#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang, ASan + UBSan) into ./build-fuzz and runs each for a
# bounded time from its seed corpus. Usage: scripts/fuzz.sh [seconds per fuzzer, default 60] [fuzzer...]
# A finding stops the run (KVB_FUZZ_KEEP_GOING=1: runs the rest first) and leaves crash-<hash> (or
# timeout-/oom-<hash>) in build-fuzz/findings/<fuzzer>/; the exit status is then 1.
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
cmake --build "$BUILD_DIR" -j "${KVB_FUZZ_JOBS:-$(nproc)}" "${targets[@]}" >&2
# Seeds beyond tests/fuzz/corpus/<name>: small files the tree already holds for other purposes,
# copied (not committed twice) into the build dir. Never files from ../shared.
repo_seeds() {
  case "$1" in
    fuzz_hf_config) ls models/kvb-testbed/config.json configs/models/*.json 2>/dev/null ;;
    fuzz_tokenizer) ls models/kvb-testbed/tokenizer.model 2>/dev/null ;;
    fuzz_safetensors) ls models/kvb-testbed-dms/*.safetensors models/kvb-testbed-kvpacket/*.safetensors 2>/dev/null ;;
    fuzz_jsonl) ls tests/fixtures/longbench/*.jsonl tests/fixtures/longbench/*.json 2>/dev/null ;;
    fuzz_set_grammar) ls configs/examples/*.json 2>/dev/null ;;
    fuzz_tokenizer_json) ls tests/fixtures/tokenizers/toy.json tests/fixtures/tokenizers/toy_spm.json 2>/dev/null ;;
  esac
}
status=0
for f in "${fuzzers[@]}"; do
  corpus="$BUILD_DIR/corpus/$f"    # grows as the fuzzer finds new paths; seeded from the tree
  findings="$BUILD_DIR/findings/$f"
  extra="$BUILD_DIR/seeds/$f"
  mkdir -p "$corpus" "$findings" "$extra"
  for s in $(repo_seeds "$f"); do cp "$s" "$extra/"; done
  seeds=()
  [ -d "tests/fuzz/corpus/${f#fuzz_}" ] && seeds+=("tests/fuzz/corpus/${f#fuzz_}")
  seeds+=("$extra")
  echo "== $f: ${SECONDS_EACH}s (seeds: ${seeds[*]})" >&2
  if ! "$BUILD_DIR/tests/fuzz/$f" -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=2048 \
    -timeout=10 -artifact_prefix="$findings/" -print_final_stats=1 "$corpus" "${seeds[@]}"; then
    echo "== $f: FINDING (see $findings/)" >&2
    status=1
    [ -n "${KVB_FUZZ_KEEP_GOING:-}" ] || exit 1
  fi
done
exit $status
