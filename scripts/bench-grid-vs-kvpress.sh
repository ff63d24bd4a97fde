#!/usr/bin/env bash
# Peer benchmark of a whole leaderboard grid: kvbench vs kvpress (NVIDIA, Apache-2.0) over the same
# methods, compression ratios and qa samples, answers compared cell by cell. Writes
# results/grid-speed.md.
#
#   scripts/bench-grid-vs-kvpress.sh                          (after scripts/build.sh)
#   KVB_GRID_MODEL=smollm2 scripts/bench-grid-vs-kvpress.sh   (SmolLM2-135M-Instruct at 2,048 tokens)
#
# kvbench runs `kvbench grid` once over a grid generated from configs/grids/kvpress_leaderboard_cpu.json
# (its methods that kvpress has, with the kvpress pair's parameters from scripts/peer/kvpress_pairs.py,
# at its four budgets, on its qa tasks) into a fresh results database: one process, one model load, the
# full cache's context prefill recorded once per sample and replayed into every store that reproduces
# it. scripts/peer/kvpress_grid.py then answers every cell's samples (same ids, threads, greedy stop
# rule) with transformers + kvpress in one Python process that loads the model once (kvpress's best
# case; each cell prefills the context again, as kvpress's pipeline does).
#
# Environment:
#   KVB                 kvbench binary (./build/kvbench)
#   KVB_GRID_MODEL      testbed (kvb-testbed, 1,024 tokens) | smollm2 (SmolLM2-135M-Instruct from the
#                       asset cache, scripts/fetch-assets.sh; 2,048 tokens)
#   KVB_GRID_CONFIG     leaderboard grid whose methods and tasks run (configs/grids/kvpress_leaderboard_cpu.json)
#   KVB_GRID_LENGTH     target prompt tokens (1024 testbed, 2048 smollm2)
#   KVB_GRID_SAMPLES    samples per depth and task (the grid's: 2)
#   KVB_GRID_METHODS    comma-separated method labels to run (all): full, snapkv, pyramidkv, adakv,
#                       streaming_llm, tova, h2o, knorm, keydiff, lagkv, cur, expected_attention,
#                       chunkkv, kvzip, kvzip_plus, kvzap
#   KVB_GRID_RATIOS     comma-separated kvpress compression ratios (the grid's: 0.25,0.5,0.75,0.875)
#   KVB_GRID_TASKS      comma-separated tasks (the grid's: passkey,niah_single_1)
#   KVB_GRID_DEPTHS     needle depths, e.g. 0.5 (the grid's: 0,0.5,1)
#   KVB_PEER_THREADS    threads on both sides (2)
#   KVB_PEER_VENV       Python venv for kvpress ($HOME/.cache/kvbench/peer-venv), as
#                       scripts/bench-vs-kvpress.sh (scripts/peer/kvpress-venv.sh; KVB_PEER_TORCH_INDEX)
#   KVB_PEER_WORK       scratch directory, emptied first ($HOME/.cache/kvbench/peers/grid-speed)
#   KVB_PEER_OUT        page to write (results/grid-speed.md)
set -euo pipefail
cd "$(dirname "$0")/.."
KVB=${KVB:-./build/kvbench}
MODE=${KVB_GRID_MODEL:-testbed}
GRID_SRC=${KVB_GRID_CONFIG:-configs/grids/kvpress_leaderboard_cpu.json}
SAMPLES=${KVB_GRID_SAMPLES:-2}
METHODS=${KVB_GRID_METHODS:-}
RATIOS=${KVB_GRID_RATIOS:-}
TASKS=${KVB_GRID_TASKS:-}
DEPTHS=${KVB_GRID_DEPTHS:-}
THREADS=${KVB_PEER_THREADS:-2}
VENV=${KVB_PEER_VENV:-$HOME/.cache/kvbench/peer-venv}
WORK=${KVB_PEER_WORK:-$HOME/.cache/kvbench/peers/grid-speed}
OUT=${KVB_PEER_OUT:-results/grid-speed.md}
PINS=(torch==2.15.0 transformers==5.2.0 kvpress==0.5.5 sentencepiece==0.2.3)
TAG=bench-grid-vs-kvpress
PEER=scripts/peer
# The Python steps import their sibling modules; no __pycache__ left in the checkout.
export PYTHONDONTWRITEBYTECODE=1

die() { echo "$TAG: $*" >&2; exit 1; }
# need_int NAME VALUE: a positive integer, or stop with the variable's name.
need_int() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer (got '$2')"; }

