#!/usr/bin/env bash
# The main job (for now): set up, build, and evaluate the default model. Grows into the default grid +
# leaderboard as the harness issues land.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
KVB=./build/kvbench
MODEL="${KVB_MODEL:-stories260K}"
echo "== inspect $MODEL"
$KVB inspect --model "$MODEL"
echo "== score: README reference sentence"
$KVB score --model "$MODEL" --text "One day, a clever fox found a shiny key under the old oak tree."
echo "== generate (greedy, 128 tokens)"
$KVB generate --model "$MODEL" --prompt "Once upon a time" -n 128 --stats
