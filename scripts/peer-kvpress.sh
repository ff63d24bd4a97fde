#!/usr/bin/env bash
# Token-for-token cross-check of kvbench's eviction methods against kvpress (NVIDIA, Apache-2.0), for
# every method both have (scripts/peer/kvpress_pairs.py, one line per pair). Writes
# results/kvpress-agreement.md and the CI fixtures tests/fixtures/kvpress/<pair>.json.
#
#   scripts/peer-kvpress.sh            (after scripts/build.sh)
#
# On synthetic passkey samples of the qa protocol at 1,024 tokens on kvb-testbed (the same ids on
# both sides), per pair:
#   kept sets  `kvbench kept-indices` (the eviction store's kept token indices per layer and KV head
#              after the context prefill) against scripts/peer/kvpress_kept.py (what the press's
#              compress selected), compared and classified by scripts/peer/kvpress_agreement.py;
#   answers    `kvbench run` (qa) against scripts/peer/kvpress_qa.py (the same samples through
#              transformers + the press), greedy.
# The fixtures are the same comparison on two short prompts (the first 256 and 301 tokens of the
# first two samples' contexts) at compression ratio KVB_PEER_FIXTURE_RATIO; only kvpress's kept sets
# and the documented differences are stored, so CI (no Python torch) checks kvbench against them.
# The Python side lives in a venv outside the clone with pinned versions, created on first use.
#
# Environment:
#   KVB                     kvbench binary (./build/kvbench)
#   KVB_PEER_SAMPLES        samples (50)            KVB_PEER_THREADS  threads on both sides (2)
#   KVB_PEER_RATIO          kvpress compression ratio of the samples (0.75; kvbench budget 1 - it)
#   KVB_PEER_FIXTURE_RATIO  compression ratio of the fixture prompts (0.5)
#   KVB_PEER_PAIRS          comma-separated pairs (all)
#   KVB_PEER_MODEL          model directory (models/kvb-testbed)
#   KVB_PEER_VENV           Python venv for kvpress ($HOME/.cache/kvbench/peer-venv), as
#                           scripts/bench-vs-kvpress.sh
#   KVB_PEER_WORK           scratch directory, emptied first ($HOME/.cache/kvbench/peers/kvpress-agreement)
#   KVB_PEER_OUT            page to write (results/kvpress-agreement.md)
#   KVB_PEER_FIXTURES       fixture directory to write (tests/fixtures/kvpress; empty: none)
set -euo pipefail
cd "$(dirname "$0")/.."
KVB=${KVB:-./build/kvbench}
N=${KVB_PEER_SAMPLES:-50}
THREADS=${KVB_PEER_THREADS:-2}
RATIO=${KVB_PEER_RATIO:-0.75}
FIX_RATIO=${KVB_PEER_FIXTURE_RATIO:-0.5}
PAIRS=${KVB_PEER_PAIRS:-}
MODEL=$(realpath "${KVB_PEER_MODEL:-models/kvb-testbed}")
VENV=${KVB_PEER_VENV:-$HOME/.cache/kvbench/peer-venv}
WORK=${KVB_PEER_WORK:-$HOME/.cache/kvbench/peers/kvpress-agreement}
OUT=${KVB_PEER_OUT:-results/kvpress-agreement.md}
FIXTURES=${KVB_PEER_FIXTURES-tests/fixtures/kvpress}
PINS=(torch==2.15.0 transformers==5.2.0 kvpress==0.5.5 sentencepiece==0.2.3)

[ -x "$KVB" ] || { echo "peer-kvpress: no kvbench binary at $KVB (run scripts/build.sh)" >&2; exit 1; }
[ -f "$MODEL/tokenizer.model" ] || { echo "peer-kvpress: $MODEL has no tokenizer.model" >&2; exit 1; }
KVB=$(realpath "$KVB")
MODEL_SHOWN=$(realpath --relative-to="$PWD" "$MODEL")
TAG=peer-kvpress
. scripts/peer/kvpress-venv.sh
kvpress_venv
PY="$VENV/bin/python"
PEER=scripts/peer

