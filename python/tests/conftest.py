"""A small results DB made by the real kvbench binary: three methods on the in-repo testbed model."""
import json
import os
from pathlib import Path

import pytest

from kvbench import Kvbench

REPO = Path(__file__).resolve().parents[2]

TINY_GRID = {
    "name": "py_tiny",
    "base": {"model": "kvb-testbed", "threads": 1,
             "protocol": {"name": "qa", "source": "synthetic", "task": "passkey", "length": 256,
                          "num_samples": 2, "depths": "0,1"}},
    "axes": {"method": ["full",
                        {"name": "streaming_llm", "params": {"budget": 0.5}},
                        {"name": "snapkv", "params": {"budget": 0.25}}]},
}


@pytest.fixture(scope="session")
def kvbench_bin():
    path = os.environ.get("KVBENCH_BIN") or str(REPO / "build" / "kvbench")
    if not os.access(path, os.X_OK):
        pytest.fail(f"kvbench binary {path!r} is missing: build it (scripts/build.sh) or set KVBENCH_BIN")
    return path


@pytest.fixture(scope="session")
def tiny_db(tmp_path_factory, kvbench_bin):
    d = tmp_path_factory.mktemp("db")
    grid = d / "grid.json"
    grid.write_text(json.dumps(TINY_GRID))
    db = d / "tiny.sqlite"
    # Through the package's own wrapper, so that a broken `Kvbench.grid` fails every test.
    Kvbench(kvbench_bin, cwd=REPO).grid(grid, db, "--progress", "none")
    return db
