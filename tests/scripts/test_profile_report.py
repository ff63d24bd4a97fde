#!/usr/bin/env python3
"""scripts/profile-report.py: the verdict rule on hand-made captures (each branch and its
thresholds), and the page written from a small made-up database of profile runs, with the check
against a leaderboard JSON. Standard library only (ctest: profile_report)."""

import importlib.util
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "profile-report.py")
spec = importlib.util.spec_from_file_location("profile_report", SCRIPT)
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


def read(path):
    with open(path) as f:
        return f.read()


def make_db(path, runs):
    """runs: [(model, dataset, window, {name: mean})]; one (layer 0, head 0) cell per mean too."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, config_hash TEXT, config_json TEXT, method TEXT, "
                "model TEXT, dataset TEXT, protocol TEXT, status TEXT, provenance_json TEXT, wall_s REAL)")
    con.execute("CREATE TABLE metrics (run_id INTEGER, name TEXT, layer INTEGER, head INTEGER, value REAL)")
    for i, (model, dataset, window, means) in enumerate(runs, 1):
        proto = {"name": "profile", "window": window, "top_k": 8, "cluster_rows": 32, "scan_share": 0.1,
                 "quant_group": 32}
        con.execute("INSERT INTO runs VALUES (?, ?, ?, 'full', ?, ?, 'profile', 'done', ?, 1.0)",
                    (i, f"h{i}", json.dumps({"protocol": proto}), model, dataset,
                     json.dumps({"git_commit": "abc", "cpu_model": "cpu", "threads": 1})))
        for name, v in means.items():
            con.execute("INSERT INTO metrics VALUES (?, ?, NULL, NULL, ?)", (i, name, v))
            con.execute("INSERT INTO metrics VALUES (?, ?, 0, 0, ?)", (i, name, v))
    con.commit()
    con.close()


class VerdictRule(unittest.TestCase):
    def test_each_branch(self):
        v = lambda t, c, s: report.verdict_of(t, c, s)[0]
        self.assertEqual(v(0.90, 0.99, 0.99), "temporal")      # temporal first, at the bar
        self.assertEqual(v(0.89, 0.95, 0.91), "content")       # 0.95 - 0.91 > 0.03
        self.assertEqual(v(0.50, 0.60, 0.95), "speculative")
        self.assertEqual(v(0.89, 0.95, 0.93), "mixed")         # within the margin
        self.assertEqual(v(0.89, 0.91, 0.0), "mixed")          # 0.91 - 0.89 < 0.03
        self.assertEqual(v(0.20, 0.85, 0.30), "mixed")         # nothing reaches the bar
        self.assertEqual(v(None, 0.99, 0.5), "mixed")

    def test_diffuse_marks_a_flat_mixed_workload(self):
        run = {"metrics": {("temporal_capture", None, None): 0.2, ("content_capture", None, None): 0.6,
                           ("speculative_capture", None, None): 0.2, ("support90_frac", None, None): 0.7}}
        self.assertEqual(report.verdict(run)[0], "mixed (diffuse)")
        run["metrics"][("support90_frac", None, None)] = 0.3
        self.assertEqual(report.verdict(run)[0], "mixed")


class Page(unittest.TestCase):
    def test_page_verdict_and_leaderboard_check(self):
        d = tempfile.mkdtemp(prefix="kvb_profile_report_")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d], check=False))
        db = os.path.join(d, "p.sqlite")
        make_db(db, [("m", "text", 256, {"temporal_capture": 0.5, "content_capture": 0.8, "speculative_capture": 0.7,
                                         "support90_frac": 0.1}),
                     ("m", "text", 1024, {"temporal_capture": 0.5, "content_capture": 0.95,
                                          "speculative_capture": 0.7, "support90_frac": 0.1}),
                     ("other", "text", 256, {"temporal_capture": 0.99})])
        lb = os.path.join(d, "lb.json")
        rows = [{"method": "streaming_llm", "label": "streaming_llm", "value": 0.01, "params": {}},
                {"method": "snapkv", "label": "snapkv", "value": 0.002, "params": {"codec": "none"}},
                {"method": "snapkv", "label": "snapkv+kivi", "value": 0.0001, "params": {"codec": "kivi-2"}}]
        with open(lb, "w") as f:
            json.dump({"tables": [{"model": "m", "dataset": "text", "protocol": "stream", "metric": "kl_mean",
                                   "direction": "lower", "settings_text": "window=1000",
                                   "settings": {"protocol": {"window": 1000}}, "rows": rows}]}, f)
        out = os.path.join(d, "page.md")
        r = subprocess.run([sys.executable, SCRIPT, "--db", db, "--model", "m", "--leaderboard", lb, "--out", out],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        page = read(out)
        self.assertIn("**VERDICT: content locality** at 1024 tokens", page)
        self.assertIn("checked against the profile at 1024 tokens", page)  # nearest to the table's 1000
        self.assertIn("**Agrees**", page)
        self.assertNotIn("snapkv+kivi", page)  # stacked codec rows are left out
        self.assertIn("<svg", read(os.path.join(d, "page.html")))
        self.assertNotIn("<script", read(os.path.join(d, "page.html")))

    def test_missing_model_is_a_named_error(self):
        d = tempfile.mkdtemp(prefix="kvb_profile_report_")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", d], check=False))
        db = os.path.join(d, "p.sqlite")
        make_db(db, [("m", "text", 256, {"temporal_capture": 0.5})])
        r = subprocess.run([sys.executable, SCRIPT, "--db", db, "--model", "nope", "--out", os.path.join(d, "x.md")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no finished profile run of model 'nope'", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(d, "x.md")))
        r = subprocess.run([sys.executable, SCRIPT, "--db", os.path.join(d, "none.sqlite"), "--model", "m"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("none.sqlite: no such database", r.stderr)


if __name__ == "__main__":
    unittest.main()