loadavg=$(cut -d' ' -f1-3 /proc/loadavg)
rm -rf "$WORK"
mkdir -p "$WORK"
# The calibrated pairs (qfilters, kvzap): kvbench writes its artifacts there, kvpress's side reads them.
export KVB_PEER_ARTIFACTS="$WORK/artifacts"
DB="$WORK/qa.sqlite"
proto="{\"name\":\"qa\",\"source\":\"synthetic\",\"task\":\"passkey\",\"length\":1024,\"num_samples\":$N}"
mapfile -t names < <(python3 "$PEER/kvpress_pairs.py" names "$PAIRS")

# kvbench run CONFIG -> prints the run id
kvb_run() {
  "$KVB" run -c "$1" --db "$DB" >"$1.out"
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$1.out"
}

echo "peer-kvpress: kvbench full ($N samples), the samples' ids" >&2
echo "{\"model\":\"$MODEL\",\"threads\":$THREADS,\"method\":\"full\",\"protocol\":$proto}" >"$WORK/full.json"
full_id=$(kvb_run "$WORK/full.json")
python3 "$PEER/kvpress_qa.py" --write-ids --db "$DB" --run-id "$full_id" --model "$MODEL" \
  --kvbench "$KVB" --ids "$WORK/ids.json"
# Prompts as the context prefill sees them ([BOS] + context), and the two short fixture prompts.
python3 - "$MODEL/config.json" "$WORK/ids.json" "$WORK/kept-ids.json" "$WORK/fixture-ids.json" <<'EOF'
import json, sys
bos = json.load(open(sys.argv[1]))["bos_token_id"]
ctx = [[bos] + v["context"] for v in json.load(open(sys.argv[2])).values()]
json.dump({"prompts": ctx}, open(sys.argv[3], "w"))
json.dump({"prompts": [ctx[0][:256], ctx[1][:301]]}, open(sys.argv[4], "w"))
EOF

for p in "${names[@]}"; do
  echo "peer-kvpress: $p: kept sets" >&2
  for which in "kept-ids.json $RATIO" "fixture-ids.json $FIX_RATIO"; do
    read -r ids r <<<"$which"
    pre=$([ "$ids" = fixture-ids.json ] && echo fix- || true)
    "$KVB" kept-indices --model "$MODEL" --threads "$THREADS" --channels \
      --method "$(python3 "$PEER/kvpress_pairs.py" method "$p" "$r")" \
      --ids "$WORK/$ids" --out "$WORK/${pre}kvb-kept-$p.json" 2>>"$WORK/kvbench.log"
    nice "$PY" "$PEER/kvpress_kept.py" --model "$MODEL" --pair "$p" --ratio "$r" --threads "$THREADS" \
      --ids "$WORK/$ids" --out "$WORK/${pre}kvp-kept-$p.json" 2>>"$WORK/kvpress.log"
  done
  echo "peer-kvpress: $p: answers" >&2
  method=$(python3 "$PEER/kvpress_pairs.py" method "$p" "$RATIO")
  echo "{\"model\":\"$MODEL\",\"threads\":$THREADS,\"method\":$method,\"protocol\":$proto}" >"$WORK/qa-$p.json"
  run_id=$(kvb_run "$WORK/qa-$p.json")
  nice "$PY" "$PEER/kvpress_qa.py" --db "$DB" --run-id "$run_id" --model "$MODEL" --threads "$THREADS" \
    --press "$p" --compression-ratio "$RATIO" --ids "$WORK/ids.json" --out "$WORK/kvp-qa-$p.json" \
    2>>"$WORK/kvpress.log"
done

[ -z "$FIXTURES" ] || mkdir -p "$FIXTURES"
python3 "$PEER/kvpress_agreement.py" --work "$WORK" --pairs "$PAIRS" --ratio "$RATIO" \
  --fixture-ratio "$FIX_RATIO" ${FIXTURES:+--fixture-dir "$FIXTURES"} --model-name "$MODEL_SHOWN" \
  --kvbench "$KVB" --loadavg "$loadavg" --samples "$N" --out "$OUT" \
  --command "scripts/peer-kvpress.sh   # KVB_PEER_SAMPLES=$N KVB_PEER_THREADS=$THREADS KVB_PEER_RATIO=$RATIO KVB_PEER_FIXTURE_RATIO=$FIX_RATIO${PAIRS:+ KVB_PEER_PAIRS=$PAIRS}"
echo "peer-kvpress: wrote $OUT${FIXTURES:+ and $FIXTURES/}" >&2
