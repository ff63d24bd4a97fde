#!/usr/bin/env bash
# Runs one shard of a kvbench grid into its own database, results/shard-<i>.sqlite. The shard index and
# count come from the scheduler's environment, so Slurm job arrays, Kubernetes Indexed Jobs and Ray tasks
# all run this same script:
#   index: KVB_SHARD_INDEX, else SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN, else JOB_COMPLETION_INDEX
#   count: KVB_SHARD_COUNT, else SLURM_ARRAY_TASK_COUNT
# Usage: scripts/grid_shard.sh GRID.json [OUT_DIR (default results)] [more `kvbench grid` flags...]
# Then:  kvbench merge OUT_DIR/merged.sqlite OUT_DIR/shard-*.sqlite
# Exit status: kvbench grid's (0 ok, 3 some cells failed, 130/143 interrupted); re-running the same
# shard resumes it (finished runs are skipped, unfinished ones resume sample by sample).
set -euo pipefail
grid="${1:?usage: grid_shard.sh GRID.json [OUT_DIR] [kvbench grid flags...]}"
out="${2:-results}"
shift $(( $# >= 2 ? 2 : 1 ))
root="$(cd "$(dirname "$0")/.." && pwd)"
kvb="${KVB:-}"
if [ -z "$kvb" ]; then
  if [ -x "$root/build/kvbench" ]; then kvb="$root/build/kvbench"; else kvb="kvbench"; fi
fi

index="${KVB_SHARD_INDEX:-}"
if [ -z "$index" ] && [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
  index=$(( SLURM_ARRAY_TASK_ID - ${SLURM_ARRAY_TASK_MIN:-0} ))
fi
[ -n "$index" ] || index="${JOB_COMPLETION_INDEX:-}"
count="${KVB_SHARD_COUNT:-${SLURM_ARRAY_TASK_COUNT:-}}"
if [ -z "$index" ] || [ -z "$count" ]; then
  echo "grid_shard.sh: no shard index/count in the environment (set KVB_SHARD_INDEX and KVB_SHARD_COUNT," \
       "or run under a Slurm job array / a Kubernetes Indexed Job with KVB_SHARD_COUNT)" >&2
  exit 2
fi

mkdir -p "$out"
args=(grid --config "$grid" --db "$out/shard-$index.sqlite" --shard "$index/$count")
# Line progress suits a batch log; a caller's own --progress or --quiet wins (kvbench refuses two).
case " $* " in
  *" --progress"*|*" -q "*|*" --quiet "*) ;;
  *) args+=(--progress lines) ;;
esac
# A node-local baseline cache avoids many writers on shared storage (default: OUT_DIR/cache/baseline).
[ -n "${KVB_CACHE_DIR:-}" ] && args+=(--cache-dir "$KVB_CACHE_DIR")
echo "grid_shard.sh: shard $index/$count of $grid -> $out/shard-$index.sqlite on $(hostname)" >&2
exec "$kvb" "${args[@]}" "$@"
