"""Reads a kvbench results database (harness/store/results_db.cpp, docs/DESIGN.md §9) into pandas.

The database is opened read-only so that reading a DB a running grid still writes never takes its lock
for long nor changes it.
"""
import json
import os
import sqlite3

import pandas as pd

# Columns of `runs` the readers rely on: a database without them is not a kvbench results DB (or one
# whose schema changed), and is refused by name rather than read into half-empty frames.
REQUIRED_RUN_COLUMNS = ("id", "config_hash", "config_json", "method", "model", "dataset", "protocol",
                        "grid", "simulated", "status", "error", "wall_s", "provenance_json")
REQUIRED_TABLES = {"runs": REQUIRED_RUN_COLUMNS,
                   "metrics": ("run_id", "name", "layer", "head", "value", "unit", "direction", "n",
                               "ci_low", "ci_high"),
                   "samples": ("run_id", "sample_index", "sample_key", "output_json")}


def _flatten(value, prefix, out):
    """Nested dicts become dotted columns (protocol.length); lists and scalars stay values."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else k, out)
    else:
        out[prefix] = value


def flatten_config(config):
    """A run's config JSON as one flat dict: method, params.*, model, protocol.*, and the rest dotted."""
    flat = {}
    cfg = dict(config)
    method = cfg.pop("method", {})
    if isinstance(method, dict):
        flat["method"] = method.get("name", "")
        _flatten(method.get("params", {}), "params", flat)
    else:
        flat["method"] = method
    _flatten(cfg, "", flat)
    return flat


class Results:
    """One kvbench results database. Frames are read on each call, so a growing DB is seen as it grows."""

    def __init__(self, path):
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"kvbench results DB {path!r} does not exist")
        self.path = path
        self._con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        self._check_schema()

    def close(self):
        self._con.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_schema(self):
        for table, columns in REQUIRED_TABLES.items():
            try:
                have = {row[1] for row in self._con.execute(f"PRAGMA table_info({table})")}
            except sqlite3.DatabaseError as e:
                raise ValueError(f"{self.path!r} is not a kvbench results DB: {e}") from None
            if not have:
                raise ValueError(f"{self.path!r} is not a kvbench results DB: it has no table {table!r}")
            missing = [c for c in columns if c not in have]
            if missing:
                raise ValueError(f"{self.path!r}: table {table!r} lacks columns {missing} "
                                 f"(a schema this reader does not know)")

    def _query(self, sql, params=()):
        return pd.read_sql_query(sql, self._con, params=params)

    def runs(self, status=None):
        """One row per run: the stored columns, the config flattened (method, params.*, model,
        protocol.*, ...) and the provenance flattened under provenance.*. `status` filters (e.g. 'done')."""
        sql = ("SELECT id AS run_id, config_hash, config_json, dataset, protocol AS protocol_name, grid, "
               "simulated, status, error, attempts, worker, created_at, started_at, finished_at, wall_s, "
               "provenance_json FROM runs")
        params = ()
        if status is not None:
            sql += " WHERE status = ?"
            params = (status,)
        raw = self._query(sql + " ORDER BY id", params)
        rows = []
        for rec in raw.to_dict("records"):
            try:
                cfg = json.loads(rec.pop("config_json"))
                prov = json.loads(rec.pop("provenance_json"))
            except json.JSONDecodeError as e:
                raise ValueError(f"{self.path!r}: run {rec['run_id']} has invalid JSON: {e}") from None
            row = dict(rec)
            row.update(flatten_config(cfg))
            _flatten(prov, "provenance", row)
            row["simulated"] = bool(row["simulated"])
            rows.append(row)
        return pd.DataFrame(rows)

    def metrics(self, per_layer=False):
        """Long form: one row per run x metric (run-level metrics; per_layer=True adds per-layer/head
        rows), joined with the run's method, model, dataset, protocol and config hash."""
        sql = ("SELECT m.run_id, r.config_hash, r.method, r.model, r.dataset, r.protocol, m.name AS metric, "
               "m.layer, m.head, m.value, m.unit, m.direction, m.n, m.ci_low, m.ci_high "
               "FROM metrics m JOIN runs r ON r.id = m.run_id")
        if not per_layer:
            sql += " WHERE m.layer IS NULL AND m.head IS NULL"
        return self._query(sql + " ORDER BY m.run_id, m.name, m.layer, m.head")

    def metrics_wide(self):
        """One row per run, one column per run-level metric."""
        long = self.metrics()
        wide = long.pivot(index="run_id", columns="metric", values="value")
        wide.columns.name = None
        return wide.reset_index()

    def samples(self):
        """One row per run x sample: the sample's output JSON flattened (score, prediction, ledger.*...),
        with the raw JSON kept in `output_json`."""
        raw = self._query("SELECT s.run_id, r.config_hash, r.method, s.sample_index, s.sample_key, "
                          "s.output_json FROM samples s JOIN runs r ON r.id = s.run_id "
                          "ORDER BY s.run_id, s.sample_index")
        rows = []
        for rec in raw.to_dict("records"):
            out = json.loads(rec["output_json"])
            row = dict(rec)
            _flatten(out, "", row)
            rows.append(row)
        return pd.DataFrame(rows, columns=None if rows else list(raw.columns))

    def table(self, status="done"):
        """Runs (config flattened) with their run-level metrics as columns: the frame most plots want."""
        runs = self.runs(status=status)
        if runs.empty:
            return runs
        wide = self.metrics_wide()
        return runs.merge(wide, on="run_id", how="left", suffixes=("", "_metric"))


def open_results(path):
    """Opens a kvbench results DB (results/main.sqlite, a grid's --db)."""
    return Results(path)
