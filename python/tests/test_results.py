import json
import sqlite3
import subprocess

import matplotlib

matplotlib.use("Agg")

import pandas as pd
import pytest

import kvbench
from kvbench.compression import settings_key


def test_runs_flatten_config_and_provenance(tiny_db):
    runs = kvbench.open_results(tiny_db).runs()
    assert len(runs) == 3
    assert set(runs["method"]) == {"full", "streaming_llm", "snapkv"}
    assert (runs["status"] == "done").all()
    assert (runs["model"] == "kvb-testbed").all()
    assert (runs["protocol.name"] == "qa").all()
    assert (runs["protocol.length"] == 256).all()
    assert (runs["protocol.task"] == "passkey").all()
    snap = runs[runs["method"] == "snapkv"].iloc[0]
    assert snap["params.budget"] == 0.25
    assert runs[runs["method"] == "streaming_llm"].iloc[0]["params.budget"] == 0.5
    assert runs["config_hash"].nunique() == 3
    assert runs["provenance.git_commit"].str.len().gt(0).all()
    assert (runs["provenance.device_name"] == "cpu").all()


def test_runs_match_the_stored_config(tiny_db):
    con = sqlite3.connect(tiny_db)
    stored = {h: json.loads(c) for h, c in con.execute("SELECT config_hash, config_json FROM runs")}
    runs = kvbench.open_results(tiny_db).runs().set_index("config_hash")
    for h, cfg in stored.items():
        assert runs.loc[h, "method"] == cfg["method"]["name"]
        for k, v in cfg["method"]["params"].items():
            assert runs.loc[h, f"params.{k}"] == v
        assert runs.loc[h, "protocol.num_samples"] == cfg["protocol"]["num_samples"]


def test_metrics_long_and_wide_agree_with_sql(tiny_db):
    res = kvbench.open_results(tiny_db)
    long = res.metrics()
    con = sqlite3.connect(tiny_db)
    n = con.execute("SELECT count(*) FROM metrics WHERE layer IS NULL AND head IS NULL").fetchone()[0]
    assert len(long) == n > 0
    assert {"run_id", "method", "metric", "value", "unit", "direction"} <= set(long.columns)
    wide = res.metrics_wide()
    assert len(wide) == 3
    for run_id, value in con.execute("SELECT run_id, value FROM metrics WHERE name = 'accuracy'"):
        assert wide.set_index("run_id").loc[run_id, "accuracy"] == pytest.approx(value)
    full_id = con.execute("SELECT id FROM runs WHERE method = 'full'").fetchone()[0]
    assert wide.set_index("run_id").loc[full_id, "compression_ratio"] == pytest.approx(1.0)


def test_samples_flatten_outputs(tiny_db):
    samples = kvbench.open_results(tiny_db).samples()
    con = sqlite3.connect(tiny_db)
    assert len(samples) == con.execute("SELECT count(*) FROM samples").fetchone()[0] > 0
    first = json.loads(con.execute("SELECT output_json FROM samples ORDER BY run_id, sample_index").fetchone()[0])
    row = samples.iloc[0]
    assert row["items"] == first["items"]
    assert row["ledger.baseline_bytes"] == first["ledger"]["baseline_bytes"]


def test_measured_compression_matches_the_leaderboard_metric(tiny_db):
    res = kvbench.open_results(tiny_db)
    comp = measured_compression = kvbench.measured_compression(res)
    assert len(comp) == 3 and comp["group"].nunique() == 1
    con = sqlite3.connect(tiny_db)
    # Every run here records 16-bit accounting, so the leaderboard's table uses it.
    assert comp["bytes_16bit"].all()
    for run_id, value in con.execute("SELECT run_id, value FROM metrics WHERE name = 'compression_ratio_16bit'"):
        assert comp.set_index("run_id").loc[run_id, "compression_ratio"] == pytest.approx(value)
    by = comp.set_index("method")
    assert by.loc["full", "ratio_vs_full"] == pytest.approx(1.0)
    assert by.loc["snapkv", "compression_ratio"] > by.loc["streaming_llm", "compression_ratio"] > 1.0
    assert by.loc["snapkv", "ratio_vs_full"] == pytest.approx(by.loc["snapkv", "compression_ratio"], rel=0.05)


