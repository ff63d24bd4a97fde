#!/usr/bin/env bash
# Ships a finished testbed run into the repository (models/kvb-testbed): weights, config, tokenizer,
# the trainer's own record (TRAINING.md: curve, held-out loss, induction probe, the exact recipe),
# SHA256SUMS, and a README.md with the recipe, data and licences, and the accuracy table by task x
# context length x needle depth (scripts/testbed-accuracy.sh on the shipped copy).
#   kvbench train -c configs/models/kvb-testbed-cpu.json --threads 2   # ~1 h on 2 cores; resumable
#   scripts/release-testbed.sh [RUN_MODEL_DIR]                          # default: that run's model/
# KVB_SKIP_ACCURACY=1 leaves the accuracy table out (it runs configs/grids/testbed_accuracy.json).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC="${1:-runs/train/kvb-testbed-cpu/model}"
DST="${KVB_TESTBED_DST:-models/kvb-testbed}"
[ -f "$SRC/model.safetensors" ] || { echo "release-testbed: no exported model in $SRC (run the recipe to its end)" >&2; exit 1; }
mkdir -p "$DST"
cp "$SRC/config.json" "$SRC/model.safetensors" "$SRC/tokenizer.model" "$SRC/TRAINING.md" "$DST/"
(cd "$DST" && sha256sum model.safetensors tokenizer.model config.json TRAINING.md > SHA256SUMS)
bytes=$(stat -c %s "$DST/model.safetensors")
((bytes <= 20000000)) || { echo "release-testbed: model.safetensors is $bytes bytes, over the 20 MB the repository allows" >&2; exit 1; }

# The recipe's name and the trainer's summary lines, straight from TRAINING.md.
name=$(sed -n 's/^# Training record: //p' "$DST/TRAINING.md")
summary=$(sed -n '/^- /p' "$DST/TRAINING.md" | head -n 8)
heldout=$(awk '/^## Held-out/{f=1} /^## Recipe/{f=0} f && /^\|/' "$DST/TRAINING.md")
# A recipe that starts from another run's checkpoint (init_from: runs/train/PREV/checkpoints/step-N)
# needs that run first, stopped at step N (a finished run keeps only its two newest checkpoints);
# PREV's recipe (configs/models/PREV.json) may itself start from another: the whole chain, oldest first.
chain=$(python3 - "$DST/TRAINING.md" <<'PY'
import json, re, sys
m = re.search(r"```json\n(.*?)```", open(sys.argv[1]).read(), re.S)
init = json.loads(m.group(1)).get("init_from", "") if m else ""
parts = []
while True:
    r = re.search(r"runs/train/([^/]+)/checkpoints/step-0*([0-9]+)\.safetensors", init)
    if not r:
        break
    parts.append(f"{r.group(1)} {r.group(2)}")
    try:
        init = json.load(open(f"configs/models/{r.group(1)}.json")).get("init_from", "")
    except OSError:
        break
print("\n".join(reversed(parts)))
PY
)
# Each earlier part's own record (curve, held-out, recipe) ships as TRAINING-<recipe>.md: export it
# first (kvbench train -c RECIPE --export-only writes runs/train/RECIPE/model at its newest checkpoint).
first=""
while read -r prev step; do
  [ -n "$prev" ] || continue
  first+="kvbench train -c configs/models/$prev.json --threads 2 --stop-after $step   # init_from of the next"$'\n'
  rec="runs/train/$prev/model/TRAINING.md"
  if [ -f "$rec" ]; then
    cp "$rec" "$DST/TRAINING-$prev.md"
  else
    echo "release-testbed: no $rec (run: kvbench train -c configs/models/$prev.json --export-only); its record is not shipped" >&2
  fi
done <<<"$chain"
(cd "$DST" && sha256sum model.safetensors tokenizer.model config.json TRAINING*.md > SHA256SUMS)
origin="recipe \`configs/models/$name.json\`"
if [ -n "$first" ]; then
  origin="recipes chained by \`init_from\`, the last \`configs/models/$name.json\`: see Reproduce; the
curve of every part and what each changed are in configs/models/README.md"
fi
accuracy="(not generated: run scripts/testbed-accuracy.sh --set model=$DST)"
if [ "${KVB_SKIP_ACCURACY:-0}" != 1 ]; then
  accuracy=$(KVB_DB="results/testbed-accuracy.sqlite" bash scripts/testbed-accuracy.sh --set model="$DST")
fi
cat > "$DST/README.md" <<MD
# kvb-testbed: a small retrieval-capable model for KV-cache compression tests

Trained from scratch by \`kvbench train\` ($origin), in the Hugging Face
layout the loader reads: \`kvbench run --set model=kvb-testbed ...\` finds it (the repository's models/
directory is on the model path). It exists because stories260K cannot recall anything from far back, so
on it every compression method looks alike; here the full cache retrieves and a cache that drops the
needle does not.

$summary

## Reproduce

\`\`\`
${first}kvbench train -c configs/models/$name.json --threads 2   # resumable
scripts/release-testbed.sh runs/train/$name/model          # copies the export here, writes this file
scripts/testbed-accuracy.sh                               # the accuracy table below
\`\`\`
Rows are a pure function of (seed, step, row) and resume is exact, so the same command on the same
LibTorch and thread count gives the same weights. \`tests/harness/test_train.cpp\`
(Testbed.ShippedModel...) checks that these files, read by the HF loader and run by the engine,
reproduce the held-out loss the trainer recorded.

## Data and licences

- Text: *Moby-Dick* (Herman Melville, Project Gutenberg #2701), *War and Peace* (Tolstoy, tr. Louise and
  Aylmer Maude, Project Gutenberg #2600), Tiny Shakespeare (karpathy/char-rnn): public domain. The last
  2% of each is held out and never trained on.
- Synthetic rows: the RULER-style tasks of \`datasets/\` (passkey, needles) and the training-only drills
  of \`harness/train/train_data.h\` (repeated random ids, copy and recall drills), generated from the
  recipe's seed; evaluation samples come from a different seed.
- The weights and tokenizer are released under the project's licence (LICENSE, MIT).

## Held-out text and induction probe (from TRAINING.md)

$heldout

## Retrieval accuracy by task x context length x needle depth

Full cache vs StreamingLLM, SnapKV and H2O at a 25% budget, the context compressed before the question
(\`configs/grids/testbed_accuracy.json\`, 4 samples per depth; score = answer found):

$accuracy

The full training record (curve, held-out loss, recipe) is TRAINING.md; the earlier parts' records, when
the model came from chained recipes, are TRAINING-<recipe>.md.
MD
du -sh "$DST"
