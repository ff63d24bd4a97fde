#!/usr/bin/env bash
# Builds the libFuzzer targets and runs each for a bounded time from its seeds and its corpus.
# Usage: scripts/fuzz.sh [seconds per fuzzer, default 60] [fuzzer...]
#   tests/fuzz/fuzz_*          torch-free parsers: clang, ASan + UBSan, built into ./build-fuzz
#                              (KVB_FUZZ_BUILD_DIR)
#   fuzz_run_config            run and grid configs against the method and protocol registries:
#                              GCC with trace-pc coverage, built in the regular build dir
#                              (KVB_MAIN_BUILD_DIR, default ./build; tests/fuzz_config says why)
# The corpus each fuzzer grows is kept outside the clone, in $KVB_FUZZ_CORPUS_DIR/<fuzzer> (default
# ${KVBENCH_CACHE:-~/.cache/kvbench}/fuzz-corpus), so that every run starts where the last stopped.
# A finding stops the run (KVB_FUZZ_KEEP_GOING=1: runs the rest first) and leaves crash-<hash> (or
# timeout-/oom-<hash>) in <fuzz build dir>/findings/<fuzzer>/; the exit status is then 1.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-60}"
shift || true
BUILD_DIR="${KVB_FUZZ_BUILD_DIR:-build-fuzz}"
MAIN_BUILD_DIR="${KVB_MAIN_BUILD_DIR:-build}"
CORPUS_ROOT="${KVB_FUZZ_CORPUS_DIR:-${KVBENCH_CACHE:-$HOME/.cache/kvbench}/fuzz-corpus}"
export CCACHE_BASEDIR="$PWD"
fuzzers=("$@")
if [ ${#fuzzers[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.cpp tests/fuzz_config/fuzz_*.cpp; do fuzzers+=("$(basename "$f" .cpp)"); done
fi
clang_targets=()
for f in "${fuzzers[@]}"; do
  [ "$f" = fuzz_run_config ] || clang_targets+=(--target "$f")
done
if [ ${#clang_targets[@]} -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
    -DKVB_BUILD_FUZZ=ON -DKVB_BUILD_TESTS=OFF -DKVB_BUILD_BENCH=OFF -DKVB_WITH_CUDA=OFF >&2
  cmake --build "$BUILD_DIR" -j "${KVB_FUZZ_JOBS:-$(nproc)}" "${clang_targets[@]}" >&2
fi
binary_of() {
  if [ "$1" = fuzz_run_config ]; then
    echo "$MAIN_BUILD_DIR/tests/fuzz_config/fuzz_run_config"
  else
    echo "$BUILD_DIR/tests/fuzz/$1"
  fi
}
for f in "${fuzzers[@]}"; do
  if [ "$f" = fuzz_run_config ] && [ ! -x "$(binary_of "$f")" ]; then
    [ -f "$MAIN_BUILD_DIR/CMakeCache.txt" ] || { echo "fuzz.sh: configure $MAIN_BUILD_DIR first (scripts/build.sh)" >&2; exit 2; }
    cmake --build "$MAIN_BUILD_DIR" -j "${KVB_FUZZ_JOBS:-$(nproc)}" --target fuzz_run_config >&2
  fi
done
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
    fuzz_run_config) ls configs/examples/*.json configs/grids/*.json 2>/dev/null ;;
  esac
}
# Per-fuzzer limits. A grid config legitimately expands to up to 2,000 cells in the fuzzer (its
# max_cells), and a seed like configs/grids/kvpress_leaderboard.json (1,078 cells) takes seconds to
# plan under ASan on a loaded machine: its inputs stay short and get a longer time limit.
max_len_of() {
  case "$1" in
    fuzz_run_config) echo 8192 ;;
    *) echo 65536 ;;
  esac
}
timeout_of() {
  case "$1" in
    fuzz_run_config) echo 60 ;;
    *) echo 10 ;;
  esac
}
status=0
for f in "${fuzzers[@]}"; do
  corpus="$CORPUS_ROOT/$f"          # grows as the fuzzer finds new paths; kept between runs
  findings="$BUILD_DIR/findings/$f"
  extra="$BUILD_DIR/seeds/$f"
  mkdir -p "$corpus" "$findings" "$extra"
  for s in $(repo_seeds "$f"); do cp "$s" "$extra/"; done
  seeds=()
  [ -d "tests/fuzz/corpus/${f#fuzz_}" ] && seeds+=("tests/fuzz/corpus/${f#fuzz_}")
  seeds+=("$extra")
  echo "== $f: ${SECONDS_EACH}s (corpus: $corpus; seeds: ${seeds[*]})" >&2
  if ! "$(binary_of "$f")" -max_total_time="$SECONDS_EACH" -max_len="$(max_len_of "$f")" \
    -rss_limit_mb=2048 -timeout="$(timeout_of "$f")" -artifact_prefix="$findings/" -print_final_stats=1 \
    "$corpus" "${seeds[@]}"; then
    echo "== $f: FINDING (see $findings/)" >&2
    status=1
    [ -n "${KVB_FUZZ_KEEP_GOING:-}" ] || exit 1
  fi
done
exit $status
