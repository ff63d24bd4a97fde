#!/usr/bin/env bash
# Held-out retrieval accuracy of the testbed model (models/kvb-testbed) by task x context length x
# needle depth, for the full cache and 25%-budget eviction methods: runs configs/grids/testbed_accuracy.json
# (resumable) and prints the Markdown table that models/kvb-testbed/README.md shows.
#   scripts/testbed-accuracy.sh [--set k=v ...]    (e.g. --set model=runs/train/kvb-testbed/model)
set -euo pipefail
cd "$(dirname "$0")/.."
KVB="./${KVB_BUILD_DIR:-build}/kvbench"
DB="${KVB_DB:-results/testbed-accuracy.sqlite}"
[ -x "$KVB" ] || { bash scripts/setup.sh && KVB_BUILD_TARGETS=kvbench bash scripts/build.sh; }
"$KVB" grid -c configs/grids/testbed_accuracy.json --db "$DB" "$@" >&2
sqlite3 -markdown "$DB" <<'SQL'
WITH s AS (
  SELECT r.method || coalesce(' ' || json_extract(r.config_json, '$.method.params.budget'), '') AS method,
         json_extract(s.output_json, '$.meta.task') AS task,
         json_extract(r.config_json, '$.protocol.length') AS length,
         json_extract(s.output_json, '$.meta.depth') AS depth,
         json_extract(s.output_json, '$.items[0].score') AS score
  FROM samples s JOIN runs r ON r.id = s.run_id
  WHERE r.grid = 'testbed_accuracy' AND r.status = 'done')
SELECT method, task, length,
       printf('%.0f%%', 100 * avg(CASE WHEN depth = 0 THEN score END)) AS "depth 0",
       printf('%.0f%%', 100 * avg(CASE WHEN depth = 0.25 THEN score END)) AS "0.25",
       printf('%.0f%%', 100 * avg(CASE WHEN depth = 0.5 THEN score END)) AS "0.5",
       printf('%.0f%%', 100 * avg(CASE WHEN depth = 0.75 THEN score END)) AS "0.75",
       printf('%.0f%%', 100 * avg(CASE WHEN depth = 1 THEN score END)) AS "1",
       printf('%.1f%%', 100 * avg(score)) AS "all",
       count(*) AS n
FROM s GROUP BY method, task, length
ORDER BY method = 'full' DESC, method, task, length;
SQL
