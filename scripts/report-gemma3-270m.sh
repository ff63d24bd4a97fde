#!/usr/bin/env bash
# Writes results/gemma3-270m.md from the results database of grid gemma3_270m_retrieval: what the
# real Gemma 3 270M's full cache retrieves by context length, with and without Gemma's turn format.
#   scripts/report-gemma3-270m.sh [DB]   (default: results/gemma3_270m.sqlite)
set -euo pipefail
cd "$(dirname "$0")/.."
DB="${1:-results/gemma3_270m.sqlite}"
OUT=results/gemma3-270m.md
commit=$(git rev-parse --short HEAD)
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
{
  echo "# Gemma 3 270M: what its full cache retrieves"
  echo
  echo "Gemma 3 270M (Google, Gemma terms of use; 18 layers, 5 of every 6 sliding over 512 tokens,"
  echo "4 query / 1 KV head of 256, context 32,768), the pretrained model's Q4_K_M GGUF: the optional"
  echo "asset of \`scripts/fetch-assets.sh\` (\`KVB_FETCH_GEMMA3=1\`; sha256-pinned), dequantized to"
  echo "fp32; tokenizer from the GGUF's vocabulary (HF's ids on the fuzz set: results/tokenizers.md)."
  echo "kvbench's logits on this file match transformers' within 1.05e-6 relative"
  echo "(\`tests/harness/test_gguf_gemma3_270m_slow.cpp\`). The file carries no chat template, so the"
  echo "grid runs each length without one and in Gemma's turn format (\`chat_template: gemma\`:"
  echo "\`<bos><start_of_turn>user\\n...<end_of_turn>\\n<start_of_turn>model\\n\`)."
  echo
  builds="(no runs)"
  [ -f "$DB" ] && builds=$(sqlite3 "$DB" "SELECT group_concat(v, ', ') FROM (SELECT DISTINCT
      json_extract(provenance_json, '\$.kvbench_version') AS v FROM runs
      WHERE grid = 'gemma3_270m_retrieval' AND status = 'done')")
  echo "Machine: $(nproc) cores ($cpu), CPU fp32, 2 threads per run. Runs by kvbench $builds;"
  echo "page written at commit $commit. Regenerate:"
  echo
  echo '```'
  echo "KVB_FETCH_GEMMA3=1 scripts/fetch-assets.sh"
  echo "kvbench grid -c configs/grids/gemma3_270m_retrieval.json --db $DB"
  echo "scripts/report-gemma3-270m.sh $DB"
  echo '```'
  echo
  echo "RULER-style passkey, one sample per needle depth (0, 0.5, 1), greedy, scored as RULER does"
  echo "(answer found). Lengths a run did not reach are absent."
  echo
  echo "| chat template | target tokens | depths answered | accuracy | what it answered where it missed |"
  echo "|---|---:|---|---:|---|"
  if [ -f "$DB" ]; then
    sqlite3 -separator '|' "$DB" "
      SELECT json_extract(r.config_json,'\$.protocol.chat_template'),
             json_extract(s.output_json,'\$.meta.target_tokens'),
             coalesce(group_concat(CASE WHEN json_extract(s.output_json,'\$.items[0].score') > 0
                          THEN json_extract(s.output_json,'\$.meta.depth') END, ', '), '-'),
             printf('%d/%d', sum(json_extract(s.output_json,'\$.items[0].score') > 0), count(*)),
             replace(replace(substr(group_concat(CASE WHEN json_extract(s.output_json,'\$.items[0].score') = 0
                          THEN substr(json_extract(s.output_json,'\$.items[0].prediction'), 1, 40) END, ' / '), 1, 120),
                          char(10), ' '), '|', '/')
      FROM samples s JOIN runs r ON r.id = s.run_id
      WHERE r.grid = 'gemma3_270m_retrieval' AND r.status = 'done'
      GROUP BY 1, 2 ORDER BY 1, 2;" | sed 's/^/| /; s/$/ |/'
    echo
    echo "Runs: $(sqlite3 "$DB" "SELECT count(*) FROM runs WHERE grid = 'gemma3_270m_retrieval' AND status = 'done'") done, $(sqlite3 "$DB" "SELECT count(*) FROM runs WHERE grid = 'gemma3_270m_retrieval' AND status != 'done'") not done."
  fi
} > "$OUT"
echo "wrote $OUT" >&2
