#!/usr/bin/env bash
# Copies the trained testbed model into the repository (models/kvb-testbed) from the two training
# phases' output directories, with both phases' training records:
#   kvbench train -c configs/models/kvb-testbed.json --stop-after 1200     # phase 1 (runs/train/kvb-testbed)
#   kvbench train -c configs/models/kvb-testbed-retrieval.json             # phase 2 (from phase 1's step 1200)
#   scripts/release-testbed.sh
set -euo pipefail
cd "$(dirname "$0")/.."
KVB="./${KVB_BUILD_DIR:-build}/kvbench"
P1=runs/train/kvb-testbed
P2=runs/train/kvb-testbed-retrieval
DST=models/kvb-testbed
[ -f "$P2/model/model.safetensors" ] || { echo "no finished phase-2 run in $P2" >&2; exit 1; }
# Phase 1 stopped at step 1200 of its recipe: export that checkpoint to get its training record.
"$KVB" train -c configs/models/kvb-testbed.json --out "$P1" --export-only -q >/dev/null
mkdir -p "$DST"
cp "$P2/model/config.json" "$P2/model/model.safetensors" "$P2/model/tokenizer.model" "$DST/"
cp "$P2/model/TRAINING.md" "$DST/TRAINING-phase2.md"
cp "$P1/model/TRAINING.md" "$DST/TRAINING-phase1.md"
sha256sum "$DST/model.safetensors" "$DST/tokenizer.model" "$DST/config.json" | sed "s|$DST/||" > "$DST/SHA256SUMS"
du -sh "$DST"
