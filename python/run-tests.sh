#!/usr/bin/env bash
# Runs the Python package's tests (python/tests) in a venv outside the clone, made from PyPI with the
# exact versions of requirements-test.txt on first use (about a minute) and reused after that.
# Environment: KVB_PY_VENV (default $HOME/.cache/kvbench/py-venv-<hash of the pins>), KVBENCH_BIN (the
# binary that makes the tests' database; default <repo>/build/kvbench). Arguments pass to pytest.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
pins="$here/requirements-test.txt"
# The venv's name carries the pins' hash: changing a pin makes a fresh venv rather than a mixed one.
venv="${KVB_PY_VENV:-$HOME/.cache/kvbench/py-venv-$(sha256sum "$pins" | cut -c1-12)}"
python="${KVB_PYTHON3:-python3}"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  echo "run-tests.sh: creating $venv from PyPI ($pins)" >&2
  rm -rf "$venv"
  if ! "$python" -m venv "$venv"; then
    echo "run-tests.sh: '$python -m venv' failed: install python3-venv (scripts/setup.sh does)" >&2
    exit 1
  fi
  if ! "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$pins"; then
    rm -rf "$venv"
    echo "run-tests.sh: pip could not install $pins from PyPI (is PyPI reachable? set PIP_INDEX_URL for a" \
         "mirror); the Python tests cannot run without pandas, matplotlib and pytest" >&2
    exit 1
  fi
  touch "$venv/.complete"   # a venv whose install was interrupted is remade, not half-used
fi
cd "$here"
export MPLBACKEND=Agg
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
