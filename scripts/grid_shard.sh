#!/usr/bin/env bash
# Runs one shard of a kvbench grid into its own database, results/shard-<i>.sqlite. The shard index and
# count come from the scheduler's environment, so Slurm job arrays, Kubernetes Indexed Jobs and Ray tasks
# all run this same script:
#   index: KVB_SHARD_INDEX, else SLURM_ARRAY_TASK_ID, else JOB_COMPLETION_INDEX
#   count: KVB_SHARD_COUNT, else SLURM_ARRAY_TASK_COUNT when the array is exactly 0..COUNT-1
# A Slurm task's id is its shard, so resubmitting one task (--array=2) resumes shard 2; such a partial
# or stepped array (--array=2, --array=0-6:2) does not say how many shards the grid has, so it needs
# KVB_SHARD_COUNT (its array size would silently make one shard the whole grid or skip shards).
# Usage: scripts/grid_shard.sh GRID.json [OUT_DIR (default results)] [more `kvbench grid` flags...]
# Then:  kvbench merge OUT_DIR/merged.sqlite OUT_DIR/shard-*.sqlite
# Exit status: kvbench grid's (0 ok, 3 some cells failed, 130/143 interrupted), 2 for a missing or
# malformed shard index or count; re-running the same shard resumes it (finished runs are skipped,
# unfinished ones resume sample by sample).
set -euo pipefail
grid="${1:?usage: grid_shard.sh GRID.json [OUT_DIR] [kvbench grid flags...]}"
out="${2:-results}"
shift $(( $# >= 2 ? 2 : 1 ))
root="$(cd "$(dirname "$0")/.." && pwd)"
kvb="${KVB:-}"
if [ -z "$kvb" ]; then
  if [ -x "$root/build/kvbench" ]; then kvb="$root/build/kvbench"; else kvb="kvbench"; fi
fi

die() { echo "grid_shard.sh: $*" >&2; exit 2; }
# Scheduler variables are text from the environment: only plain decimal integers are ever used, and
# never inside $(( )), which would evaluate a crafted value as a command.
integer() {  # NAME VALUE: VALUE when it is a non-negative decimal integer of at most 9 digits
  [[ "$2" =~ ^[0-9]{1,9}$ ]] || die "$1='${2:0:40}' is not a non-negative integer"
  echo "$((10#$2))"
}

index="" count=""
[ -n "${KVB_SHARD_COUNT:-}" ] && count=$(integer KVB_SHARD_COUNT "$KVB_SHARD_COUNT")
if [ -n "${KVB_SHARD_INDEX:-}" ]; then
  index=$(integer KVB_SHARD_INDEX "$KVB_SHARD_INDEX")
elif [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
  index=$(integer SLURM_ARRAY_TASK_ID "$SLURM_ARRAY_TASK_ID")
  if [ -z "$count" ]; then
    n=$(integer SLURM_ARRAY_TASK_COUNT "${SLURM_ARRAY_TASK_COUNT:-0}")
    min=$(integer SLURM_ARRAY_TASK_MIN "${SLURM_ARRAY_TASK_MIN:-0}")
    max=$(integer SLURM_ARRAY_TASK_MAX "${SLURM_ARRAY_TASK_MAX:-$((n > 0 ? n - 1 : 0))}")
    step=$(integer SLURM_ARRAY_TASK_STEP "${SLURM_ARRAY_TASK_STEP:-1}")
    if [ "$min" -ne 0 ] || [ "$step" -ne 1 ] || [ "$max" -ne $((n - 1)) ]; then
      die "the Slurm array is not 0..N-1 (min $min, max $max, step $step, $n tasks): set KVB_SHARD_COUNT" \
          "to the grid's shard count (a resubmitted or stepped array runs the shards its task ids name)"
    fi
    count=$n
  fi
elif [ -n "${JOB_COMPLETION_INDEX:-}" ]; then
  index=$(integer JOB_COMPLETION_INDEX "$JOB_COMPLETION_INDEX")
fi
if [ -z "$index" ] || [ -z "$count" ]; then
  die "no shard index/count in the environment (set KVB_SHARD_INDEX and KVB_SHARD_COUNT," \
      "or run under a Slurm job array / a Kubernetes Indexed Job with KVB_SHARD_COUNT)"
fi
[ "$count" -ge 1 ] && [ "$index" -lt "$count" ] || die "shard index $index is not below the shard count $count"

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
