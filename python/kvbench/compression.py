"""Measured compression as the leaderboard (harness/report/leaderboard.cpp) reports it.

A table there is a group of runs whose resolved config is equal once `method`, `label` and `threads`
are removed (same model, protocol, dtype, ...). Each run's `bytes_per_token` / `compression_ratio`
metric is the physical bytes of its KV state per cached position and the uncompressed baseline's
bytes over those. The 16-bit variants are used for the whole group when every finished run in it
recorded them, because an fp32 CPU run's ratio against an fp32 baseline flatters fixed-width codes
two-fold.
"""
import json

import pandas as pd

# Config keys that do not change results, so runs differing only in them share a leaderboard table.
_NOT_SETTINGS = ("method", "label", "threads")


def settings_key(config_json):
    """The leaderboard's group key of a run: its config without method, label and threads."""
    cfg = json.loads(config_json)
    for k in _NOT_SETTINGS:
        cfg.pop(k, None)
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


def measured_compression(results):
    """One row per finished run: group (the leaderboard table it falls in), bytes_per_token,
    compression_ratio (baseline bytes / physical bytes), whether the 16-bit accounting applies, and
    the ratio relative to the group's full-cache run (full bytes per token / this run's), which equals
    compression_ratio when the full cache is the uncompressed baseline."""
    runs = results.runs(status="done")
    wide = results.metrics_wide()
    raw = results._query("SELECT id AS run_id, config_json FROM runs WHERE status = 'done'")
    keys = {r["run_id"]: settings_key(r["config_json"]) for r in raw.to_dict("records")}
    if runs.empty:
        return pd.DataFrame(columns=["run_id", "group", "method", "bytes_per_token", "compression_ratio",
                                     "bytes_16bit", "ratio_vs_full"])
    df = runs[["run_id", "config_hash", "method", "model", "protocol_name", "dataset", "simulated"]].copy()
    df["group"] = df["run_id"].map(keys)
    df = df.merge(wide, on="run_id", how="left", suffixes=("", "_metric"))
    out = []
    for _, g in df.groupby("group", sort=False):
        use16 = "compression_ratio_16bit" in g and g["compression_ratio_16bit"].notna().all()
        suffix = "_16bit" if use16 else ""
        g = g.copy()
        g["bytes_per_token"] = g.get("bytes_per_token" + suffix)
        g["compression_ratio"] = g.get("compression_ratio" + suffix)
        g["bytes_16bit"] = bool(use16)
        full = g[g["method"] == "full"]
        # The leaderboard takes the last finished full run of the table as its reference.
        full_bpt = full["bytes_per_token"].iloc[-1] if not full.empty else float("nan")
        g["ratio_vs_full"] = full_bpt / g["bytes_per_token"]
        out.append(g)
    cols = ["run_id", "config_hash", "group", "method", "model", "protocol_name", "dataset", "simulated",
            "bytes_per_token", "compression_ratio", "bytes_16bit", "ratio_vs_full"]
    return pd.concat(out)[cols].reset_index(drop=True)
