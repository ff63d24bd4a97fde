#!/usr/bin/env bash
# Configures and builds kvbench (Release, Ninja, ccache) into ./build. Extra args go to cmake configure.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache keys on paths relative to the checkout, so a fresh clone elsewhere (CI) still hits the cache;
# the sloppiness settings let precompiled headers be cached.
export CCACHE_BASEDIR="$PWD"
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
BUILD_DIR="${KVB_BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >&2
# KVB_BUILD_TARGETS="kvbench": build only those targets (the main job needs only the binary).
targets=()
for t in ${KVB_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}" >&2
