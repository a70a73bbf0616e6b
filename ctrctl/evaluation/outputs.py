"""What an evaluation's output folder holds (staged and published by :mod:`ctrctl.io`).

Layout::

    out/metrics.json          flat metric keys (auc, pr_auc, logloss, ne, calibration, ece, ...)
    out/reliability.json      the equal-mass bins behind the reliability diagram and ECE
    out/score_histogram.json  per-class score counts (coarse bins over the logit)
    out/reliability.png  out/scores.png
    out/segments/<F>.csv  out/segments/<F>.json   one row per value of feature F
    out/baselines.json        each baseline's metrics on the same rows
    out/gates.json            each gate, its value and margin
    out/predictions/part-<rank>.parquet   with --save-predictions: label, score (+ features)

Example:
    >>> write_csv(Path("eval-out/segments/C9.csv"), [{"value": 3, "auc": 0.71}])
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Rows of dicts as CSV, columns in the first row's order."""
    columns = list(rows[0]) if rows else []
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
