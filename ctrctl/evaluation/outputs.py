"""Writing an evaluation's output folder: staged beside the target, then renamed into place.

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
    >>> staging = stage_output(Path("eval-out"), overwrite=False)
    >>> (staging / "metrics.json").write_text("{}")
    >>> publish_output(staging, Path("eval-out"))
"""

from __future__ import annotations

import csv
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctrctl.errors import OutputExistsError


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse an existing output folder unless ``overwrite``."""
    if out.exists() and not overwrite:
        raise OutputExistsError(
            "the output folder already exists",
            where=str(out),
            hint="pass --overwrite to replace it, or choose another --out",
        )
    if out.exists() and not out.is_dir():
        raise OutputExistsError("the output path is a file, not a folder", where=str(out))


def stage_output(out: Path, overwrite: bool) -> Path:
    """Create an empty staging folder next to ``out`` (same file system: rename is atomic)."""
    check_output(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.staging-{uuid.uuid4().hex[:10]}"
    staging.mkdir()
    return staging


def publish_output(staging: Path, out: Path) -> None:
    """Move the staged folder to ``out``, replacing an old one only once the new one is whole."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:10]}"
        os.replace(out, old)
    os.replace(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def discard_output(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Rows of dicts as CSV, columns in the first row's order."""
    columns = list(rows[0]) if rows else []
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