# The model on each side: kvbench's name or directory, the Python side's directory (+ GGUF file).
case "$MODE" in
  testbed)
    LENGTH=${KVB_GRID_LENGTH:-1024}
    KVB_MODEL=$(realpath models/kvb-testbed)
    PY_DIR=$KVB_MODEL
    PY_GGUF=
    [ -f "$PY_DIR/tokenizer.model" ] || die "$PY_DIR has no tokenizer.model"
    ;;
  smollm2)
    LENGTH=${KVB_GRID_LENGTH:-2048}
    KVB_MODEL=smollm2-135m-instruct  # kvbench finds it in its asset cache
    PY_DIR="${KVBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvbench}/models/smollm2-135m-instruct"
    PY_GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
    [ -f "$PY_DIR/$PY_GGUF" ] || scripts/fetch-assets.sh
    PINS+=(gguf==0.19.0)  # transformers reads GGUF files through it
    ;;
  *) die "KVB_GRID_MODEL must be testbed or smollm2 (got '$MODE')" ;;
esac
need_int KVB_GRID_SAMPLES "$SAMPLES"
need_int KVB_PEER_THREADS "$THREADS"
need_int KVB_GRID_LENGTH "$LENGTH"
[ -x "$KVB" ] || die "no kvbench binary at $KVB (run scripts/build.sh)"
[ -f "$GRID_SRC" ] || die "no grid config at $GRID_SRC"
KVB=$(realpath "$KVB")

. "$PEER/kvpress-venv.sh"
kvpress_venv

loadavg=$(cut -d' ' -f1-3 /proc/loadavg)
rm -rf "$WORK"
mkdir -p "$WORK"
WORK=$(realpath "$WORK")
DB="$WORK/grid.sqlite"
# kvzap's surrogate: kvbench fits it into this directory (the pair's cache_dir), kvpress reads it.
export KVB_PEER_ARTIFACTS="$WORK/artifacts"
now() { date +%s.%N; }
elapsed() { awk "BEGIN{print $2 - $1}"; }

python3 "$PEER/kvpress_grid.py" plan --grid "$GRID_SRC" --model "$KVB_MODEL" --length "$LENGTH" \
  --samples "$SAMPLES" --threads "$THREADS" --methods "$METHODS" --ratios "$RATIOS" --tasks "$TASKS" \
  --depths "$DEPTHS" --kvbench "$KVB" --out-grid "$WORK/grid.json" --out-plan "$WORK/plan.json"

# kvbench: the whole grid in one process. Exit 3 (some cells failed) still leaves a report to write.
echo "$TAG: kvbench grid ($WORK/grid.json)" >&2
t0=$(now)
rc=0
"$KVB" grid -c "$WORK/grid.json" --db "$DB" --progress lines 2>"$WORK/kvbench.log" || rc=$?
kvb_wall=$(elapsed "$t0" "$(now)")
[ "$rc" = 0 ] || [ "$rc" = 3 ] || { tail -20 "$WORK/kvbench.log" >&2; die "kvbench grid exited $rc"; }

# The samples' ids as kvbench prefilled them (untimed; checked against the stored lengths).
python3 "$PEER/kvpress_grid.py" ids --db "$DB" --kvbench "$KVB" --model "$KVB_MODEL" --ids "$WORK/ids.json"

echo "$TAG: kvpress over the same cells" >&2
t0=$(now)
"$VENV/bin/python" "$PEER/kvpress_grid.py" run --db "$DB" --plan "$WORK/plan.json" --ids "$WORK/ids.json" \
  --model-dir "$PY_DIR" ${PY_GGUF:+--gguf-file "$PY_GGUF"} --threads "$THREADS" \
  --out "$WORK/kvpress.json" 2>"$WORK/kvpress.log" ||
  { tail -20 "$WORK/kvpress.log" >&2; die "the kvpress side failed (log: $WORK/kvpress.log)"; }
kvp_wall=$(elapsed "$t0" "$(now)")

knobs="KVB_GRID_MODEL=$MODE KVB_GRID_SAMPLES=$SAMPLES KVB_PEER_THREADS=$THREADS"
for v in KVB_GRID_METHODS KVB_GRID_RATIOS KVB_GRID_TASKS KVB_GRID_DEPTHS KVB_GRID_LENGTH KVB_GRID_CONFIG; do
  [ -z "${!v:-}" ] || knobs+=" $v=${!v}"
done
python3 "$PEER/report_grid_speed.py" --db "$DB" --plan "$WORK/plan.json" --kvp-json "$WORK/kvpress.json" \
  --kvb-wall "$kvb_wall" --kvp-wall "$kvp_wall" --kvb-exit "$rc" --kvbench "$KVB" --loadavg "$loadavg" \
  --model-name "$(basename "$KVB_MODEL")" --grid-json "$WORK/grid.json" \
  --command "$knobs scripts/bench-grid-vs-kvpress.sh" --out "$OUT"
echo "$TAG: wrote $OUT (work files in $WORK)" >&2
