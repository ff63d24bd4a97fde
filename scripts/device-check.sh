#!/usr/bin/env bash
# scripts/device-check.sh: the one command for a GPU machine (docs/DESIGN.md §10).
# Run from anywhere; it works in the repository root. On a fresh H200 it
#   1. records the machine (nvidia-smi clocks/temperature before and after, nvcc, torch, compilers);
#   2. builds the torch-free CUDA kernels, tests and micro-benchmarks as the standalone project
#      kernels/cuda (needs only nvcc, a C++ compiler and GoogleTest: the package, /usr/src/googletest or
#      .devdeps/googletest), and, in the background, the whole project against the LibTorch inside the
#      machine's PyTorch (CMAKE_PREFIX_PATH from torch.utils.cmake_prefix_path, -DKVB_WITH_CUDA=ON, sm_90);
#   3. runs the CUDA tests (kvb_cuda_tests: every kernel against its oracle, and vAttention's virtual
#      memory arena: pages committed with cuMemCreate/cuMemMap as the driver reports them, the decode
#      kernel reading contiguous per-sequence slots; CudaVirtualArena.*);
#   4. runs the kernel micro-benchmarks (kvb_cuda_bench: achieved GB/s with the same-process D2D copy as
#      the ceiling) and torch's scaled_dot_product_attention on contiguous KV of the same shapes;
#   5. runs `kvbench run` with the perf protocol on synthetic llama-3-8b shapes (2 layers) in bf16 on
#      CUDA: full vs kivi (4 and 2 bits) vs a 25%-budget eviction method, as the budget allows;
#      then (5d) `kvbench reproduce --all --scale gpu-only`: the GPU-size cells of the paper claims;
#   6. prints a short table last and writes it under $OUT (default build-device-check/out):
#      summary.md, device-check.json, device-check.log, raw-json.tar (kernel_bench.json, sdpa.json,
#      e2e.json, cuda_tests.json, adapter_tests.json: `tar -xf raw-json.tar` and
#      DEVICE_CHECK_TABLE_ONLY tabulate them again), reproduce-gpu.tar with 5d and testbed-gpu.tar
#      with 5b: 6 files at most, within the 8 the device tool returns.
# Every stage has a timeout; a failing or missing part is skipped and said so, the rest goes on. The
# whole run is sized for 8 minutes on an H200 (DEVICE_CHECK_BUDGET_S, default 450 s).
#
# Environment:
#   OUT                     where results go (the device tool sets it)
#   DEVICE_CHECK_DRY=1      print the plan and exercise the table code on made-up numbers; no GPU needed
#   DEVICE_CHECK_E2E_CPU=KVBENCH  (with DRY) run each end-to-end config, shrunk, on the CPU through KVBENCH
#   DEVICE_CHECK_TABLE_ONLY=DIR  only tabulate DIR's kernel_bench.json, sdpa.json, e2e.json,
#                           cuda_tests.json (CI runs it on the emulator's smoke benchmark)
#   DEVICE_CHECK_BUDGET_S   total seconds (default 450)
#   DEVICE_CHECK_QUICK=1    the short benchmark plan (2 shapes) and the smallest end-to-end grid
#   DEVICE_CHECK_SKIP_FULL=1  skip the LibTorch build and the end-to-end runs
#   DEVICE_CHECK_REPRODUCE_S=N  seconds for the GPU-size reproduce claims (5d; default 120, 0: off)
#   DEVICE_CHECK_TRAIN_S=N  also train the testbed (configs/models/kvb-testbed-gpu.json, bf16 on CUDA)
#                           for N seconds after the end-to-end runs (5b; default 0: off) and return
#                           the exported model + log as testbed-gpu.tar (corpora from .devdeps/data)
#
# Dependencies the full build needs beyond torch and nvcc (nlohmann_json, CLI11, SQLite3 headers,
# GoogleTest) are looked for on the machine, then in .devdeps/ (carried with the working tree:
# `scripts/device-check.sh --prepare-deps` fills it on a Debian dev machine; name it in the device
# tool's `carry`). Nothing is downloaded: the GPU machine reaches no network.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD

# ---- --prepare-deps: copy header-only dependencies and GoogleTest's sources into .devdeps ----
if [ "${1:-}" = "--prepare-deps" ]; then
  D=$ROOT/.devdeps
  mkdir -p "$D/include" "$D/share/cmake"
  # zstd and zlib headers too: the GPU image has their runtime libraries (found with ldconfig at
  # build time) but may lack the -dev packages.
  for inc in nlohmann CLI sqlite3.h sqlite3ext.h zstd.h zstd_errors.h zdict.h zlib.h zconf.h; do
    [ -e "/usr/include/$inc" ] && cp -r "/usr/include/$inc" "$D/include/"
  done
  for pkg in nlohmann_json CLI11; do
    [ -d "/usr/share/cmake/$pkg" ] && cp -r "/usr/share/cmake/$pkg" "$D/share/cmake/"
  done
  [ -d /usr/src/googletest ] && rm -rf "$D/googletest" && cp -r /usr/src/googletest "$D/googletest"
  # The corpora the testbed recipe trains on (stage 5b): the device machine has no ../shared.
  SRC_DATA=${KVBENCH_DATA:-$ROOT/../shared/data}
  for c in gutenberg-long tinyshakespeare; do
    [ -d "$SRC_DATA/$c" ] && mkdir -p "$D/data" && rm -rf "$D/data/$c" && cp -r "$SRC_DATA/$c" "$D/data/$c"
  done
  du -sh "$D"
  echo "prepared $D; keep it out of git (e.g. add '/.devdeps/' to .git/info/exclude) and name .devdeps in carry"
  exit 0
fi

T0=$(date +%s)
BUDGET=${DEVICE_CHECK_BUDGET_S:-450}
DRY=${DEVICE_CHECK_DRY:-0}
QUICK=${DEVICE_CHECK_QUICK:-0}
SKIP_FULL=${DEVICE_CHECK_SKIP_FULL:-0}
OUTDIR=${OUT:-$ROOT/build-device-check/out}
WORK=${DEVICE_CHECK_WORK:-/tmp/kvb-device-check}
BUILD_CUDA=$ROOT/build-device-cuda   # standalone kernels/cuda project
BUILD_FULL=$ROOT/build-device        # the whole project on CUDA LibTorch
JOBS=$(nproc 2>/dev/null || echo 4)
LOG=$OUTDIR/device-check.log
mkdir -p "$OUTDIR" "$WORK"
: >"$LOG"
STAGES_FILE=$WORK/stages.tsv
: >"$STAGES_FILE"

