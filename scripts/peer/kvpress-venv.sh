# Sourced by scripts/bench-vs-kvpress.sh and scripts/peer-kvpress.sh: makes sure the kvpress peer venv
# ($VENV) exists and holds the pinned versions ($PINS, torch first). Torch comes from PyTorch's CPU
# wheel index (KVB_PEER_TORCH_INDEX, https://download.pytorch.org/whl/cpu: ~200 MB, no CUDA): the
# default PyPI wheel of torch for Linux x86-64 is the CUDA build, which pulls ~3 GB of nvidia-*
# packages the peer never uses. When that index cannot be reached (a machine that sees only PyPI),
# torch comes from PyPI after all, with a note; KVB_PEER_TORCH_INDEX=pypi asks for that directly.
# Everything else comes from PyPI. An existing venv is reused: `pip install` of pins that are there
# is a no-op.
#   needs: VENV, PINS (torch==X first), TAG (the calling script's name, for messages)
kvpress_venv() {
  local index=${KVB_PEER_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
  if [ ! -x "$VENV/bin/python" ]; then
    echo "$TAG: creating $VENV" >&2
    python3 -m venv "$VENV"
  fi
  local py="$VENV/bin/python"
  if ! "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '${PINS[0]#torch==}')" 2>/dev/null; then
    if [ "$index" != pypi ] && "$py" -m pip install -q --retries 1 --timeout 20 --index-url "$index" "${PINS[0]}" >&2; then
      echo "$TAG: ${PINS[0]} (CPU build) from $index" >&2
    else
      echo "$TAG: ${PINS[0]} from PyPI (the CUDA build and its nvidia-* packages, ~3 GB)$([ "$index" != pypi ] && echo ": $index cannot be reached")" >&2
      "$py" -m pip install -q "${PINS[0]}" >&2
    fi
  fi
  "$py" -m pip install -q "${PINS[@]}" >&2
}
