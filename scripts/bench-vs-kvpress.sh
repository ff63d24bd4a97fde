#!/usr/bin/env bash
# Peer benchmark: the qa eval in kvbench vs kvpress (NVIDIA, Apache-2.0) on the same samples. Writes
# results/eval-speed.md: per-sample and whole-process times, the ratio and the answer agreement.
#
#   scripts/bench-vs-kvpress.sh            (after scripts/build.sh)
#
# kvbench runs `full` and `snapkv` (budget 0.25, kvpress preset) over synthetic passkey samples at
# 1,024 tokens on kvb-testbed into a fresh results database; scripts/peer/kvpress_qa.py answers the
# same samples (same ids, threads and greedy stop rule) with transformers + kvpress
# (no press / SnapKVPress(compression_ratio=0.75)). The Python side lives in its own venv outside the
# clone, with pinned versions, created on first use.
#
# Environment:
#   KVB                 kvbench binary (./build/kvbench)
#   KVB_PEER_SAMPLES    samples (100)           KVB_PEER_THREADS  threads on both sides (2)
#   KVB_PEER_MODEL      model directory (models/kvb-testbed)
#   KVB_PEER_VENV       Python venv for kvpress ($HOME/.cache/kvbench/peer-venv); an existing one
#                       is reused after `pip install` of the pins (a no-op when they are there)
#   KVB_PEER_TORCH_INDEX  where torch comes from (PyTorch's CPU wheel index; `pypi`: the CUDA
#                       build from PyPI, also the fallback when the index cannot be reached);
#                       scripts/peer/kvpress-venv.sh
#   KVB_PEER_WORK       scratch directory, emptied first ($HOME/.cache/kvbench/peers/eval-speed)
#   KVB_PEER_OUT        page to write (results/eval-speed.md)
set -euo pipefail
cd "$(dirname "$0")/.."
KVB=${KVB:-./build/kvbench}
N=${KVB_PEER_SAMPLES:-100}
THREADS=${KVB_PEER_THREADS:-2}
MODEL=$(realpath "${KVB_PEER_MODEL:-models/kvb-testbed}")
VENV=${KVB_PEER_VENV:-$HOME/.cache/kvbench/peer-venv}
WORK=${KVB_PEER_WORK:-$HOME/.cache/kvbench/peers/eval-speed}
OUT=${KVB_PEER_OUT:-results/eval-speed.md}
PINS=(torch==2.15.0 transformers==5.2.0 kvpress==0.5.5 sentencepiece==0.2.3)

[ -x "$KVB" ] || { echo "bench-vs-kvpress: no kvbench binary at $KVB (run scripts/build.sh)" >&2; exit 1; }
[ -f "$MODEL/tokenizer.model" ] || { echo "bench-vs-kvpress: $MODEL has no tokenizer.model" >&2; exit 1; }
KVB=$(realpath "$KVB")
MODEL_SHOWN=$(realpath --relative-to="$PWD" "$MODEL")
TAG=bench-vs-kvpress
. scripts/peer/kvpress-venv.sh
kvpress_venv

loadavg=$(cut -d' ' -f1-3 /proc/loadavg)
rm -rf "$WORK"
mkdir -p "$WORK"
DB="$WORK/eval.sqlite"
proto="{\"name\":\"qa\",\"source\":\"synthetic\",\"task\":\"passkey\",\"length\":1024,\"num_samples\":$N}"
full_cfg="{\"model\":\"$MODEL\",\"threads\":$THREADS,\"method\":\"full\",\"protocol\":$proto}"
snap_cfg="{\"model\":\"$MODEL\",\"threads\":$THREADS,\"method\":{\"name\":\"snapkv\",\"params\":{\"budget\":0.25,\"preset\":\"kvpress\"}},\"protocol\":$proto}"
echo "$full_cfg" >"$WORK/full.json"
echo "$snap_cfg" >"$WORK/snapkv.json"

now() { date +%s.%N; }
# kvbench run CONFIG -> prints "RUN_ID WALL_S"
kvb_run() {
  local t0 t1 id
  t0=$(now)
  "$KVB" run -c "$1" --db "$DB" >"$1.out"
  t1=$(now)
  id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$1.out")
  echo "$id $(awk "BEGIN{print $t1 - $t0}")"
}
# kvpress side: RUN_ID PRESS OUT -> prints WALL_S
kvp_run() {
  local t0 t1
  t0=$(now)
  "$VENV/bin/python" scripts/peer/kvpress_qa.py --db "$DB" --run-id "$1" --model "$MODEL" \
    --threads "$THREADS" --press "$2" --ids "$WORK/ids.json" --out "$3" 2>"$3.log"
  t1=$(now)
  awk "BEGIN{print $t1 - $t0}"
}

echo "bench-vs-kvpress: kvbench full ($N samples)" >&2
read -r full_id full_wall < <(kvb_run "$WORK/full.json")
python3 scripts/peer/kvpress_qa.py --write-ids --db "$DB" --run-id "$full_id" --model "$MODEL" \
  --kvbench "$KVB" --ids "$WORK/ids.json"
echo "bench-vs-kvpress: kvpress, no press" >&2
kvp_full_wall=$(kvp_run "$full_id" none "$WORK/kvpress-full.json")
echo "bench-vs-kvpress: kvbench snapkv" >&2
read -r snap_id snap_wall < <(kvb_run "$WORK/snapkv.json")
echo "bench-vs-kvpress: kvpress, SnapKVPress" >&2
kvp_snap_wall=$(kvp_run "$snap_id" snapkv "$WORK/kvpress-snapkv.json")

python3 scripts/peer/report_eval_speed.py --db "$DB" --kvbench "$KVB" --loadavg "$loadavg" \
  --samples "$N" --threads "$THREADS" --model-name "$(basename "$MODEL")" --model-config "$MODEL/config.json" --command "scripts/bench-vs-kvpress.sh   # KVB_PEER_SAMPLES=$N KVB_PEER_THREADS=$THREADS" \
  --label full --kvb-run "$full_id" --kvb-wall "$full_wall" --kvp-json "$WORK/kvpress-full.json" \
  --kvp-wall "$kvp_full_wall" --kvb-config "$(cat "$WORK/full.json" | sed "s|$MODEL|$MODEL_SHOWN|")" \
  --label "snapkv 25%" --kvb-run "$snap_id" --kvb-wall "$snap_wall" --kvp-json "$WORK/kvpress-snapkv.json" \
  --kvp-wall "$kvp_snap_wall" --kvb-config "$(cat "$WORK/snapkv.json" | sed "s|$MODEL|$MODEL_SHOWN|")" \
  --out "$OUT"
echo "bench-vs-kvpress: wrote $OUT" >&2
