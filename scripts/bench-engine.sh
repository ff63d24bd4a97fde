#!/usr/bin/env bash
# Measures the inference core's CPU throughput on stories260K (decode at batch 1 and 16, 1 and 2
# threads, over a full 512-token generation; prefill of a 512-token prompt) and writes
# results/engine-cpu.md with the machine, its load and the command. Run on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
KVB=${KVB:-./build/kvbench}
out=results/engine-cpu.md
table=$($KVB bench --model stories260K --batch 1,16 --threads-list 1,2 --context 512 --repeats 5 2>/dev/null)
json=$($KVB bench --model stories260K --batch 1 --threads-list 1,2 --context 512 --repeats 5 --json 2>/dev/null)
{
  echo "# Engine throughput on the CPU (stories260K, fp32)"
  echo
  echo "Measured $(date -u +%Y-%m-%dT%H:%MZ) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "($(nproc) cores; load average before the run: $(cut -d' ' -f1-3 /proc/loadavg)), git $(git rev-parse --short HEAD)."
  echo
  echo "Command: \`scripts/bench-engine.sh\` (= \`kvbench bench --model stories260K --batch 1,16 --threads-list 1,2 --context 512 --repeats 5\`)."
  echo "Decode: from BOS, 511 new tokens per sequence (the full 512-token context), greedy, no early stop;"
  echo "median of 5 repeats after a warm-up, [min, max] over the repeats. Prefill: one 512-token prompt per sequence."
  echo
  echo "$table"
  echo
  echo "Side by side with llama2.c's run.c on the same model: results/decode-vs-runc.md"
  echo "(\`scripts/bench-vs-runc.sh\`)."
  echo
  echo '```json'
  echo "$json"
  echo '```'
} > "$out"
cat "$out"
