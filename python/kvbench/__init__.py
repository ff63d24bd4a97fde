"""kvbench results in pandas: read a results database, plot it, drive the kvbench binary."""
from .results import Results, open_results
from .compression import measured_compression
from .plots import plot_score_vs_compression, plot_pareto, plot_task_bars
from .binary import Kvbench, find_binary

__all__ = [
    "Results", "open_results", "measured_compression",
    "plot_score_vs_compression", "plot_pareto", "plot_task_bars",
    "Kvbench", "find_binary",
]
