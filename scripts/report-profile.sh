#!/usr/bin/env bash
# The attention workload profiles of results/profile-*.md (+ .html): kvb-testbed and
# SmolLM2-135M-Instruct on the 1911 Encyclopaedia Britannica's Shakespeare article (the text of the
# main job's stream tables), and a synthetic preset on seeded random tokens (a control: random
# weights attend almost uniformly). Each verdict is checked against the main job's stream tables.
#   scripts/report-profile.sh [--run] [PROFILE_DB] [MAIN_DB]
#   (defaults: results/profile.sqlite, results/main.sqlite; --run first runs the profiles, nice 10)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=0
if [ "${1:-}" = "--run" ]; then RUN=1; shift; fi
DB="${1:-results/profile.sqlite}"
MAIN_DB="${2:-results/main.sqlite}"
KVB="./${KVB_BUILD_DIR:-build}/kvbench"
COMMON="--samples 2 --decode-steps 16 --top-k 64 --threads 2 --db $DB"
TESTBED="kvbench profile -m kvb-testbed --dataset eb1911-shakespeare --tokens 256,768 $COMMON"
SMOLLM2="kvbench profile -m smollm2-135m-instruct --dataset eb1911-shakespeare --tokens 512,2048 ${COMMON/--samples 2/--samples 1}"
SYNTH="kvbench profile -m synthetic:small --dataset random-tokens --tokens 512,2048 ${COMMON/--samples 2/--samples 1}"
if [ "$RUN" = 1 ]; then
  for cmd in "$TESTBED" "$SYNTH" "$SMOLLM2"; do nice -n 10 "$KVB" ${cmd#kvbench } >/dev/null; done
fi
LB=$(mktemp)
trap 'rm -f "$LB"' EXIT
"$KVB" leaderboard --db "$MAIN_DB" --protocol stream --format json >"$LB"
NOTE="The machine (2 cores) was shared and loaded while these ran; nothing here is a timing."

WHY_TESTBED="Why: at 768 tokens the three captures lie within 0.02 of each other, under the rule's margin, and the per-layer verdicts split (the upper layers temporal, a lower one speculative), so no single family is predicted. The stream table's families are also not compared at one read budget: Quest keeps every token and scores every page against each query (25% of the pages read: an exact query-aware read of about three times top_k rows), TTKV holds its old blocks on the host, and SpeCache predicts its prefetch with a speculative token rather than the previous query. Where the read budgets match, among the evictions at the same 25% budget, the content scorer SnapKV ranks before StreamingLLM and H2O, in line with a temporal capture below the 0.90 bar."
WHY_SMOLLM2="Why: at 512 tokens the speculative and content captures are both high and within the rule's margin (mixed), the temporal capture lowest: the table, which has no speculative method for this model, ranks the content family (SnapKV) before the temporal one (StreamingLLM), the profile's order. At 2,048 tokens the content capture alone passes the bar: the clustered index finds the top-k rows better as the context grows while the recent window keeps less."
WHY_SYNTH="Random weights attend almost uniformly (entropy near log n): no sparse read holds the mass, which the profile reports as diffuse; no leaderboard ranks methods on random tokens, so there is nothing to check."

python3 scripts/profile-report.py --db "$DB" --model kvb-testbed --leaderboard "$LB" --command "$TESTBED" \
  --note "$NOTE" --why "$WHY_TESTBED"
python3 scripts/profile-report.py --db "$DB" --model smollm2-135m-instruct --leaderboard "$LB" --command "$SMOLLM2" \
  --note "$NOTE" --why "$WHY_SMOLLM2"
python3 scripts/profile-report.py --db "$DB" --model synthetic:small --command "$SYNTH" --note "$NOTE" --why "$WHY_SYNTH"
