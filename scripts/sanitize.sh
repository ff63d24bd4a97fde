#!/usr/bin/env bash
# The whole tree under AddressSanitizer + UBSan: configures ./build-sanitize (KVB_SANITIZE=ON, -O1,
# line tables for the reports, no CUDA, no benchmarks), builds every target and runs the test suite
# there. Usage: scripts/sanitize.sh [ctest arguments, default: -LE fuzz]
#   KVB_SANITIZE_BUILD_DIR   build directory (default build-sanitize)
#   KVB_SANITIZE_JOBS        parallel build and test jobs (default: nproc)
#   KVB_SANITIZE_BUDGET_S    stop starting tests after this many seconds of the test run (tests run
#                            in chunks; those not started are counted, and the script exits 0 when
#                            every test that ran passed)
#   KVB_SANITIZE_DEADLINE    a wall-clock deadline (seconds since the epoch): the build is stopped
#                            there (what compiled stays in ccache, so the next run gets further) and
#                            no test chunk starts after it; a build stopped this way exits 3
#   KVB_SANITIZE_SHARD       i/n: run only every n-th test, starting at the i-th (0-based), so n runs
#                            with i = 0..n-1 cover the whole suite (CI picks i from the commit count)
# A finding fails its test with the sanitizer's report in the output; the script exits non-zero.
# tests/sanitize/*.supp hold the suppressions for reports from uninstrumented libraries (LibTorch,
# OpenBLAS), each with its reason. The fuzz label is left out: scripts/fuzz.sh builds its own.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="$PWD"
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
BUILD_DIR="${KVB_SANITIZE_BUILD_DIR:-build-sanitize}"
JOBS="${KVB_SANITIZE_JOBS:-$(nproc)}"
SUPP="$PWD/tests/sanitize"

start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1 -DNDEBUG" -DKVB_SANITIZE=ON -DKVB_BUILD_BENCH=OFF \
  -DKVB_WITH_CUDA=OFF >&2
deadline="${KVB_SANITIZE_DEADLINE:-}"
if [ -n "$deadline" ]; then
  [[ "$deadline" =~ ^[0-9]{1,12}$ ]] ||
    { echo "sanitize: KVB_SANITIZE_DEADLINE must be seconds since the epoch, got '$deadline'" >&2; exit 2; }
  left=$((deadline - $(date +%s))) rc=124
  [ "$left" -le 0 ] || { timeout "$left" cmake --build "$BUILD_DIR" -j "$JOBS" >&2 && rc=0 || rc=$?; }
  if [ "$rc" -eq 124 ]; then
    echo "sanitize: the build did not finish by the deadline; what compiled is in ccache for the next run; no sanitized tests ran" >&2
    exit 3
  fi
  [ "$rc" -eq 0 ] || exit "$rc"
else
  cmake --build "$BUILD_DIR" -j "$JOBS" >&2
fi
built=$(date +%s)

# halt_on_error / abort_on_error: a report fails the test at once. LeakSanitizer runs too; its
# suppressions cover only allocations made inside the uninstrumented libraries' own initialisation.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=0:check_initialization_order=1:suppressions=$SUPP/asan.supp"
export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$SUPP/ubsan.supp"
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-LE fuzz)
# The suite in chunks of tests (ctest -I), so that a time budget stops starting new ones; without a
# budget one chunk holds them all. Each chunk's summary line is summed into the script's own.
total=$(cd "$BUILD_DIR" && ctest -N | sed -n 's/^Total Tests: //p')
shard_i=0 shard_n=1
if [ -n "${KVB_SANITIZE_SHARD:-}" ]; then
  [[ "$KVB_SANITIZE_SHARD" =~ ^([0-9]+)/([1-9][0-9]*)$ ]] && [ "${BASH_REMATCH[1]}" -lt "${BASH_REMATCH[2]}" ] ||
    { echo "sanitize: KVB_SANITIZE_SHARD must be i/n with 0 <= i < n, got '$KVB_SANITIZE_SHARD'" >&2; exit 2; }
  shard_i=${BASH_REMATCH[1]} shard_n=${BASH_REMATCH[2]}
  echo "sanitize: shard $shard_i/$shard_n (one test in $shard_n, from test $((shard_i + 1)))" >&2
fi
chunk=$total
[ -z "${KVB_SANITIZE_BUDGET_S:-}${deadline}" ] || chunk=$((JOBS * 8 * shard_n))
log=$(mktemp)
status=0 ran=0 failed=0 first=1 not_run=0
while [ "$first" -le "$total" ]; do
  if [ -n "${KVB_SANITIZE_BUDGET_S:-}" ] && [ $(( $(date +%s) - built )) -ge "$KVB_SANITIZE_BUDGET_S" ]; then
    not_run=$((total - first + 1))
    echo "sanitize: the ${KVB_SANITIZE_BUDGET_S} s budget is spent: tests $first..$total (of $total, before label filters) not started" >&2
    break
  fi
  if [ -n "$deadline" ] && [ "$(date +%s)" -ge "$deadline" ]; then
    not_run=$((total - first + 1))
    echo "sanitize: the deadline has passed: tests $first..$total (of $total, before label filters) not started" >&2
    break
  fi
  (cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS" "${args[@]}" -I "$((first + shard_i)),$((first + chunk - 1)),$shard_n") \
    > "$log" 2>&1 || status=1
  cat "$log"
  if line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$log"); then
    failed=$((failed + $(echo "$line" | sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/')))
    ran=$((ran + $(echo "$line" | sed -E 's/.* out of ([0-9]+).*/\1/')))
  fi
  first=$((first + chunk))
done
rm -f "$log"
done_at=$(date +%s)
echo "sanitize: build $((built - start)) s, tests $((done_at - built)) s, $ran tests run, $failed failed, $not_run not started, exit $status" >&2
exit $status
