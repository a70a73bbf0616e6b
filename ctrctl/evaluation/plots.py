"""Plots of an evaluation as PNG files.

Each plot is a :class:`matplotlib.figure.Figure` made directly (no pyplot, no global state):
matplotlib's backend is left as the user set it (a notebook keeps its inline plots) and no
display is needed to write the file.

Example:
    >>> reliability_plot(metrics.reliability, out / "reliability.png")
    >>> score_histogram_plot(metrics.histogram, out / "scores.png")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctrctl.metrics.calibration import ReliabilityBin


def _figure(width: float, height: float) -> tuple[Any, Any]:
    """A standalone figure and its axes (not registered with pyplot, so nothing to close)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.add_subplot()


def reliability_plot(
    bins: Sequence[ReliabilityBin], path: str | Path, title: str = "Reliability"
) -> Path:
    """Observed click rate against mean prediction per equal-mass bin, beside the diagonal."""
    fig, ax = _figure(5.5, 5)
    x = np.array([b.mean_score for b in bins])
    y = np.array([b.click_rate for b in bins])
    top = float(max(x.max(initial=0.0), y.max(initial=0.0), 1e-3)) * 1.05
    ax.plot([0, top], [0, top], linestyle="--", color="grey", linewidth=1, label="calibrated")
    ax.plot(x, y, marker="o", linewidth=1.5, label="model (equal-mass bins)")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("mean predicted CTR")
    ax.set_ylabel("observed CTR")
    ax.set_title(title)
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def score_histogram_plot(
    histogram: dict[str, list[float]], path: str | Path, title: str = "Scores by label"
) -> Path:
    """Score distribution of clicks and non-clicks (each normalised), over the logit."""
    edges = np.asarray(histogram["logit_edges"])
    pos = np.asarray(histogram["positives"])
    neg = np.asarray(histogram["negatives"])
    used = np.flatnonzero(pos + neg)
    fig, ax = _figure(6.5, 4)
    if used.size:
        lo, hi = used[0], used[-1] + 1
        centers = (edges[lo:hi] + edges[lo + 1 : hi + 1]) / 2
        width = edges[1] - edges[0]
        for counts, label in ((neg[lo:hi], "label 0"), (pos[lo:hi], "label 1")):
            total = counts.sum()
            ax.bar(centers, counts / total if total else counts, width=width, alpha=0.5,
                   label=label)
        ticks = np.linspace(edges[lo], edges[hi], 6)
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{1 / (1 + np.exp(-t)):.2g}" for t in ticks])
    ax.set_xlabel("predicted CTR (logit scale)")
    ax.set_ylabel("share of rows")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
