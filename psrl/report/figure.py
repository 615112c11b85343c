"""Shared figure setup: matplotlib's object API only (no pyplot global state, no GUI backend)."""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

DPI = 110
WIDTH_IN = 10.0
ROW_HEIGHT_IN = 3.2
MAX_LEGEND_ENTRIES = 8
TIME_LABEL = "time since run start (s)"


def new_figure(num_rows: int = 1, *, share_x: bool = True) -> tuple[Figure, list[Axes]]:
    figure = Figure(figsize=(WIDTH_IN, ROW_HEIGHT_IN * num_rows + 0.6), dpi=DPI, layout="constrained")
    axes = figure.subplots(num_rows, 1, sharex=share_x, squeeze=False)
    return figure, [row[0] for row in axes]


def finish(figure: Figure, path: Path, title: str) -> None:
    figure.suptitle(title, fontsize=13)
    for axes in figure.axes:
        if not axes.images:  # grid lines would cut through a heat map
            axes.grid(True, alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(loc="best", fontsize=8, framealpha=0.8)
    figure.savefig(path, format="png")
