#!/usr/bin/env bash
# The shipped Slurm route, run on a real scheduler: starts a private single-node Slurm on this machine
# (munged, slurmctld and slurmd from Debian's slurm-wlm + munge, every file under one temp dir, no
# systemd and no cgroups), submits scripts/slurm_grid.sbatch as a 3-task job array over a small
# testbed grid (tests/slurm/grid.json), waits, merges the shards with `kvbench merge` and checks that
# the merged database equals a local run of the same grid: the same config hashes and the same
# per-sample outputs (scripts/same-outputs.py). Every daemon it started is stopped on the way out,
# whether the test passed or not. It never skips: no Slurm, or a Slurm that does not start, fails
# naming the cause (scripts/setup.sh installs the packages).
#
# Usage: tests/slurm/run-slurm-grid.sh
# Environment: KVBENCH_BIN (default <repo>/build/kvbench), KVB_SLURM_TIMEOUT (seconds for the job
# array, default 900), KVB_SLURM_KEEP=1 (keep the temp dir: logs, shards, databases).
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
kvb="${KVBENCH_BIN:-$repo/build/kvbench}"
timeout_s="${KVB_SLURM_TIMEOUT:-900}"
shards=3

fail() { echo "slurm-grid: FAIL: $*" >&2; exit 1; }
cd "$repo"  # as a user runs the shipped scripts (the testbed model is found from here)

[ -x "$kvb" ] || fail "kvbench binary '$kvb' is missing (build it, or set KVBENCH_BIN)"
for tool in munged munge unmunge slurmctld slurmd sbatch squeue sinfo scontrol scancel python3; do
  command -v "$tool" >/dev/null || fail "'$tool' is not installed: scripts/setup.sh installs slurm-wlm and munge"
done

# Munge refuses a socket directory that is not world-executable, so the temp dir is 0755; the key
# lives in a 0700 directory below it.
tmp="$(mktemp -d /tmp/kvb-slurm.XXXXXX)"
chmod 755 "$tmp"
mkdir -p "$tmp/munge" "$tmp/key" "$tmp/state" "$tmp/spool" "$tmp/log" "$tmp/out" "$tmp/shards"
chmod 755 "$tmp/munge"
chmod 700 "$tmp/key" "$tmp/state" "$tmp/spool"
conf="$tmp/slurm.conf"
socket="$tmp/munge/munge.socket"
export SLURM_CONF="$conf"
# Every process this test starts through the daemons (job steps, the jobs' kvbench) carries this
# marker in its environment; this shell does not, so cleanup finds exactly those.
marker="KVB_SLURM_TEST=$tmp"
job="" munged_pid="" ctld_pid="" slurmd_pid=""

# Pids of the processes that carry the marker (readable /proc environ: root, or the daemons' user).
marked_pids() {
  local env pid
  for env in /proc/[0-9]*/environ; do
    pid="${env#/proc/}"
    pid="${pid%/environ}"
    { tr '\0' '\n' < "$env"; } 2>/dev/null | grep -qxF "$marker" && echo "$pid"
  done
  return 0
}

stop_pid() {  # TERM, up to 10 s, then KILL
  local pid="$1"
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null
  return 0
}

