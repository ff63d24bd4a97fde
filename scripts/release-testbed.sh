#!/usr/bin/env bash
# Copies the trained CPU testbed into the repository (models/kvb-testbed): weights, config, tokenizer and
# the trainer's own record (TRAINING.md: curve, held-out loss, the exact recipe), plus SHA256SUMS.
#   kvbench train -c configs/models/kvb-testbed-cpu.json --threads 2   # ~1 h on 2 cores; resumable
#   scripts/release-testbed.sh
#   scripts/testbed-accuracy.sh                                # the accuracy table of models/kvb-testbed/README.md
set -euo pipefail
cd "$(dirname "$0")/.."
SRC="${1:-runs/train/kvb-testbed-cpu/model}"
DST=models/kvb-testbed
[ -f "$SRC/model.safetensors" ] || { echo "release-testbed: no exported model in $SRC (run the recipe to its end)" >&2; exit 1; }
mkdir -p "$DST"
cp "$SRC/config.json" "$SRC/model.safetensors" "$SRC/tokenizer.model" "$SRC/TRAINING.md" "$DST/"
(cd "$DST" && sha256sum model.safetensors tokenizer.model config.json TRAINING.md > SHA256SUMS)
du -sh "$DST"
