#!/usr/bin/env bash
# Peer benchmark: SmolLM2-135M-Instruct prefill and decode in kvbench vs llama.cpp (MIT) at equal
# threads, llama.cpp on the model in F32 and in Q4_1; and kvbench's batch-16 over batch-1 decode.
# Writes results/smollm2-vs-llamacpp.md.
#
#   scripts/bench-vs-llamacpp.sh           (after scripts/build.sh and scripts/fetch-assets.sh)
#
# llama.cpp's source comes from the llama-cpp-python sdist on PyPI (vendor/llama.cpp); only its
# llama-bench and llama-quantize are built (CPU, GGML_NATIVE, static, no network code), cached
# outside the clone. The F32 GGUF is written by llama-quantize from the Q4_1 one (its dequantized
# weights: the same numbers kvbench computes with, since kvbench dequantizes every GGUF to fp32).
#   llama.cpp  llama-bench -p 512 -n 128 -t THREADS   (pp512: one 512-token prompt; tg128: 128 tokens
#              generated one at a time from an empty context)
#   kvbench    prefill: `kvbench run`, protocol perf, context 512 (one 512-token prefill), batch 1;
#              decode: `kvbench bench --context 129` (BOS prefilled, then 127 decode forwards at
#              positions 1..127), batches 1 and 16
#
# Environment:
#   KVB                      kvbench binary (./build/kvbench)
#   KVB_PEER_GGUF            the Q4_1 GGUF (default: smollm2-135m-instruct/*.Q4_1.gguf in $KVBENCH_MODELS,
#                            models, ../shared/models or ~/.cache/kvbench/models)
#   KVB_PEER_THREADS         comma-separated threads (1,2)
#   KVB_PEER_REPEATS         timed repeats on both sides (3)
#   KVB_PEER_LLAMACPP        llama-cpp-python version whose vendored llama.cpp is built (0.3.36)
#   KVB_PEER_CACHE           source and build cache ($HOME/.cache/kvbench/peers)
#   KVB_PEER_OUT             page to write (results/smollm2-vs-llamacpp.md)
set -euo pipefail
cd "$(dirname "$0")/.."
KVB=${KVB:-./build/kvbench}
THREADS=${KVB_PEER_THREADS:-1,2}
REPS=${KVB_PEER_REPEATS:-3}
LCPP=${KVB_PEER_LLAMACPP:-0.3.36}
CACHE=${KVB_PEER_CACHE:-$HOME/.cache/kvbench/peers}
OUT=${KVB_PEER_OUT:-results/smollm2-vs-llamacpp.md}

[ -x "$KVB" ] || { echo "bench-vs-llamacpp: no kvbench binary at $KVB (run scripts/build.sh)" >&2; exit 1; }
KVB=$(realpath "$KVB")
GGUF=${KVB_PEER_GGUF:-}
if [ -z "$GGUF" ]; then
  for d in ${KVBENCH_MODELS:+"$KVBENCH_MODELS"} models ../shared/models \
    "${KVBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvbench}/models"; do
    for f in "$d"/smollm2-135m-instruct/*Q4_1.gguf; do
      [ -f "$f" ] && { GGUF=$f; break 2; }
    done
  done
fi
[ -n "$GGUF" ] && [ -f "$GGUF" ] || {
  echo "bench-vs-llamacpp: SmolLM2 Q4_1 GGUF not found (scripts/fetch-assets.sh, or set KVB_PEER_GGUF)" >&2; exit 1; }
GGUF=$(realpath "$GGUF")

# llama.cpp from the llama-cpp-python sdist, built once per version.
SRC_DIR="$CACHE/src/llama_cpp_python-$LCPP"
BUILD="$CACHE/llama.cpp-$LCPP/build"
if [ ! -x "$BUILD/bin/llama-bench" ] || [ ! -x "$BUILD/bin/llama-quantize" ]; then
  if [ ! -f "$SRC_DIR/vendor/llama.cpp/CMakeLists.txt" ]; then
    mkdir -p "$CACHE/src"
    python3 -m pip download -q --no-deps --no-binary :all: -d "$CACHE/src" "llama-cpp-python==$LCPP" >&2
    tar -xzf "$CACHE/src/llama_cpp_python-$LCPP.tar.gz" -C "$CACHE/src"
  fi
  echo "bench-vs-llamacpp: building llama.cpp (llama-cpp-python $LCPP) in $BUILD" >&2
  cmake -S "$SRC_DIR/vendor/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TOOLS=ON >&2
  cmake --build "$BUILD" -j "$(nproc)" --target llama-bench llama-quantize >&2
fi

loadavg=$(cut -d' ' -f1-3 /proc/loadavg)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
F32="$TMP/$(basename "${GGUF%.gguf}" | sed 's/\.Q4_1$//').F32.gguf"
"$BUILD/bin/llama-quantize" --allow-requantize "$GGUF" "$F32" F32 >"$TMP/quantize.log" 2>&1 || {
  cat "$TMP/quantize.log" >&2; exit 1; }

echo "bench-vs-llamacpp: llama-bench" >&2
"$BUILD/bin/llama-bench" -m "$F32" -m "$GGUF" -p 512 -n 128 -t "$THREADS" -r "$REPS" -o json \
  >"$TMP/llamacpp.json" 2>"$TMP/llamacpp.log" || { cat "$TMP/llamacpp.log" >&2; exit 1; }

echo "bench-vs-llamacpp: kvbench decode (bench, batches 1 and 16)" >&2
"$KVB" bench --model "$GGUF" --batch 1,16 --threads-list "$THREADS" --context 129 --repeats "$REPS" \
  --json 2>"$TMP/kvb-bench.log" >"$TMP/kvb-bench.json" || { cat "$TMP/kvb-bench.log" >&2; exit 1; }
echo "bench-vs-llamacpp: kvbench prefill (perf protocol, context 512)" >&2
IFS=, read -ra thread_list <<<"$THREADS"
for t in "${thread_list[@]}"; do
  echo "{\"model\":\"$GGUF\",\"threads\":$t,\"method\":\"full\",\"protocol\":{\"name\":\"perf\",\"context\":512,\"decode_tokens\":1,\"batch_sizes\":\"1\",\"repeats\":$REPS}}" \
    >"$TMP/perf-$t.json"
  "$KVB" run -c "$TMP/perf-$t.json" --db "$TMP/perf.sqlite" 2>"$TMP/perf-$t.log" >"$TMP/perf-$t.out" || {
    cat "$TMP/perf-$t.log" >&2; exit 1; }
done

python3 scripts/peer/report_smollm2_llamacpp.py --tmp "$TMP" --threads "$THREADS" --reps "$REPS" \
  --kvbench "$KVB" --loadavg "$loadavg" --llamacpp-version "$LCPP" --gguf "$(basename "$GGUF")" \
  --f32-bytes "$(stat -c %s "$F32")" \
  --command "scripts/bench-vs-llamacpp.sh   # KVB_PEER_THREADS=$THREADS KVB_PEER_REPEATS=$REPS" --out "$OUT"
echo "bench-vs-llamacpp: wrote $OUT" >&2
