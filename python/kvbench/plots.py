"""Matplotlib views of a results DB. Each helper returns (Figure, Axes) and never calls show()."""

import matplotlib.pyplot as plt

from .compression import measured_compression


def _scored(results, metric):
    comp = measured_compression(results)
    wide = results.metrics_wide()
    if metric not in wide.columns:
        raise KeyError(f"metric {metric!r} is not in {results.path!r}; it has: {sorted(wide.columns[1:])}")
    df = comp.merge(wide[["run_id", metric]], on="run_id", how="left")
    return df[df[metric].notna()]


def _axes(ax):
    if ax is None:
        fig, ax = plt.subplots()
        return fig, ax
    return ax.figure, ax


def plot_score_vs_compression(results, metric="accuracy", ax=None):
    """One curve per method of `metric` against measured compression, with the full cache as a
    horizontal line (its compression is 1x by definition)."""
    df = _scored(results, metric)
    fig, ax = _axes(ax)
    full = df[df["method"] == "full"]
    for method, g in df[df["method"] != "full"].groupby("method"):
        g = g.sort_values("compression_ratio")
        ax.plot(g["compression_ratio"], g[metric], marker="o", label=method)
    if not full.empty:
        ax.axhline(full[metric].mean(), color="black", linestyle="--", label="full cache")
    ax.set_xlabel("measured compression (x)")
    ax.set_ylabel(metric)
    ax.legend()
    return fig, ax


def pareto_front(df, x, y, maximize_y=True):
    """Rows not dominated in (higher x, better y), sorted by x."""
    pts = df.sort_values([x, y], ascending=[False, not maximize_y])
    keep, best = [], None
    for idx, row in pts.iterrows():
        v = row[y]
        if best is None or (v > best if maximize_y else v < best):
            keep.append(idx)
            best = v
    return df.loc[keep].sort_values(x)


def plot_pareto(results, metric="accuracy", ax=None):
    """Every finished run as a point (compression, metric), the Pareto front drawn through them."""
    df = _scored(results, metric)
    fig, ax = _axes(ax)
    for method, g in df.groupby("method"):
        ax.scatter(g["compression_ratio"], g[metric], label=method)
    front = pareto_front(df, "compression_ratio", metric)
    ax.plot(front["compression_ratio"], front[metric], color="black", linestyle="--", label="Pareto front")
    ax.set_xlabel("measured compression (x)")
    ax.set_ylabel(metric)
    ax.legend()
    return fig, ax


def plot_task_bars(results, metric="accuracy", ax=None):
    """Grouped bars: one group per dataset (task), one bar per method (mean over runs)."""
    df = _scored(results, metric)
    pivot = df.pivot_table(index="dataset", columns="method", values=metric, aggfunc="mean")
    fig, ax = _axes(ax)
    pivot.plot.bar(ax=ax)
    ax.set_xlabel("task")
    ax.set_ylabel(metric)
    return fig, ax
