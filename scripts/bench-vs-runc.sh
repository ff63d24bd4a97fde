#!/usr/bin/env bash
# Peer benchmark: decode speed of kvbench vs llama2.c's run.c (Andrej Karpathy, MIT) on stories260K,
# batch 1, at equal threads. Writes results/decode-vs-runc.md.
#
#   scripts/bench-vs-runc.sh RUN_C        (RUN_C: the path of llama2.c's run.c; it is not in this repo)
#
# run.c is copied to a temporary directory, its BOS stop (`if (next == 1) { break; }`) removed so it
# decodes exactly the requested steps, and built with llama2.c's own fastest flags: `-Ofast
# -march=native` (one thread) and `-Ofast -fopenmp -march=native` (its `runomp` target, threads from
# OMP_NUM_THREADS), plus `-O3` for reference. Both sides generate greedily from BOS to CONTEXT
# positions: run.c `-n CONTEXT-1 -t 0` runs CONTEXT-1 forwards (positions 0..CONTEXT-2) and reports
# tokens per second over all but the first; `kvbench bench --context CONTEXT` prefills BOS and times
# the same CONTEXT-2 decode forwards. The two alternate for KVB_PEER_ROUNDS rounds; the page gives
# medians.
#
# Environment:
#   KVB                kvbench binary (./build/kvbench)
#   KVB_PEER_STORIES   directory with stories260K.bin and tok512.bin (default: the first of
#                      $KVBENCH_MODELS/stories260K, models/stories260K, ../shared/models/stories260K,
#                      ~/.cache/kvbench/models/stories260K: kvbench's own search path)
#   KVB_PEER_CONTEXT   positions (512)      KVB_PEER_THREADS  comma-separated threads (1,2)
#   KVB_PEER_ROUNDS    alternating rounds (3)
#   KVB_PEER_OUT       page to write (results/decode-vs-runc.md)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_C=${1:?usage: scripts/bench-vs-runc.sh PATH/TO/llama2.c/run.c}
KVB=${KVB:-./build/kvbench}
CONTEXT=${KVB_PEER_CONTEXT:-512}
THREADS=${KVB_PEER_THREADS:-1,2}
ROUNDS=${KVB_PEER_ROUNDS:-3}
OUT=${KVB_PEER_OUT:-results/decode-vs-runc.md}
CC=${CC:-cc}

[ -f "$RUN_C" ] || { echo "bench-vs-runc: no file $RUN_C" >&2; exit 1; }
[ -x "$KVB" ] || { echo "bench-vs-runc: no kvbench binary at $KVB (run scripts/build.sh)" >&2; exit 1; }
STORIES=${KVB_PEER_STORIES:-}
if [ -z "$STORIES" ]; then
  for d in ${KVBENCH_MODELS:+"$KVBENCH_MODELS/stories260K"} models/stories260K ../shared/models/stories260K \
    "${KVBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvbench}/models/stories260K"; do
    if [ -f "$d/stories260K.bin" ] && [ -f "$d/tok512.bin" ]; then STORIES=$d; break; fi
  done
fi
[ -n "$STORIES" ] || { echo "bench-vs-runc: stories260K.bin and tok512.bin not found; set KVB_PEER_STORIES" >&2; exit 1; }
STORIES=$(realpath "$STORIES")

loadavg=$(cut -d' ' -f1-3 /proc/loadavg)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cp "$RUN_C" "$TMP/run.c"
# Disable the BOS stop so every run decodes exactly -n steps.
stop='if (next == 1) { break; }'
[ "$(grep -cF "$stop" "$TMP/run.c")" = 1 ] || { echo "bench-vs-runc: $RUN_C has no single '$stop' line" >&2; exit 1; }
sed -i "s/if (next == 1) { break; }/\/* BOS stop disabled by bench-vs-runc.sh *\//" "$TMP/run.c"
runc_sha=$(sha256sum "$RUN_C" | cut -c1-16)
"$CC" -O3 -o "$TMP/run_O3" "$TMP/run.c" -lm
"$CC" -Ofast -march=native -o "$TMP/run_fast" "$TMP/run.c" -lm
"$CC" -Ofast -fopenmp -march=native -o "$TMP/run_omp" "$TMP/run.c" -lm

# build name, flags, threads it runs at
configs=("run_O3|-O3|1" "run_fast|-Ofast -march=native|1")
IFS=, read -ra thread_list <<<"$THREADS"
for t in "${thread_list[@]}"; do configs+=("run_omp|-Ofast -fopenmp -march=native|$t"); done

RAW="$TMP/raw.tsv"
: >"$RAW"
for r in $(seq 1 "$ROUNDS"); do
  for c in "${configs[@]}"; do
    IFS='|' read -r bin flags t <<<"$c"
    tps=$(OMP_NUM_THREADS=$t "$TMP/$bin" "$STORIES/stories260K.bin" -z "$STORIES/tok512.bin" -t 0 \
      -n $((CONTEXT - 1)) 2>&1 >/dev/null | sed -n 's/^achieved tok\/s: //p')
    [ -n "$tps" ] || { echo "bench-vs-runc: $bin printed no 'achieved tok/s'" >&2; exit 1; }
    printf 'run.c\t%s\t%s\t%s\t%s\n' "$flags" "$t" "$r" "$tps" >>"$RAW"
  done
  "$KVB" bench --model "$STORIES/stories260K.bin" --batch 1 --threads-list "$THREADS" --context "$CONTEXT" \
    --repeats 1 --json 2>/dev/null >"$TMP/kvb.json"
  python3 -c '
import json, sys
for row in json.load(open(sys.argv[1]))["rows"]:
    print("kvbench\tLibTorch fp32\t%d\t%s\t%r" % (row["threads"], sys.argv[2], row["decode_tok_s"]))
' "$TMP/kvb.json" "$r" >>"$RAW"
  echo "bench-vs-runc: round $r/$ROUNDS done" >&2
done

python3 scripts/peer/report_decode_runc.py --raw "$RAW" --kvbench "$KVB" --loadavg "$loadavg" \
  --context "$CONTEXT" --rounds "$ROUNDS" --runc-sha "$runc_sha" --cc "$("$CC" --version | head -1)" \
  --command "scripts/bench-vs-runc.sh path/to/llama2.c/run.c   # KVB_PEER_THREADS=$THREADS KVB_PEER_ROUNDS=$ROUNDS" \
  --out "$OUT"
echo "bench-vs-runc: wrote $OUT" >&2