now() { echo $(($(date +%s) - T0)); }
left() { echo $((BUDGET - $(now))); }
say() { printf '[device-check %3ss] %s\n' "$(now)" "$*" | tee -a "$LOG" >&2; }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$STAGES_FILE"; }

# The table of stage 6 (also DEVICE_CHECK_TABLE_ONLY=DIR: tabulate DIR's JSON files and stop).
write_table_py() {
cat >"$WORK/table.py" <<'PY'
# Reads kernel_bench.json, sdpa.json, e2e.json and the stage list; writes summary.md and
# device-check.json; prints the summary.
import json, os, sys
outdir, stages_file, dry = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
def load(name):
    p = os.path.join(outdir, name)
    try:
        return json.load(open(p))
    except Exception:
        return None
kb, sd, e2e, tests = load("kernel_bench.json"), load("sdpa.json"), load("e2e.json") or [], load("cuda_tests.json")
stages = [l.rstrip("\n").split("\t") for l in open(stages_file)] if os.path.exists(stages_file) else []
L = []
if dry:
    L.append("**DRY RUN: made-up numbers that only exercise this table's code.**\n")
L.append("## Stages\n")
L.append("| stage | status | s | detail |\n|---|---|---|---|")
for s in stages:
    L.append("| " + " | ".join((s + ["", "", "", ""])[:4]) + " |")
if tests:
    cases = [c for ts in tests.get("testsuites", []) for c in ts.get("testsuite", [])]
    skipped = sum(1 for c in cases if c.get("result") == "SKIPPED")
    failed = [c.get("classname", "") + "." + c.get("name", "") for c in cases if c.get("failures")]
    L.append(f"\nCUDA tests: {tests.get('tests', '?')} in all, {skipped} skipped, {tests.get('failures', '?')} failed"
             + (f" ({', '.join(failed)})" if failed else "")
             + f", {tests.get('disabled', 0)} disabled (kvb_cuda_tests, every kernel against its oracle"
             + ("; skipped = no CUDA device" if skipped else "") + ").")
if kb:
    copy = kb["copy_gbps"]
    L.append(f"\n## Kernels ({kb['device']['name']}, {kb['device']['sms']} SMs): llama-3-8b attention "
             f"(32 q / 8 kv heads, head_dim 128); D2D copy ceiling {copy:.0f} GB/s "
             f"(end of run: {kb.get('copy_gbps_end', 0):.0f}), read + write bytes, same process\n")
    sdpa = {}
    for c in (sd or {}).get("cases", []):
        if "median_us" in c:
            sdpa[(c["dtype"], c["batch"], c["context"])] = c["median_us"]
    base = {(c["batch"], c["context"]): c["median_us"] for c in kb["cases"] if c["kernel"] == "paged_fp16" and c["median_us"] > 0}
    L.append("| kernel | batch | context | splits | median us (p10-p90) | GB/s | % of copy | fp16-equiv GB/s | x our fp16 | x SDPA |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for c in kb["cases"]:
        t = c["median_us"]
        if t <= 0:
            L.append(f"| {c['kernel']} | {c['batch']} | {c['context']} | - | {c.get('note', 'no result')} | | | | | |")
            continue
        gbps, eq = c["bytes"] / t / 1e3, c["fp16_bytes"] / t / 1e3
        b = base.get((c["batch"], c["context"]))
        dt = "bfloat16" if "bf16" in c["kernel"] else "float16"
        s = sdpa.get((dt, c["batch"], c["context"]))
        flag = "" if c.get("finite", True) else " NON-FINITE"
        L.append(f"| {c['kernel']}{flag} | {c['batch']} | {c['context']} | {c['splits']} | {t:.1f} ({c['p10_us']:.1f}-{c['p90_us']:.1f}) | "
                 f"{gbps:.0f} | {100 * gbps / copy:.0f}% | {eq:.0f} | {b / t if b else float('nan'):.2f} | "
                 f"{s / t if s else float('nan'):.2f} |")
    L.append("\nGB/s: actual bytes (K/V payload incl. scales/mins/residual, page tables and index lists, q/o, "
             "split workspace) / median time. fp16-equiv: fp16 K/V bytes of the full context / time. "
             "x SDPA: torch scaled_dot_product_attention (dense, same dtype for paged_*, fp16 otherwise) on "
             "contiguous KV of the full context.")
    # The kernel targets.
    L.append("\nTargets:")
    for c in kb["cases"]:
        if c["median_us"] <= 0 or c["context"] < 32768 or c["batch"] < 16:
            continue
        t = c["median_us"]
        if c["kernel"] in ("paged_fp16", "paged_bf16", "paged_fp16_tc", "paged_bf16_tc"):
            frac = c["bytes"] / t / 1e3 / copy
            s = sdpa.get(("bfloat16" if "bf16" in c["kernel"] else "float16", c["batch"], c["context"]))
            L.append(f"- {c['kernel']} b{c['batch']} ctx{c['context']}: {100 * frac:.0f}% of copy (target >= 80%): "
                     f"{'MET' if frac >= 0.8 else 'MISSED'}; vs SDPA {s / t if s else float('nan'):.2f}x (target >= 1): "
                     f"{'MET' if s and s / t >= 1 else 'MISSED' if s else 'n/a'}")
        for k, want in (("kivi4", 1.6), ("kivi2", 2.5)):
            if c["kernel"].startswith(k):
                b = base.get((c["batch"], c["context"]))
                if b:
                    L.append(f"- {c['kernel']} b{c['batch']} ctx{c['context']}: {b / t:.2f}x our fp16 kernel (target >= {want}): "
                             f"{'MET' if b / t >= want else 'MISSED'}")
if sd:
    L.append(f"\ntorch {sd.get('torch')}: D2D copy through torch {sd.get('torch_copy_gbps', 0):.0f} GB/s; "
             + ", ".join(f"{c['dtype']} b{c['batch']} ctx{c['context']}: " + (f"{c['median_us']:.1f} us [{c['backend']}]" if 'median_us' in c else c.get('error', '?'))
                         for c in sd.get("cases", [])))
if e2e:
    L.append("\n## End to end: `kvbench run`, perf protocol, synthetic:llama-3-8b-2l (llama-3-8b layers, 2 of them), bf16, CUDA\n")
    L.append("Kernels used: `paged` decode steps run the kvb_cuda paged decode kernel above (kernels/torch/paged_decode_torch); "
             "`kivi` runs its kernel store on CUDA (store=auto: kvb_cuda quantize-and-append + fused KIVI decode, "
             "kernels/torch/kivi_torch); "
             "`paged` with decode_kernel=false and `full` run LibTorch ops (attention through ATen), as does every prefill. "
             "Methods whose stores are CPU-only say so in their error.\n")
    L.append("| method | params | batch | context | decode tok/s | TPOT ms (p50) | prefill tok/s | KV bytes (physical) | status |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for r in e2e:
        m = ((r.get("result") or {}).get("metrics") or {})
        bs = [b for b in str(r["batch_sizes"]).split(",") if b]
        if not m:
            L.append(f"| {r['method']} | {json.dumps(r['params'])} | {r['batch_sizes']} | {r['context']} | | | | | {r['status']}: {r.get('error', '')[:120]} |")
            continue
        for b in bs:
            g = lambda k: m.get(f"{k}_b{b}", float("nan"))
            L.append(f"| {r['method']} | {json.dumps(r['params'])} | {b} | {r['context']} | {g('decode_tok_s'):.1f} | "
                     f"{g('tpot_ms'):.2f} | {g('prefill_tok_s'):.0f} | {m.get('physical_bytes', float('nan')):.3g} | {r['status']} |")
text = "\n".join(L) + "\n"
open(os.path.join(outdir, "summary.md"), "w").write(text)
json.dump({"stages": stages, "kernel_bench": kb, "sdpa": sd, "e2e": e2e,
           "cuda_tests": {k: tests.get(k) for k in ("tests", "failures", "disabled", "errors", "time")} if tests else None},
          open(os.path.join(outdir, "device-check.json"), "w"), indent=1)
print(text)
PY
}
if [ -n "${DEVICE_CHECK_TABLE_ONLY:-}" ]; then
  write_table_py
  python3 "$WORK/table.py" "$DEVICE_CHECK_TABLE_ONLY" "$STAGES_FILE" 0
  exit $?
fi

# run_stage NAME TIMEOUT LOGFILE CMD...: runs CMD under a timeout (clipped to what is left of the
# budget minus `reserve`), records the outcome, shows the log's tail on failure.
reserve=0
run_stage() {
  local name=$1 to=$2 logf=$3
  shift 3
  local avail=$(($(left) - reserve))
  ((to > avail)) && to=$avail
  if ((to < 5)); then
    say "SKIP $name: out of time"
    record "$name" skipped 0 "out of time"
    return 1
  fi
  say "$name (timeout ${to}s): $*"
  if [ "$DRY" = 1 ]; then
    record "$name" dry 0 ""
    return 0
  fi
  local s rc d
  s=$(date +%s)
  timeout --kill-after=10 "$to" "$@" >"$logf" 2>&1
  rc=$?
  d=$(($(date +%s) - s))
  if [ $rc = 0 ]; then
    say "$name: ok in ${d}s"
    record "$name" ok "$d" ""
  else
    local why="exit $rc"
    [ $rc = 124 ] && why="timed out after ${to}s"
    say "$name: FAILED ($why) in ${d}s; last lines of $logf:"
    tail -n 25 "$logf" | sed 's/^/    /' | tee -a "$LOG" >&2
    record "$name" failed "$d" "$why"
  fi
  return $rc
}

gpu_state() {  # one line: clocks and temperature (never changes any setting)
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu \
    --format=csv,noheader 2>/dev/null || echo "nvidia-smi unavailable"
}

# ---- 1. the machine ----
say "kvbench device check: budget ${BUDGET}s, ${JOBS} CPUs, out $OUTDIR$([ "$DRY" = 1 ] && echo ', DRY RUN')"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') (working tree as sent)"
  echo "gpu before: $(gpu_state)"
  echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null || echo '?')"
  echo "nvcc: $( (command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | tail -1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1)  ninja: $(ninja --version 2>/dev/null)"
  echo "c++: $(c++ --version 2>/dev/null | head -1)"
  echo "python3: $(python3 --version 2>&1)"
} | tee -a "$LOG" >&2
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

