"""Plots are written without touching matplotlib's process-wide state."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np

from ctrctl.evaluation.plots import reliability_plot, score_histogram_plot
from ctrctl.metrics import reliability_table


def test_plots_leave_the_backend_and_pyplot_alone(tmp_path: Path) -> None:
    matplotlib.use("svg")  # what a user (or a notebook) chose
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(0)
    scores = rng.random(2000)
    labels = (rng.random(2000) < scores).astype(np.int8)
    table = reliability_table(labels, scores, n_bins=10)
    counts = np.histogram(scores, bins=8)[0].astype(float).tolist()
    histogram = {"logit_edges": np.linspace(-4, 4, 9).tolist(), "positives": counts,
                 "negatives": counts}
    paths = [reliability_plot(table, tmp_path / "r.png"),
             score_histogram_plot(histogram, tmp_path / "s.png")]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.get_backend() == "svg"
    assert plt.get_fignums() == []
