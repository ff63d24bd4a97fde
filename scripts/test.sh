#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test suite (slow ones included).
# Pass ctest arguments to narrow it, e.g. scripts/test.sh -LE slow
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd "${KVB_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" "$@"