TORCH_CMAKE=""
if [ "$DRY" = 1 ]; then
  TORCH_CMAKE='<torch.utils.cmake_prefix_path>'
else
  TORCH_CMAKE=$(timeout 60 python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
  say "torch: $(timeout 60 python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' 2>&1 | tail -1)"
fi
[ -z "$TORCH_CMAKE" ] && say "LibTorch: not found through python3 (the full build and end-to-end runs will be skipped)"

# ---- 2. dependencies ----
GTEST_FLAGS=()
if ! ls /usr/lib/*/cmake/GTest/GTestConfig.cmake /usr/lib/cmake/GTest/GTestConfig.cmake /usr/local/lib/cmake/GTest/GTestConfig.cmake >/dev/null 2>&1; then
  for src in /usr/src/googletest "$ROOT/.devdeps/googletest"; do
    if [ -f "$src/CMakeLists.txt" ]; then
      GTEST_FLAGS=(-DKVB_GTEST_SOURCE_DIR="$src")
      say "GoogleTest: building from $src"
      break
    fi
  done
  [ ${#GTEST_FLAGS[@]} = 0 ] && say "GoogleTest: not found (no package, no /usr/src/googletest, no .devdeps/googletest): CUDA tests cannot be built"
fi
DEP_FLAGS=()
PREFIXES="$TORCH_CMAKE"
# LibTorch's own libraries, named: TorchConfig's find_library looks in the system paths first, so a
# system LibTorch (Debian's 1.13 on the dev machines) would shadow the wheel's (scripts/torch-wheel-check.sh).
TORCH_LIB_DIR=$(dirname "$(dirname "$TORCH_CMAKE")")/lib  # torch/share/cmake -> torch/lib
if [ -f "$TORCH_LIB_DIR/libtorch.so" ] && [ -f "$TORCH_LIB_DIR/libc10.so" ]; then
  DEP_FLAGS+=(-DTORCH_LIBRARY="$TORCH_LIB_DIR/libtorch.so" -Dc10_LIBRARY="$TORCH_LIB_DIR/libc10.so")
fi
if [ -d "$ROOT/.devdeps/share/cmake" ]; then
  PREFIXES="$PREFIXES;$ROOT/.devdeps"
  [ -d "$ROOT/.devdeps/share/cmake/nlohmann_json" ] && DEP_FLAGS+=(-Dnlohmann_json_DIR="$ROOT/.devdeps/share/cmake/nlohmann_json")
  [ -d "$ROOT/.devdeps/share/cmake/CLI11" ] && DEP_FLAGS+=(-DCLI11_DIR="$ROOT/.devdeps/share/cmake/CLI11")
fi
if [ ! -f /usr/include/sqlite3.h ] && [ -f "$ROOT/.devdeps/include/sqlite3.h" ]; then
  SQLITE_LIB=$(ldconfig -p 2>/dev/null | awk '/libsqlite3\.so/ {print $NF; exit}')
  if [ -n "$SQLITE_LIB" ]; then
    DEP_FLAGS+=(-DSQLite3_INCLUDE_DIR="$ROOT/.devdeps/include" -DSQLite3_LIBRARY="$SQLITE_LIB")
  fi
fi

# A header carried in .devdeps + the machine's runtime library (libX.so.N; no dev symlink needed).
use_carried_lib() {  # header, ldconfig pattern, cmake include var, cmake library var
  if [ ! -f "/usr/include/$1" ] && [ -f "$ROOT/.devdeps/include/$1" ]; then
    local lib
    lib=$(ldconfig -p 2>/dev/null | awk -v pat="$2" '$0 ~ pat {print $NF; exit}')
    if [ -n "$lib" ]; then
      DEP_FLAGS+=(-D"$3"="$ROOT/.devdeps/include" -D"$4"="$lib")
    else
      say "$1: carried header but no runtime library matching $2 (the full build may fail)"
    fi
  fi
}
use_carried_lib zstd.h 'libzstd\\.so' KVB_ZSTD_INCLUDE KVB_ZSTD_LIB
use_carried_lib zlib.h 'libz\\.so' ZLIB_INCLUDE_DIR ZLIB_LIBRARY

# ---- 3. the full build, in the background (CPU work; niced so that timings see an idle host) ----
FULL_PID=""
FULL_LOG=$WORK/build_full.log
if [ "$SKIP_FULL" != 1 ] && [ -n "$TORCH_CMAKE" ]; then
  full_build() {
    # Tests on: kvb_tests is built after kvbench (the torch adapters' CUDA test, 5c), GoogleTest from
    # the package or its sources (GTEST_FLAGS).
    cmake -S "$ROOT" -B "$BUILD_FULL" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DKVB_WITH_CUDA=ON \
      -DKVB_CUDA_ARCHS=90 -DKVB_BUILD_TESTS=ON -DKVB_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$PREFIXES" \
      "${DEP_FLAGS[@]}" "${GTEST_FLAGS[@]}" &&
      nice -n 15 cmake --build "$BUILD_FULL" --target kvbench -j "$((JOBS > 4 ? JOBS - 2 : JOBS))" &&
      { echo "KVBENCH_BUILT"; nice -n 15 cmake --build "$BUILD_FULL" --target kvb_tests -j "$((JOBS > 4 ? JOBS - 2 : JOBS))" || true; }
  }
  say "full build (background, log $FULL_LOG): cmake -S . -B build-device -DKVB_WITH_CUDA=ON -DKVB_CUDA_ARCHS=90 -DCMAKE_PREFIX_PATH=$PREFIXES ${DEP_FLAGS[*]} && cmake --build build-device --target kvbench"
  if [ "$DRY" != 1 ]; then
    (timeout --kill-after=10 "$((BUDGET - 60))" bash -c "$(declare -f full_build); $(declare -p ROOT BUILD_FULL GEN PREFIXES DEP_FLAGS GTEST_FLAGS JOBS); full_build" >"$FULL_LOG" 2>&1) &
    FULL_PID=$!
  fi
else
  say "SKIP full build and end-to-end runs ($([ "$SKIP_FULL" = 1 ] && echo DEVICE_CHECK_SKIP_FULL=1 || echo 'no LibTorch'))"
  record full_build skipped 0 "no LibTorch or skipped"
fi

# ---- 4. the CUDA kernels, tests and benchmarks (standalone project) ----
CUDA_JOBS=$((JOBS >= 8 ? 6 : 2))
if run_stage build_cuda 240 "$WORK/build_cuda.log" bash -c \
  "cmake -S '$ROOT/kernels/cuda' -B '$BUILD_CUDA' ${GEN[*]} -DCMAKE_BUILD_TYPE=Release -DKVB_CUDA_ARCHS=90 ${GTEST_FLAGS[*]} && cmake --build '$BUILD_CUDA' -j $CUDA_JOBS"; then
  CUDA_OK=1
else
  CUDA_OK=0
fi
TESTS_BIN=$BUILD_CUDA/tests_cuda/kvb_cuda_tests
BENCH_BIN=$BUILD_CUDA/tests_cuda/kvb_cuda_bench

reserve=150  # keep time for the benchmarks and the end-to-end runs
if [ "$DRY" = 1 ] || { [ "$CUDA_OK" = 1 ] && [ -x "$TESTS_BIN" ]; }; then
  run_stage cuda_tests 150 "$WORK/cuda_tests.log" "$TESTS_BIN" --gtest_output=json:"$OUTDIR/cuda_tests.json"
  [ "$DRY" != 1 ] && grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$WORK/cuda_tests.log" | head -20 | tee -a "$LOG" >&2
else
  say "SKIP cuda_tests: kvb_cuda_tests was not built"
  record cuda_tests skipped 0 "not built"
fi

reserve=100
BENCH_ARGS=(--json="$OUTDIR/kernel_bench.json")
[ "$QUICK" = 1 ] && BENCH_ARGS+=(--quick)
if [ "$DRY" = 1 ]; then
  say "kernel_bench plan:"
  if [ -x "$BENCH_BIN" ]; then "$BENCH_BIN" --list | sed 's/^/    /' >&2; else echo "    (kvb_cuda_bench not built here)" >&2; fi
fi
if [ "$DRY" = 1 ] || { [ "$CUDA_OK" = 1 ] && [ -x "$BENCH_BIN" ]; }; then
  (($(left) < 200)) && [ "$QUICK" != 1 ] && BENCH_ARGS+=(--quick) && say "kernel_bench: short of time, quick plan"
  if [ -n "$FULL_PID" ] && kill -0 "$FULL_PID" 2>/dev/null; then
    say "note: the LibTorch build runs (niced) in the background during the kernel timings; GPU times are"
    say "      event-timed, but launch gaps of microsecond-scale cases can grow with a busy host"
    record note info 0 "LibTorch build running in the background during kernel_bench and sdpa"
  fi
  run_stage kernel_bench 150 "$WORK/kernel_bench.log" "$BENCH_BIN" "${BENCH_ARGS[@]}"
  [ "$DRY" != 1 ] && cat "$WORK/kernel_bench.log" >>"$LOG"
else
  record kernel_bench skipped 0 "not built"
fi

# ---- torch SDPA on contiguous KV of the same shapes ----
cat >"$WORK/sdpa.py" <<'PY'
# torch.nn.functional.scaled_dot_product_attention decode (one query token) over contiguous KV,
# the shapes of kvb_cuda_bench; CUDA events per call, >= 25 ms warm-up, >= 10 samples and 0.3 s, median;
# inputs rotate over enough sets to span 4x L2. Also a D2D copy through torch (read + write bytes).
import json, math, sys, time
import torch
import torch.nn.functional as F

out, quick = sys.argv[1], sys.argv[2] == "1"
shapes = [(1, 4096), (16, 32768)] if quick else [(1, 4096), (1, 32768), (1, 131072), (16, 4096), (16, 32768), (64, 4096), (64, 8192)]
HQ, HKV, D = 32, 8, 128
dev = torch.device("cuda")
props = torch.cuda.get_device_properties(0)
l2 = getattr(props, "L2_cache_size", 60 * 10**6)

def bench(fn, sets):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    i, t0 = 0, time.perf_counter()
    while i < 3 or time.perf_counter() - t0 < 0.025:
        fn(i % sets); torch.cuda.synchronize(); i += 1
    us, total = [], 0.0
    while (len(us) < 10 or total < 0.3) and len(us) < 400:
        s.record(); fn(i % sets); e.record(); e.synchronize(); i += 1
        ms = s.elapsed_time(e); us.append(ms * 1e3); total += ms / 1e3
    us.sort()
    q = lambda p: us[min(len(us) - 1, int(round(p * (len(us) - 1))))]
    return {"median_us": q(0.5), "p10_us": q(0.1), "p90_us": q(0.9), "n": len(us)}

res = {"torch": torch.__version__, "device": props.name, "cases": []}
x = torch.empty(2 << 30, dtype=torch.uint8, device=dev); y = torch.empty_like(x)
r = bench(lambda i: y.copy_(x), 1)
res["torch_copy_gbps"] = 2 * x.numel() / (r["median_us"] * 1e-6) / 1e9
del x, y
for dtype in (torch.float16, torch.bfloat16):
    for (B, L) in shapes:
        set_bytes = 2 * B * L * HKV * D * 2
        sets = max(1, min(8, math.ceil(4 * l2 / set_bytes)))
        case = {"dtype": str(dtype).replace("torch.", ""), "batch": B, "context": L, "sets": sets}
        try:
            data = [(torch.randn(B, HQ, 1, D, device=dev, dtype=dtype), torch.randn(B, HKV, L, D, device=dev, dtype=dtype),
                     torch.randn(B, HKV, L, D, device=dev, dtype=dtype)) for _ in range(sets)]
            try:
                F.scaled_dot_product_attention(*data[0], enable_gqa=True)
                fn = lambda i: F.scaled_dot_product_attention(*data[i], enable_gqa=True)
                case["backend"] = "sdpa(enable_gqa)"
            except (TypeError, RuntimeError):
                data = [(q, k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)) for (q, k, v) in data]
                fn = lambda i: F.scaled_dot_product_attention(*data[i])
                case["backend"] = "sdpa(kv expanded x4)"
            case.update(bench(fn, sets))
            case["bytes"] = set_bytes + 2 * 2 * B * HQ * D
        except Exception as ex:  # out of memory or an unsupported shape: say so, go on
            case["error"] = repr(ex)[:200]
        res["cases"].append(case)
        data = None
        torch.cuda.empty_cache()
        print(json.dumps(case), flush=True)
json.dump(res, open(out, "w"), indent=1)
PY
if [ "$DRY" = 1 ]; then python3 -m py_compile "$WORK/sdpa.py" && say "sdpa.py compiles"; fi
run_stage sdpa 100 "$WORK/sdpa.log" env PYTHONUNBUFFERED=1 python3 "$WORK/sdpa.py" "$OUTDIR/sdpa.json" "$QUICK"

# ---- 5. end to end: kvbench run, perf protocol, synthetic llama-3-8b (2 layers) in bf16 on CUDA ----
reserve=25  # the table
E2E_JSON=$OUTDIR/e2e.json
echo "[]" >"$E2E_JSON"
KVBENCH=$BUILD_FULL/kvbench
if [ -n "$FULL_PID" ]; then
  # kvbench first; kvb_tests goes on building in the background (5c waits for it).
  say "waiting for the full build of kvbench (up to $(($(left) - 90))s)"
  while kill -0 "$FULL_PID" 2>/dev/null && ! grep -q '^KVBENCH_BUILT' "$FULL_LOG" && (($(left) > 90)); do sleep 2; done
  if grep -q '^KVBENCH_BUILT' "$FULL_LOG" && [ -x "$KVBENCH" ]; then
    say "full build: kvbench ok (kvb_tests still building in the background)"
    record full_build ok "$(now)" ""
  elif kill -0 "$FULL_PID" 2>/dev/null; then
    kill -- "$FULL_PID" 2>/dev/null
    say "full build: not done in time; end-to-end runs skipped"
    record full_build failed "$(now)" "not done in time"
  else
    say "full build: FAILED; last lines of $FULL_LOG:"
    tail -n 25 "$FULL_LOG" | sed 's/^/    /' | tee -a "$LOG" >&2
    record full_build failed "$(now)" "see log"
  fi
fi
# Grid: (method, params, batch sizes, context), cheapest first; each run has its own timeout and
# runs only while the budget lasts (the 32K cells of the compressed methods come last).
E2E_GRID=(
  "full|{}|1,16,64|4096"
  "paged|{}|1,16,64|4096"
  "paged|{\"decode_kernel\":false}|1,16,64|4096"
  "paged|{\"cuda_decode\":\"tensor_cores\"}|1,16,64|4096"
  "kivi|{\"preset\":\"kivi-4\"}|1,16|4096"
  "kivi|{\"preset\":\"kivi-2\"}|1,16|4096"
  "kivi|{\"preset\":\"kivi-2\",\"cuda_decode\":\"tensor_cores\"}|1,16|4096"
  "EVICT|{\"budget\":0.25,\"budget_unit\":\"ratio\"}|1,16|4096"
  "full|{}|1|32768"
  "full|{}|1|131072"
  "kivi|{\"preset\":\"kivi-2\"}|1,16|32768"
  "kivi|{\"preset\":\"kivi-2\",\"cuda_decode\":\"tensor_cores\"}|1,16|32768"
  "EVICT|{\"budget\":0.25,\"budget_unit\":\"ratio\"}|1,16|32768"
)
[ "$QUICK" = 1 ] && E2E_GRID=("${E2E_GRID[@]:0:4}")
# DEVICE_CHECK_E2E_CPU=KVBENCH (dry runs; CI sets it): each cell's config, shrunk (synthetic:tiny, fp32,
# 64-token context, 2 decode tokens) and on the CPU, through that kvbench, so that a renamed method
# or parameter fails here and not on device time. A cell whose parameters ask for a CUDA-only kernel
# must be refused as such (not as an unknown parameter); anything else must run.
E2E_CPU_BAD=0
rm -f "$WORK/e2e_cpu.sqlite"  # every config runs afresh (a finished run would be skipped)
e2e_config_on_cpu() {  # config, label, params
  local cpu_cfg=$WORK/e2e_cpu.json out rc
  python3 - "$1" "$cpu_cfg" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update({"model": "synthetic:tiny", "device": "cpu", "dtype": "fp32"})
c["protocol"].update({"context": 64, "decode_tokens": 2, "prefill_chunk": 32})
json.dump(c, open(sys.argv[2], "w"))
PY
  out=$("$DEVICE_CHECK_E2E_CPU" run -q --config "$cpu_cfg" --db "$WORK/e2e_cpu.sqlite" 2>&1)
  rc=$?
  if [ $rc = 0 ]; then
    say "  config ok on the CPU: $2"
  elif [[ $3 == *tensor_cores* ]] && [ $rc = 2 ] && grep -q "cuda_decode=tensor_cores: chooses the CUDA" <<<"$out"; then
    say "  config refused on the CPU as CUDA-only, as it should be: $2"
  else
    E2E_CPU_BAD=$((E2E_CPU_BAD + 1))
    say "  CONFIG FAILS on the CPU (rc $rc): $2: $(tail -n 1 <<<"$out")"
  fi
}
if [ "$DRY" = 1 ] || [ -x "$KVBENCH" ]; then
  EVICT=snapkv
  if [ "$DRY" != 1 ]; then
    methods=$("$KVBENCH" methods 2>/dev/null | awk '{print $1}')
    EVICT=""
    for m in snapkv h2o tova streaming_llm; do
      if grep -qx "$m" <<<"$methods"; then EVICT=$m; break; fi
    done
  fi
  for cell in "${E2E_GRID[@]}"; do
    IFS='|' read -r method params batches ctx <<<"$cell"
    [ "$method" = EVICT ] && method=$EVICT
    [ -z "$method" ] && continue
    label="$method $params b=$batches ctx=$ctx"
    cfg=$WORK/e2e_$(echo "$label" | tr -c 'a-zA-Z0-9' '_').json
    cat >"$cfg" <<EOF
{"model": "synthetic:llama-3-8b-2l", "device": "cuda", "dtype": "bf16", "seed": 1,
 "method": {"name": "$method", "params": $params},
 "protocol": {"name": "perf", "context": $ctx, "decode_tokens": 32, "batch_sizes": "$batches", "repeats": 1,
              "prefill_chunk": 512},
 "label": "device-check"}
EOF
    rlog=$WORK/e2e_run.log
    if run_stage "e2e $label" 120 "$rlog" "$KVBENCH" run -q --config "$cfg" --db "$WORK/e2e.sqlite"; then status=ok; else status=failed; fi
    if [ "$DRY" = 1 ]; then
      [ -n "${DEVICE_CHECK_E2E_CPU:-}" ] && e2e_config_on_cpu "$cfg" "$label" "$params"
      continue
    fi
    python3 - "$E2E_JSON" "$rlog" "$method" "$params" "$batches" "$ctx" "$status" <<'PY'
import json, sys
path, rlog, method, params, batches, ctx, status = sys.argv[1:8]
runs = json.load(open(path))
text = open(rlog, errors="replace").read()
entry = {"method": method, "params": json.loads(params), "batch_sizes": batches, "context": int(ctx), "status": status}
# kvbench prints one JSON object (dump(2): a line holding only "{" opens it); logs go around it.
lines = text.splitlines()
starts = [i for i, l in enumerate(lines) if l == "{"]
entry["result"] = None
for i in reversed(starts):
    try:
        entry["result"] = json.loads("\n".join(lines[i:]))
        break
    except Exception:
        ends = [j for j in range(i, len(lines)) if lines[j] == "}"]
        try:
            entry["result"] = json.loads("\n".join(lines[i:ends[0] + 1])) if ends else None
            break
        except Exception:
            pass
if entry["result"] is None:
    entry["error"] = text.strip().splitlines()[-1][:300] if text.strip() else "no output"
runs.append(entry)
json.dump(runs, open(path, "w"), indent=1)
PY
  done
else
  say "SKIP end-to-end runs: no kvbench binary"
  record e2e skipped 0 "no kvbench"
fi
# ---- 5c. the LibTorch adapters and the KIVI kernel store on CUDA: kvb_tests' PagedDecodeTorch.*,
#      KiviKernel.Cuda* and KiviKernel.Decode*, and the vattention store over CUDA virtual memory
#      (VAttentionCuda.*) (synthetic inputs, no model) ----
if [ -n "$FULL_PID" ] && [ "$DRY" != 1 ]; then
  while kill -0 "$FULL_PID" 2>/dev/null && (($(left) > 60)); do sleep 2; done
  if [ -x "$BUILD_FULL/tests/kvb_tests" ]; then
    run_stage "torch adapter tests" 60 "$WORK/adapter_tests.log" "$BUILD_FULL/tests/kvb_tests" \
      --gtest_filter='PagedDecodeTorch.*:KiviKernel.Cuda*:KiviKernel.Decode*:VAttentionCuda.*' --gtest_output=json:"$OUTDIR/adapter_tests.json"
  else
    say "SKIP torch adapter tests: kvb_tests not built in time (see $FULL_LOG)"
    record "torch adapter tests" skipped "$(now)" "kvb_tests not built"
  fi
fi
# ---- 5d. the GPU-size claims of `kvbench reproduce` (--scale gpu-only: the CPU-size cells are the
#      CPU machine's; configs/reproduce/*.json with "scale": "gpu"), while the budget lasts. Their
#      models and corpora are looked up in .devdeps/models and .devdeps/data (carried), then as
#      kvbench does. A GPU-size claim names a model that travels with the working tree (the tracked
#      models/kvb-testbed, 15 MB) or one in .devdeps/models: the device tool carries 64 MiB in all,
#      so a 98 MB GGUF such as SmolLM2-135M's cannot go. The stage checks this before it runs (and
#      the dry run fails on it), naming the claim and the model. The database and the pages come
#      back as reproduce-gpu.tar, to be merged into results/reproduce.sqlite with `kvbench merge`
#      and evaluated with `kvbench reproduce --all --scale gpu --evaluate-only` ----
REPRO_S=${DEVICE_CHECK_REPRODUCE_S:-120}
RDIR=$WORK/reproduce
REPRO_ARGS=(reproduce --all --scale gpu-only --db "$RDIR/reproduce-gpu.sqlite" --out-dir "$RDIR/pages")
[ -d "$ROOT/.devdeps/models" ] && REPRO_ARGS+=(--models-dir "$ROOT/.devdeps/models")
[ -d "$ROOT/.devdeps/data" ] && REPRO_ARGS+=(--data-dir "$ROOT/.devdeps/data")
# gpu_claims_carried: every model a GPU-size claim names is in the working tree (git-tracked under
# models/, or a synthetic: preset) or in .devdeps/models, and what the device tool carries (tracked
# files, untracked files git does not ignore, .devdeps) is within its 64 MiB. Prints one line per
# problem; exits 1 when there is one.
gpu_claims_carried() {
  python3 - "$ROOT" <<'PY'
import glob, json, os, subprocess, sys
root = sys.argv[1]
def git_files(*args):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z", *args], capture_output=True, check=True).stdout
    return [f for f in out.decode().split("\0") if f]
bad = []
try:
    tracked = set(git_files())
    carried = tracked | set(git_files("--others", "--exclude-standard"))
except (OSError, subprocess.CalledProcessError):
    # No git checkout (the copy on the GPU machine may have none): what is here was carried, so
    # only whether each model is here can be checked.
    tracked = None
def file_size(path):
    # A file listed a moment ago may be gone (another process's scratch file in the tree): 0.
    try:
        return os.path.getsize(path) if os.path.isfile(path) else 0
    except OSError:
        return 0
if tracked is not None:
    size = sum(file_size(os.path.join(root, f)) for f in carried)
    for dirpath, _, files in os.walk(os.path.join(root, ".devdeps")):
        size += sum(file_size(os.path.join(dirpath, f)) for f in files)
    if size > 64 << 20:
        bad.append(f"the working tree the device tool carries is {size / 2**20:.1f} MiB, over its 64 MiB")
def grid_models(name):
    g = json.load(open(os.path.join(root, "configs/grids", name + ".json")))
    ms = [g.get("base", {}).get("model")] + list(g.get("axes", {}).get("model", []))
    return [m if isinstance(m, str) else m.get("name") for m in ms if m]
def found(model):
    if model.startswith("synthetic:"):
        return True
    for d in (os.path.join("models", model), model):
        if tracked is None and os.path.exists(os.path.join(root, d)):
            return True
        if tracked is not None and any(f == d or f.startswith(d.rstrip("/") + "/") for f in tracked):
            return True
    return os.path.exists(os.path.join(root, ".devdeps/models", model))
n = 0
for path in sorted(glob.glob(os.path.join(root, "configs/reproduce/*.json"))):
    for c in json.load(open(path)).get("claims", []):
        if c.get("scale") != "gpu" or c.get("not_runnable"):
            continue
        n += 1
        for side in ("a", "b"):
            cell = c.get(side)
            if not cell:
                continue
            models = [cell["config"].get("model", "")] if "config" in cell else grid_models(cell["grid"])
            for m in models:
                if not found(m):
                    bad.append(f"{os.path.basename(path)} claim {c['id']} ({side}): model '{m}' is neither "
                               "tracked under models/ nor in .devdeps/models, so it does not reach the device")
for b in bad:
    print(b)
print(f"{n} GPU-size claim(s)" + (f"; {size / 2**20:.1f} MiB carried" if tracked is not None else "; no git checkout here"))
sys.exit(1 if bad else 0)
PY
}
if ((REPRO_S > 0)) && { [ -x "$KVBENCH" ] || [ "$DRY" = 1 ]; }; then
  mkdir -p "$RDIR"
  if carried_out=$(gpu_claims_carried 2>&1); then
    say "reproduce: every GPU-size claim's model is carried ($(tail -n 1 <<<"$carried_out"))"
  else
    say "reproduce: NOT CARRIED:"
    sed 's/^/    /' <<<"$carried_out" | tee -a "$LOG" >&2
    [ "$DRY" = 1 ] && E2E_CPU_BAD=$((E2E_CPU_BAD + 1))
  fi
  run_stage "reproduce gpu claims" "$REPRO_S" "$WORK/reproduce.log" "$KVBENCH" "${REPRO_ARGS[@]}"
  if [ "$DRY" != 1 ] && [ -f "$RDIR/reproduce-gpu.sqlite" ]; then
    grep -E '^[a-z_]+/[^ ]+: ' "$WORK/reproduce.log" | grep -v 'not runnable here' | tee -a "$LOG" >&2
    cp "$WORK/reproduce.log" "$RDIR/reproduce.log"
    tar -C "$RDIR" -cf "$OUTDIR/reproduce-gpu.tar" reproduce-gpu.sqlite pages reproduce.log &&
      say "reproduce: $OUTDIR/reproduce-gpu.tar"
  fi
  # Dry run with a CPU kvbench: the suites load and the gpu-only selection evaluates (no cell runs),
  # so that a suite error shows here and not on device time.
  if [ "$DRY" = 1 ] && [ -n "${DEVICE_CHECK_E2E_CPU:-}" ]; then
    rm -rf "$RDIR/dry" && mkdir -p "$RDIR/dry"
    "$DEVICE_CHECK_E2E_CPU" run -q -c configs/examples/stream_paged.json --set protocol.max_windows=1 \
      --db "$RDIR/dry/empty.sqlite" >/dev/null 2>&1
    if out=$("$DEVICE_CHECK_E2E_CPU" reproduce --all --scale gpu-only --evaluate-only -q \
               --db "$RDIR/dry/empty.sqlite" --out-dir "$RDIR/dry/pages" 2>&1) &&
       gpu_claims=$(grep -E '^[a-z_]+/[^ ]+: ' <<<"$out" | grep -vc 'not runnable here') &&
       ((gpu_claims > 0)); then
      say "  reproduce --scale gpu-only evaluates on the CPU: $gpu_claims GPU-size claim(s), none run"
    else
      E2E_CPU_BAD=$((E2E_CPU_BAD + 1))
      say "  REPRODUCE FAILS on the CPU: $(tail -n 1 <<<"$out")"
    fi
  fi
fi
# ---- 5b. optional: train the testbed on the GPU for DEVICE_CHECK_TRAIN_S seconds ----
TRAIN_S=${DEVICE_CHECK_TRAIN_S:-0}
if ((TRAIN_S > 0)) && { [ -x "$KVBENCH" ] || [ "$DRY" = 1 ]; }; then
  TDIR=$WORK/train
  DATA_ARG=()
  [ -d "$ROOT/.devdeps/data" ] && DATA_ARG=(--data-dir "$ROOT/.devdeps/data")
  # --max-seconds stops at a step boundary with a checkpoint; --export-only then writes the HF
  # directory (TRAINING.md has the curve, held-out loss and induction probe up to that step).
  if run_stage "train testbed" $((TRAIN_S + 90)) "$WORK/train.log" "$KVBENCH" train \
       -c configs/models/kvb-testbed-gpu.json --out "$TDIR" --max-seconds "$TRAIN_S" "${DATA_ARG[@]}" &&
     run_stage "export testbed" 60 "$WORK/export.log" "$KVBENCH" train \
       -c configs/models/kvb-testbed-gpu.json --out "$TDIR" --export-only "${DATA_ARG[@]}"; then
    if [ "$DRY" != 1 ]; then
      tar -C "$TDIR" -cf "$OUTDIR/testbed-gpu.tar" model train_log.jsonl && say "testbed: $OUTDIR/testbed-gpu.tar"
      tail -n 3 "$WORK/train.log" | tee -a "$LOG" >&2
    fi
  fi
fi
echo "gpu after: $(gpu_state)" | tee -a "$LOG" >&2

# ---- 6. the table ----
write_table_py
# pack_returned DIR: the raw JSON files in one tar, so that what comes back stays within the device
# tool's 8 files; fails (naming the files) when DIR still holds more than 8.
pack_returned() {
  local dir=$1 raw=() f n
  for f in kernel_bench.json sdpa.json e2e.json cuda_tests.json adapter_tests.json; do
    [ -f "$dir/$f" ] && raw+=("$f")
  done
  if ((${#raw[@]} > 0)); then
    tar -C "$dir" -cf "$dir/raw-json.tar" "${raw[@]}" && (cd "$dir" && rm -f "${raw[@]}")
  fi
  n=$(find "$dir" -type f | wc -l)
  if ((n > 8)); then
    say "OUT holds $n files, more than the 8 the device tool returns: $(cd "$dir" && find . -type f | tr '\n' ' ')"
    return 1
  fi
  say "OUT holds $n files (the device tool returns 8)"
}
if [ "$DRY" = 1 ]; then
  # Exercise the table on made-up inputs in a scratch directory (never in $OUT).
  FAKE=$WORK/dry-out
  rm -rf "$FAKE" && mkdir -p "$FAKE"  # a previous dry run's packed files would be counted again
  cat >"$FAKE/kernel_bench.json" <<'EOF'
{"device": {"name": "DRY", "sms": 132, "l2_bytes": 62914560}, "copy_gbps": 4300, "copy_gbps_end": 4290,
 "cases": [
  {"kernel": "paged_fp16", "batch": 16, "context": 32768, "splits": 2, "sets": 1, "median_us": 4400, "p10_us": 4390, "p90_us": 4420, "n": 60, "bytes": 17180000000, "fp16_bytes": 17179869184, "finite": true, "note": ""},
  {"kernel": "kivi4_fp16res", "batch": 16, "context": 32768, "splits": 2, "sets": 1, "median_us": 2500, "p10_us": 2490, "p90_us": 2520, "n": 60, "bytes": 4900000000, "fp16_bytes": 17179869184, "finite": true, "note": ""},
  {"kernel": "kivi2", "batch": 16, "context": 32768, "splits": 2, "sets": 1, "median_us": 0, "p10_us": 0, "p90_us": 0, "n": 0, "bytes": 0, "fp16_bytes": 0, "finite": true, "note": "unsupported: example"}]}
EOF
  echo '{"torch": "dry", "torch_copy_gbps": 4300, "cases": [{"dtype": "float16", "batch": 16, "context": 32768, "median_us": 5000, "p10_us": 1, "p90_us": 1, "n": 1, "backend": "sdpa(enable_gqa)"}]}' >"$FAKE/sdpa.json"
  echo '[{"method": "full", "params": {}, "batch_sizes": "1,16", "context": 4096, "status": "ok", "result": {"metrics": {"decode_tok_s_b1": 50, "tpot_ms_b1": 20, "prefill_tok_s_b1": 9000, "decode_tok_s_b16": 600, "tpot_ms_b16": 26, "prefill_tok_s_b16": 20000, "physical_bytes": 1.2e9}}}, {"method": "kivi", "params": {"preset": "kivi-2"}, "batch_sizes": "1", "context": 4096, "status": "failed", "error": "example: CUDA out of memory"}]' >"$FAKE/e2e.json"
  echo '{"tests": 10, "failures": 0, "disabled": 0}' >"$FAKE/cuda_tests.json"
  python3 "$WORK/table.py" "$FAKE" "$STAGES_FILE" 1
  # What a full run leaves in OUT, every optional stage on: the table's files above plus stand-ins.
  for f in adapter_tests.json device-check.log reproduce-gpu.tar testbed-gpu.tar; do : >"$FAKE/$f"; done
  pack_returned "$FAKE" || E2E_CPU_BAD=$((E2E_CPU_BAD + 1))
  # grep without -q reads the whole listing: -q's early exit would SIGPIPE tar and, under
  # pipefail, fail the check at random.
  if ! tar -tf "$FAKE/raw-json.tar" | grep -x kernel_bench.json >/dev/null; then
    say "raw-json.tar does not hold kernel_bench.json"
    E2E_CPU_BAD=$((E2E_CPU_BAD + 1))
  fi
  if ((E2E_CPU_BAD > 0)); then
    say "dry run FAILED: $E2E_CPU_BAD check(s) failed (see above)"
    exit 1
  fi
  say "dry run done (nothing was built or run; the table above is made up)"
  exit 0
fi
python3 "$WORK/table.py" "$OUTDIR" "$STAGES_FILE" 0 | tee -a "$LOG"
pack_returned "$OUTDIR"
say "done in $(now)s; results in $OUTDIR"
