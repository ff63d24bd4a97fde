#!/usr/bin/env bash
# The main job: set up, build, run the default grid (configs/grids/main.json: every KV method family on
# stories260K and TinyStories, fidelity against the full cache plus decode throughput), then print the
# Markdown leaderboard and write the HTML one to results/leaderboard.html. Re-running skips what is done.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
KVB_BUILD_TARGETS="${KVB_BUILD_TARGETS:-kvbench}" bash scripts/build.sh
KVB="./${KVB_BUILD_DIR:-build}/kvbench"
GRID="${KVB_GRID:-configs/grids/main.json}"
DB="${KVB_DB:-results/main.sqlite}"
echo "== grid $GRID -> $DB" >&2
status=0
$KVB grid --config "$GRID" --db "$DB" || status=$?
# 3: some cells failed (listed above); the leaderboard still shows every finished run and each failure.
[ "$status" -eq 0 ] || [ "$status" -eq 3 ] || exit "$status"
echo
$KVB leaderboard --db "$DB"
$KVB leaderboard --db "$DB" --format html --out results/leaderboard.html
echo
echo "HTML leaderboard (tables + charts, self-contained): results/leaderboard.html"
exit "$status"
