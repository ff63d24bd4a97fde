#!/usr/bin/env bash
# scripts/torch-wheel-check.sh: build and test kvbench on this (CPU) machine against the LibTorch inside
# a PyPI torch wheel: by default the version the GPU machine's PyTorch has (device tool, KINDS.md:
# torch 2.11.0+cu130), CUDA kernels on. CI builds against Debian's LibTorch 1.13; the device builds
# against its PyTorch's; this is how a machine without a GPU finds what breaks between the two (an
# API that moved, a header no longer included, LibTorch's CMake flags) before device time is spent.
# Nothing runs on a GPU: the wheel's CUDA libraries only have to load (this machine's CUDA toolkit,
# plus NVIDIA's wheels for the few libraries it lacks, laid out as pip would).
#
#   scripts/torch-wheel-check.sh [ctest args...]     default ctest args: -LE slow
#
# Environment: TORCH_VERSION (2.11.0), KVB_WHEEL_WORK (/tmp/kvb-torch-wheel: wheels and the unpacked
# site), KVB_BUILD_DIR (build-torch-wheel), KVBENCH_MODELS / KVBENCH_DATA (default ../shared/...).
# Needs pip and network access to PyPI (~800 MB of wheels, downloaded once into KVB_WHEEL_WORK).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VER=${TORCH_VERSION:-2.11.0}
WORK=${KVB_WHEEL_WORK:-/tmp/kvb-torch-wheel}
SITE=$WORK/site-$VER
BUILD=${KVB_BUILD_DIR:-build-torch-wheel}
mkdir -p "$WORK/wheels"

# ---- 1. the torch wheel, unpacked as site-packages/torch ----
whl=$(ls "$WORK/wheels"/torch-"$VER"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$whl" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$WORK/wheels" "torch==$VER"
  whl=$(ls "$WORK/wheels"/torch-"$VER"-*.whl | head -1)
fi
if [ ! -f "$SITE/torch/share/cmake/Torch/TorchConfig.cmake" ]; then
  rm -rf "$SITE" && mkdir -p "$SITE"
  (cd "$SITE" && unzip -q "$whl" 'torch/lib/*' 'torch/include/*' 'torch/share/*' '*.dist-info/METADATA')
fi
echo "torch $VER: $whl" >&2

# ---- 2. the CUDA libraries its libraries need that this machine lacks, from NVIDIA's wheels ----
# (pins from the wheel's own requirements where it names them)
pin() { { grep -o "^Requires-Dist: $1==[^;]*" "$SITE"/torch-*.dist-info/METADATA || true; } | head -1 | sed 's/^Requires-Dist: //; s/ //g'; }
declare -A PKG=([libcusparseLt.so.0]=nvidia-cusparselt-cu13 [libnvshmem_host.so.3]=nvidia-nvshmem-cu13
  [libcufile.so.0]=nvidia-cufile [libcudnn.so.9]=nvidia-cudnn-cu13 [libnccl.so.2]=nvidia-nccl-cu13)
HAVE=$(ldconfig -p | awk '{print $1}')  # (not piped into grep -q: with pipefail, its early exit fails the pipe)
for so in $(readelf -d "$SITE"/torch/lib/*.so 2>/dev/null | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | sort -u); do
  [ -f "$SITE/torch/lib/$so" ] && continue
  [ "$so" = libcuda.so.1 ] && continue  # the driver (libcaffe2_nvrtc.so's, loaded only on a GPU)
  grep -qxF "$so" <<<"$HAVE" && continue
  [ -n "$(find "$SITE/nvidia" -name "$so" 2>/dev/null)" ] && continue
  pkg=${PKG[$so]:-}
  if [ -z "$pkg" ]; then echo "note: $so (needed by the wheel) is not on this machine; linking may fail" >&2; continue; fi
  spec=$(pin "$pkg"); spec=${spec:-$pkg}
  echo "fetching $spec for $so" >&2
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$WORK/wheels" "$spec"
  for w in "$WORK/wheels"/"${pkg//-/_}"-*.whl; do (cd "$SITE" && unzip -q -o "$w" 'nvidia/*'); done
done

# ---- 3. configure and build (LibTorch's own libraries named: a system LibTorch must not shadow them) ----
export CCACHE_BASEDIR="$ROOT"
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
L=$SITE/torch/lib
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVB_WITH_CUDA=ON -DKVB_CUDA_ARCHS=90 \
  -DKVB_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$SITE/torch/share/cmake" \
  -DTORCH_LIBRARY="$L/libtorch.so" -Dc10_LIBRARY="$L/libc10.so" >&2
grep -q "TORCH_LIBRARY:FILEPATH=$L/libtorch.so" "$BUILD/CMakeCache.txt" ||
  { echo "error: the build did not take LibTorch from $L" >&2; exit 1; }
nice cmake --build "$BUILD" -j "$(nproc)" >&2

# ---- 4. the tests (CPU; the CUDA tests skip without a device) ----
export KVBENCH_MODELS=${KVBENCH_MODELS:-$ROOT/../shared/models}
export KVBENCH_DATA=${KVBENCH_DATA:-$ROOT/../shared/data}
cd "$BUILD"
[ $# -gt 0 ] || set -- -LE slow
ctest --output-on-failure -j "$(nproc)" "$@"
