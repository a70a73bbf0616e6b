"""Small datasets in the exact layout ``ctrctl preprocess`` writes, for tests and benchmarks.

The labels follow a planted logistic click model (a weight per dense feature, a random effect
per sparse id), so a model that learns has something to find, and the best achievable AUC is
known from the click probabilities (:func:`make_dataset` returns them).

Layout written (the loader's contract)::

    path/manifest.json
    path/train/part-00000.parquet ...   columns: label int8, dense float32 ..., sparse int64 ...
    path/val/...  path/test/...          (list<int64> for multi-hot features)

Example:
    >>> info = make_dataset(tmp_path / "ds", rows={"train": 4000, "val": 1000})
    >>> info.manifest.table_sizes()["C1"]
    1000
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ctrctl.data.manifest import DatasetManifest, DenseFeature, SparseFeature, SplitInfo

__all__ = ["SyntheticDataset", "make_dataset"]


@dataclass(frozen=True)
class SyntheticDataset:
    """What :func:`make_dataset` wrote.

    Attributes:
        path: the dataset folder.
        manifest: its manifest.
        probs: split -> the planted click probability of each row, in file order.
    """

    path: Path
    manifest: DatasetManifest
    probs: dict[str, np.ndarray]


def make_dataset(
    path: str | Path,
    rows: int | Mapping[str, int] = 2000,
    *,
    num_dense: int = 13,
    num_sparse: int = 26,
    num_embeddings: int | Sequence[int] = 1000,
    multi_hot: Sequence[str] = (),
    max_length: int = 3,
    row_group_size: int = 65_536,
    rows_per_file: int | None = None,
    signal: float = 1.0,
    seed: int = 0,
) -> SyntheticDataset:
    """Write a dataset folder with a planted click model.

    Args:
        path: the folder to create.
        rows: rows per split; an int gives that many train rows and a tenth of it (at least
            one) for val and test.
        num_dense: dense features ``I1..In`` (float32, already log-transformed in spirit).
        num_sparse: sparse features ``C1..Cn``.
        num_embeddings: table size of every sparse feature, or one per feature.
        multi_hot: names of sparse features stored as ``list<int64>`` of 0..max_length ids.
        max_length: the longest list of a multi-hot feature.
        row_group_size: rows per Parquet row group.
        rows_per_file: rows per ``part-NNNNN.parquet`` file (default: one file per split).
        signal: scale of the planted effects (0: labels are coin flips at the base rate).
        seed: seeds everything.

    Returns:
        A :class:`SyntheticDataset` with the manifest and the click probabilities.
    """
    path = Path(path)
    if isinstance(rows, int):
        rows = {"train": rows, "val": max(1, rows // 10), "test": max(1, rows // 10)}
    sizes = (
        [int(num_embeddings)] * num_sparse
        if isinstance(num_embeddings, int)
        else [int(n) for n in num_embeddings]
    )
    if len(sizes) != num_sparse:
        raise ValueError(f"num_embeddings has {len(sizes)} sizes for {num_sparse} features")
    dense_names = [f"I{i + 1}" for i in range(num_dense)]
    sparse_names = [f"C{i + 1}" for i in range(num_sparse)]
    unknown = sorted(set(multi_hot) - set(sparse_names))
    if unknown:
        raise ValueError(f"multi_hot names unknown features: {unknown}")

    rng = np.random.default_rng(seed)
    # The planted model: logit = bias + dense @ w + sum over features of effect[id] (mean
    # over a multi-hot feature's ids). Ids are Zipf-like so some rows are seen often.
    dense_w = rng.normal(0.0, 0.5 * signal, num_dense)
    effects = [rng.normal(0.0, 0.6 * signal, n) for n in sizes]
    bias = -1.2  # a click rate around 25-30%, like Criteo's 25%

    manifest_splits: dict[str, SplitInfo] = {}
    probs: dict[str, np.ndarray] = {}
    for split_index, (split, n) in enumerate(rows.items()):
        split_rng = np.random.default_rng([seed, split_index])
        dense = np.log1p(split_rng.exponential(2.0, (n, num_dense))).astype(np.float32)
        logit = bias + (dense - 1.0) @ dense_w
        columns: dict[str, pa.Array] = {}
        for f, name in enumerate(sparse_names):
            size = sizes[f]
            if name in multi_hot:
                lengths = split_rng.integers(0, max_length + 1, n)
                ids = _zipf_ids(split_rng, int(lengths.sum()), size)
                offsets = np.concatenate([[0], np.cumsum(lengths)])
                rows_of_ids = np.repeat(np.arange(n), lengths)
                sums = np.bincount(rows_of_ids, weights=effects[f][ids], minlength=n)
                logit = logit + sums / np.maximum(lengths, 1)
                columns[name] = pa.ListArray.from_arrays(
                    pa.array(offsets.astype(np.int32)), pa.array(ids.astype(np.int64))
                )
            else:
                ids = _zipf_ids(split_rng, n, size)
                logit = logit + effects[f][ids]
                columns[name] = pa.array(ids.astype(np.int64))
        prob = 1.0 / (1.0 + np.exp(-logit))
        label = (split_rng.random(n) < prob).astype(np.int8)
        probs[split] = prob
        table = pa.table(
            {"label": pa.array(label)}
            | {name: pa.array(dense[:, i]) for i, name in enumerate(dense_names)}
            | columns
        )
        files = _write_split(path / split, table, row_group_size, rows_per_file or max(n, 1))
        manifest_splits[split] = SplitInfo(
            rows=n, label_rate=float(label.mean()) if n else 0.0,
            files=tuple(f"{split}/{f}" for f in files),
        )

    manifest = DatasetManifest(
        label="label",
        dense=tuple(DenseFeature(name=name) for name in dense_names),
        sparse=tuple(
            SparseFeature(
                name=name, mode="hash", num_embeddings=sizes[i], cardinality=sizes[i],
                hash_size=sizes[i], multi_hot=name in multi_hot,
                mean_length=max_length / 2 if name in multi_hot else 1.0,
            )
            for i, name in enumerate(sparse_names)
        ),
        splits=manifest_splits,
        schema={"name": "synthetic-test"},
        created="synthetic",
    )
    manifest.save(path)
    return SyntheticDataset(path=path, manifest=manifest, probs=probs)


def _zipf_ids(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """Ids in [0, size) with a heavy head: a mix of Zipf(1.2) draws and uniform ones."""
    head = (rng.zipf(1.2, n) - 1) % size
    uniform = rng.integers(0, size, n)
    return np.where(rng.random(n) < 0.7, head, uniform).astype(np.int64)


def _write_split(folder: Path, table: pa.Table, row_group_size: int, rows_per_file: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for i, start in enumerate(range(0, max(table.num_rows, 1), rows_per_file)):
        name = f"part-{i:05d}.parquet"
        pq.write_table(table.slice(start, rows_per_file), folder / name,
                       row_group_size=row_group_size)
        names.append(name)
    return names
