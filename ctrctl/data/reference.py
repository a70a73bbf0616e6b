"""Reference statistics of a training split: what drift is measured against.

``ctrctl quantize`` writes them into the export (``dataset/reference_stats.json``) and
``ctrctl monitor`` compares served or new rows with them:

- dense features: the training quantiles cut the axis into ``bins`` bins (the edges), and the
  share of training rows in each;
- sparse features: the ``top_k`` most frequent ids with their shares, and the share of every
  other id (``other``); the share of id 0, the out-of-vocabulary row of a vocabulary-mode
  feature (``default_rate``);
- the label rate, and (when a scorer is at hand) the model's score quantiles and shares.

Values are read from the preprocessed Parquet (the first ``max_rows`` rows of the split:
statistics, not an exact census).

Example:
    >>> stats = reference_stats("data/criteo", "train")
    >>> stats["dense"]["I1"]["edges"][:3], stats["sparse"]["C1"]["top"][:2]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import DatasetError

__all__ = ["REFERENCE_FILE", "REFERENCE_VERSION", "bin_shares", "quantile_edges",
           "read_split_columns", "reference_stats", "top_ids"]

REFERENCE_FILE = "reference_stats.json"
REFERENCE_VERSION = 1
TOP_K = 20
BINS = 10
MAX_ROWS = 200_000


def read_split_columns(dataset: str | Path, split: str, columns: Sequence[str],
                       max_rows: int | None = MAX_ROWS) -> dict[str, np.ndarray]:
    """The first ``max_rows`` rows of ``columns`` of a split, one numpy array each; a
    multi-hot column comes back as its ids flattened (every id of every row)."""
    dataset = Path(dataset)
    manifest = DatasetManifest.load(dataset)
    files = [dataset / name for name in manifest.split(split).files]
    if not files:
        raise DatasetError(f"the split {split!r} has no files", where=str(dataset))
    out: dict[str, list[np.ndarray]] = {c: [] for c in columns}
    taken = 0
    for file in files:
        table = pq.read_table(file, columns=list(columns))
        if max_rows is not None:
            table = table.slice(0, max(0, max_rows - taken))
        taken += table.num_rows
        for name in columns:
            column = table.column(name)
            if str(column.type).startswith(("list", "large_list")):
                column = pc.list_flatten(column)
            out[name].append(column.to_numpy(zero_copy_only=False))
        if max_rows is not None and taken >= max_rows:
            break
    return {k: np.concatenate(v) if v else np.zeros(0) for k, v in out.items()}


def quantile_edges(values: np.ndarray, bins: int = BINS) -> list[float]:
    """The inner edges cutting ``values`` into ``bins`` equal-mass bins (duplicates merged)."""
    if values.size == 0:
        return []
    qs = np.quantile(values.astype(np.float64), np.linspace(0, 1, bins + 1)[1:-1])
    return [float(q) for q in np.unique(qs)]


def bin_shares(values: np.ndarray, edges: Sequence[float]) -> list[float]:
    """Share of ``values`` in each bin ``(-inf, e0], (e0, e1], ..., (e_last, inf)``."""
    which = np.searchsorted(np.asarray(edges, dtype=np.float64),
                            values.astype(np.float64), side="left")
    counts = np.bincount(which, minlength=len(edges) + 1)
    return [float(c) / max(1, values.size) for c in counts]


def top_ids(ids: np.ndarray, top_k: int = TOP_K) -> tuple[list[int], list[float], float]:
    """The ``top_k`` most frequent ids (ties: lower id first), their shares, and the share
    of all other ids."""
    if ids.size == 0:
        return [], [], 0.0
    values, counts = np.unique(ids, return_counts=True)
    order = np.lexsort((values, -counts))[:top_k]
    shares = counts[order] / ids.size
    return ([int(v) for v in values[order]], [float(s) for s in shares],
            float(max(0.0, 1.0 - shares.sum())))


def reference_stats(dataset: str | Path, split: str = "train", *, top_k: int = TOP_K,
                    bins: int = BINS, max_rows: int | None = MAX_ROWS,
                    scores: np.ndarray | None = None) -> dict[str, Any]:
    """The reference statistics of one split of a preprocessed dataset (see the module).

    Args:
        dataset: the dataset folder.
        split: the split (the training split: what the model learnt from).
        top_k: sparse ids kept by name; the rest are ``other``.
        bins: equal-mass bins of each dense feature (and of the scores).
        max_rows: rows read (the first of the split).
        scores: the model's scores on those rows, when known.
    """
    manifest = DatasetManifest.load(dataset)
    names = [*manifest.dense_names, *manifest.sparse_names, manifest.label]
    values = read_split_columns(dataset, split, names, max_rows)
    rows = int(values[manifest.label].size)
    stats: dict[str, Any] = {
        "format_version": REFERENCE_VERSION, "split": split, "rows": rows,
        "manifest_hash": manifest.content_hash(), "created": manifest.created,
        "label_rate": float(values[manifest.label].mean()) if rows else 0.0,
        "dense": {}, "sparse": {}}
    for feature in manifest.dense:
        edges = quantile_edges(values[feature.name], bins)
        stats["dense"][feature.name] = {
            "edges": edges, "shares": bin_shares(values[feature.name], edges),
            "missing_rate": feature.missing_rate}
    for sparse in manifest.sparse:
        ids = values[sparse.name]
        top, shares, other = top_ids(ids, top_k)
        stats["sparse"][sparse.name] = {
            "mode": sparse.mode, "top": top, "shares": shares, "other": other,
            "default_rate": float((ids == 0).mean()) if sparse.mode == "vocab" and ids.size
            else None}
    if scores is not None:
        edges = quantile_edges(np.asarray(scores), bins)
        stats["score"] = {"edges": edges, "shares": bin_shares(np.asarray(scores), edges),
                          "mean": float(np.mean(scores))}
    return stats
