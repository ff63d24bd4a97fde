"""Drives the kvbench binary through subprocess.

A subprocess rather than bindings: there is one C++ build (LibTorch, CUDA kernels) and the Python side
never links against it, so the user's Python and torch versions cannot clash with the binary's ABI.
"""
import os
import shutil
import subprocess


def find_binary(path=None):
    """The kvbench binary: `path`, else $KVBENCH_BIN, else `kvbench` on PATH."""
    candidate = path or os.environ.get("KVBENCH_BIN") or shutil.which("kvbench")
    if not candidate:
        raise FileNotFoundError("kvbench binary not found: pass its path, set KVBENCH_BIN, or put it on PATH")
    if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
        raise FileNotFoundError(f"kvbench binary {candidate!r} is not an executable file")
    return candidate


class Kvbench:
    """`kvbench` subcommands; each returns the CompletedProcess and raises CalledProcessError (with
    the binary's stderr) when it fails."""

    def __init__(self, binary=None, cwd=None):
        self.binary = find_binary(binary)
        self.cwd = cwd

    def call(self, *args, check=True):
        proc = subprocess.run([self.binary, *map(str, args)], cwd=self.cwd, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
        return proc

    def run(self, config, db, *extra):
        return self.call("run", "--config", config, "--db", db, *extra)

    def grid(self, config, db, *extra):
        return self.call("grid", "--config", config, "--db", db, *extra)

    def merge(self, out_db, *in_dbs):
        return self.call("merge", out_db, *in_dbs)

    def leaderboard(self, db, *extra):
        return self.call("leaderboard", "--db", db, *extra)