# Stops what this script started: the job array (scancel, then up to 30 s for its steps to report
# to the controller), slurmctld and slurmd (scontrol shutdown, then their pids), anything left that
# they started (the marker), munged.
cleanup() {
  local rc=$?
  set +e
  if [ -n "$job" ]; then
    timeout 20 scancel "$job" 2>/dev/null
    for _ in $(seq 1 30); do [ -z "$(timeout 10 squeue -h -j "$job" -o %i 2>/dev/null)" ] && break; sleep 1; done
  fi
  if [ -n "$ctld_pid" ]; then timeout 20 scontrol shutdown >/dev/null 2>&1; fi
  for _ in $(seq 1 50); do
    kill -0 "$ctld_pid" 2>/dev/null || kill -0 "$slurmd_pid" 2>/dev/null || break
    sleep 0.2
  done
  stop_pid "$slurmd_pid"
  stop_pid "$ctld_pid"
  for pid in $(marked_pids); do kill -KILL "$pid" 2>/dev/null; done
  stop_pid "$munged_pid"
  wait 2>/dev/null
  left="$(marked_pids | tr '\n' ' ')"
  if [ -n "$left" ]; then echo "slurm-grid: processes still running: $left" >&2; [ "$rc" -ne 0 ] || rc=1; fi
  if [ "$rc" -ne 0 ]; then
    echo "slurm-grid: failed (exit $rc); daemon logs and job output in $tmp:" >&2
    for f in "$tmp"/log/* "$tmp"/out/*; do
      [ -f "$f" ] || continue
      echo "---- $f (last 25 lines)" >&2
      tail -n 25 "$f" >&2
    done
  fi
  if [ "${KVB_SLURM_KEEP:-0}" = 1 ] || [ "$rc" -ne 0 ]; then
    echo "slurm-grid: kept $tmp" >&2
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- munge: a private key and socket --------------------------------------------------------------
head -c 1024 /dev/urandom > "$tmp/key/munge.key"
chmod 600 "$tmp/key/munge.key"
# The daemons run in the foreground as this script's background jobs, so their pids are known from
# the start (a daemon's pid file appears late, or never when it fails).
munged --foreground --socket="$socket" --key-file="$tmp/key/munge.key" \
  --log-file="$tmp/log/munged.log" --pid-file="$tmp/munge/munged.pid" \
  --seed-file="$tmp/munge/munged.seed" > "$tmp/log/munged.out" 2>&1 &
munged_pid=$!
for _ in $(seq 1 50); do [ -S "$socket" ] && break; kill -0 "$munged_pid" 2>/dev/null || break; sleep 0.2; done
[ -S "$socket" ] || fail "munged did not start (its output: $tmp/log/munged.*)"
munge --socket="$socket" -n | unmunge --socket="$socket" >/dev/null \
  || fail "munge cannot encode and decode a credential through $socket"

# --- slurm.conf: one node (this machine), free ports, state under the temp dir ---------------------
read -r ctld_port slurmd_port < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
PY
)
host="$(hostname -s)"
user="$(id -un)"
cpus="$(getconf _NPROCESSORS_ONLN)"  # not nproc: it honours OMP_NUM_THREADS
cat > "$conf" <<CONF
ClusterName=kvbtest
# slurmctld starts only on the host it is configured for.
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
# No systemd, no cgroups: processes tracked by parentage, tasks launched without affinity.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# The node's CPUs as declared here, whatever slurmd detects.
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=kvb Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

env "$marker" slurmctld -D -f "$conf" > "$tmp/log/slurmctld.out" 2>&1 &
ctld_pid=$!
env "$marker" slurmd -D -f "$conf" > "$tmp/log/slurmd.out" 2>&1 &
slurmd_pid=$!
state=""
for _ in $(seq 1 60); do
  kill -0 "$ctld_pid" 2>/dev/null || fail "slurmctld exited at start (its output: $tmp/log/slurmctld.*)"
  kill -0 "$slurmd_pid" 2>/dev/null || fail "slurmd exited at start (its output: $tmp/log/slurmd.*)"
  state="$(sinfo -h -o %T 2>/dev/null | head -n 1 || true)"
  [ "$state" = idle ] && break
  sleep 1
done
[ "$state" = idle ] || fail "the node did not become idle within 60 s (sinfo says '${state:-nothing}')"
echo "slurm-grid: Slurm up: $(sinfo -h -o '%P %D node(s) %c CPUs %T')" >&2

# --- the grid through the shipped sbatch script -------------------------------------------------
grid="$repo/tests/slurm/grid.json"
cells="$("$kvb" grid -c "$grid" --dry-run --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["cells"]))')"
[ "$cells" -ge "$shards" ] || fail "$grid has $cells cells, fewer than the $shards shards"
# The script is submitted from the repository root (cwd since the start), as its usage line shows
# (it runs scripts/grid_shard.sh from the submit directory). The array size and one CPU per task
# (this node may have fewer than the script's default) are given on the command line, which
# overrides #SBATCH lines.
t0=$(date +%s)
job="$(env "$marker" KVB="$kvb" sbatch --parsable --array=0-$((shards - 1)) --cpus-per-task=1 \
  --output="$tmp/out/task-%A_%a.out" scripts/slurm_grid.sbatch "$grid" "$tmp/shards")"
job="${job%%;*}"
echo "slurm-grid: submitted job array $job ($shards tasks, $cells cells)" >&2
deadline=$(( t0 + timeout_s ))
while [ -n "$(squeue -h -j "$job" -o %i 2>/dev/null)" ]; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "job array $job still running after $timeout_s s"
  sleep 2
done
# Every array task must have run to completion with exit 0 (the controller keeps finished jobs for
# MinJobAge, 300 s by default).
states="$(scontrol -o show job "$job" | sed -n 's/.*ArrayTaskId=\([0-9]*\) .*JobState=\([A-Z_]*\) .*ExitCode=\([0-9:]*\).*/\1 \2 \3/p' | sort)"
echo "slurm-grid: tasks (id state exit): $(echo "$states" | tr '\n' ';')" >&2
[ "$(echo "$states" | grep -c ' COMPLETED 0:0$')" -eq "$shards" ] \
  || fail "not every array task completed with exit 0: $states"
slurm_s=$(( $(date +%s) - t0 ))
job=""

# Each task ran its own shard into its own database, on this scheduler.
for i in $(seq 0 $((shards - 1))); do
  [ -s "$tmp/shards/shard-$i.sqlite" ] || fail "task $i wrote no $tmp/shards/shard-$i.sqlite"
  grep -q "shard $i/$shards of" "$tmp"/out/task-*_"$i".out || fail "task $i's log does not show shard $i/$shards"
done

"$kvb" merge "$tmp/merged.sqlite" "$tmp"/shards/shard-*.sqlite >&2

# --- the same grid run locally, in one process ----------------------------------------------------
t1=$(date +%s)
"$kvb" grid -c "$grid" --db "$tmp/local.sqlite" --cache-dir "$tmp/local-cache" --progress none >&2
local_s=$(( $(date +%s) - t1 ))

# --- equal: config hashes, and per-sample outputs -------------------------------------------------
python3 - "$tmp/merged.sqlite" "$tmp/local.sqlite" "$cells" "$shards" "$tmp/shards" <<'PY'
import sqlite3, sys
merged, local, cells, shards, shard_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def hashes(path):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = db.execute("SELECT config_hash, status FROM runs").fetchall()
    bad = [r for r in rows if r[1] != "done"]
    if bad:
        sys.exit(f"slurm-grid: FAIL: {path} holds runs that are not done: {bad}")
    return [r[0] for r in rows]
m, l = hashes(merged), hashes(local)
if len(m) != cells or len(set(m)) != cells:
    sys.exit(f"slurm-grid: FAIL: the merged database holds {len(m)} runs ({len(set(m))} distinct), expected {cells}")
if set(m) != set(l):
    sys.exit(f"slurm-grid: FAIL: config hashes differ: only merged {sorted(set(m) - set(l))}, only local {sorted(set(l) - set(m))}")
# The shards split the cells: disjoint, every one of them non-empty.
per_shard = [set(hashes(f"{shard_dir}/shard-{i}.sqlite")) for i in range(shards)]
if sum(len(s) for s in per_shard) != cells or set().union(*per_shard) != set(m) or not all(per_shard):
    sys.exit(f"slurm-grid: FAIL: the shards do not partition the cells: {[len(s) for s in per_shard]}")
print(f"slurm-grid: {cells} config hashes equal; shards held {[len(s) for s in per_shard]} runs", file=sys.stderr)
PY
python3 "$repo/scripts/same-outputs.py" "$tmp/merged.sqlite" "$tmp/local.sqlite" >&2 \
  || fail "the merged shards' per-sample outputs differ from the local run's"
echo "slurm-grid: PASS ($cells cells in $shards Slurm array tasks: ${slurm_s} s; local run: ${local_s} s)" >&2