def test_settings_key_ignores_method_label_threads():
    a = {"method": {"name": "full"}, "label": "x", "threads": 1, "model": "m", "protocol": {"name": "qa"}}
    b = dict(a, method={"name": "h2o"}, label="y", threads=4)
    c = dict(a, model="other")
    assert settings_key(json.dumps(a)) == settings_key(json.dumps(b)) != settings_key(json.dumps(c))


def test_plots_draw_one_line_per_method_and_the_full_line(tiny_db):
    res = kvbench.open_results(tiny_db)
    fig, ax = kvbench.plot_score_vs_compression(res, metric="accuracy")
    labels = [l.get_label() for l in ax.get_lines()]
    assert set(labels) == {"streaming_llm", "snapkv", "full cache"}
    fig, ax = kvbench.plot_pareto(res, metric="accuracy")
    assert any(l.get_label() == "Pareto front" for l in ax.get_lines())
    fig, ax = kvbench.plot_task_bars(res, metric="accuracy")
    assert len(ax.patches) == 3
    with pytest.raises(KeyError, match="no_such_metric"):
        kvbench.plot_score_vs_compression(res, metric="no_such_metric")


def test_pareto_front_keeps_only_undominated_points():
    from kvbench.plots import pareto_front
    df = pd.DataFrame({"x": [1, 2, 3, 4], "y": [1.0, 0.9, 0.95, 0.5]})
    assert list(pareto_front(df, "x", "y")["x"]) == [1, 3, 4]


def test_refuses_what_is_not_a_results_db(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.sqlite"):
        kvbench.open_results(tmp_path / "missing.sqlite")
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE runs (id INTEGER)").connection.commit()
    with pytest.raises(ValueError, match="lacks columns"):
        kvbench.open_results(other)


def test_binary_drives_leaderboard(tiny_db, kvbench_bin, monkeypatch):
    monkeypatch.setenv("KVBENCH_BIN", kvbench_bin)
    kvb = kvbench.Kvbench()
    assert kvb.binary == kvbench_bin
    out = kvb.leaderboard(tiny_db, "--format", "csv", "--resamples", "100").stdout
    assert "snapkv" in out and "streaming_llm" in out
    with pytest.raises(subprocess.CalledProcessError):
        kvb.call("no-such-subcommand")
    with pytest.raises(FileNotFoundError, match="/nonexistent/kvbench"):
        kvbench.find_binary("/nonexistent/kvbench")


def test_binary_merges_into_an_equal_db(tiny_db, kvbench_bin, tmp_path):
    out = tmp_path / "merged.sqlite"
    kvbench.Kvbench(kvbench_bin).merge(out, tiny_db)
    a = kvbench.open_results(tiny_db).samples()
    b = kvbench.open_results(out).samples()
    key = ["config_hash", "sample_index"]
    pd.testing.assert_frame_equal(a.sort_values(key)[key + ["output_json"]].reset_index(drop=True),
                                  b.sort_values(key)[key + ["output_json"]].reset_index(drop=True))


def test_binary_run_skips_a_finished_config(tiny_db, kvbench_bin, tmp_path):
    import shutil
    db = tmp_path / "copy.sqlite"
    shutil.copy(tiny_db, db)
    (config_json,) = sqlite3.connect(db).execute("SELECT config_json FROM runs WHERE method = 'full'").fetchone()
    config = tmp_path / "full.json"
    config.write_text(config_json)
    kvbench.Kvbench(kvbench_bin).run(config, db, "--quiet")
    runs = kvbench.open_results(db).runs()
    assert len(runs) == 3 and (runs["attempts"] == 1).all()
