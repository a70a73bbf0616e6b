"""Where the scores come from: a checkpoint scoring a dataset split, or a predictions file.

Both give the same thing, an iterator of :class:`ScoreBatch` (labels, scores, optional
weights, and the values of any features asked for, e.g. the segment feature), for one rank's
share of the rows. Rank ``r`` of ``W`` takes rows ``[r*N//W, (r+1)*N//W)`` of the split in
file order, as the dataset loader's scoring mode does, so feature columns read here line up
with the scores ``ctrctl.models.scoring.predict_split`` yields.

A predictions file is Parquet with columns ``label`` and ``score`` (and optionally ``weight``
and feature columns), as ``ctrctl eval --save-predictions`` writes it.

Example:
    >>> for batch in predictions_scores("preds.parquet", features=["C1"]):
    ...     batch.labels, batch.scores, batch.features["C1"]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import DatasetError

DEFAULT_BATCH_ROWS = 65_536


@dataclass
class ScoreBatch:
    """Rows to evaluate: labels (0/1), scores (probabilities), weights or None, features."""

    labels: np.ndarray
    scores: np.ndarray
    weights: np.ndarray | None = None
    features: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.labels.size)


def rank_range(rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` that rank ``rank`` evaluates (every row once over all ranks)."""
    return rank * rows // world_size, (rank + 1) * rows // world_size


def split_files(dataset: Path, manifest: DatasetManifest, split: str) -> list[Path]:
    """The Parquet files of a split, in order."""
    info = manifest.split(split)
    files = (
        [dataset / f for f in info.files]
        if info.files
        else sorted((dataset / split).glob("*.parquet"))
    )
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        raise DatasetError(
            f"split {split!r} has missing or no Parquet files {missing[:3]}",
            where=str(dataset),
            hint="re-run `ctrctl preprocess`",
        )
    return files


def _parquet(path: Path) -> pq.ParquetFile:
    """Open a Parquet file, or one clear error naming it."""
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"not a readable Parquet file ({exc})", where=str(path),
                           hint="write it again (`ctrctl eval --save-predictions`, "
                                "`ctrctl preprocess`)") from None


def _check_numeric(path: Path, schema: pa.Schema, columns: Sequence[str]) -> None:
    for name in columns:
        kind = schema.field(name).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                or pa.types.is_boolean(kind)):
            raise DatasetError(f"column {name!r} holds {kind}, not numbers", where=str(path),
                               hint="labels, scores and weights must be numeric columns")


def _check_columns(files: Sequence[Path], columns: Sequence[str]) -> None:
    names = set(_parquet(files[0]).schema_arrow.names)
    missing = [c for c in columns if c not in names]
    if missing:
        raise DatasetError(
            f"no column(s) {missing} in {files[0].name}",
            where=str(files[0]),
            hint=f"available columns: {', '.join(sorted(names))}",
        )


def _column_array(column: pa.ChunkedArray | pa.Array, name: str, where: Path) -> np.ndarray:
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        raise DatasetError(
            f"column {name!r} holds lists (a multi-hot feature)",
            where=str(where),
            hint="segment by a one-hot feature",
        )
    return np.asarray(column.to_numpy(zero_copy_only=False))


def read_columns(
    files: Sequence[Path],
    columns: Sequence[str],
    start: int = 0,
    stop: int | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> Iterator[dict[str, np.ndarray]]:
    """Rows ``[start, stop)`` of the concatenated files, in file order, in bounded batches."""
    _check_columns(files, columns)
    offset = 0
    for path in files:
        handle = _parquet(path)
        rows = handle.metadata.num_rows
        if stop is not None and offset >= stop:
            return
        if offset + rows <= start:
            offset += rows
            continue
        for batch in handle.iter_batches(batch_size=batch_rows, columns=list(columns)):
            lo, hi = offset, offset + batch.num_rows
            offset = hi
            cut_lo = max(start - lo, 0)
            cut_hi = batch.num_rows if stop is None else min(stop - lo, batch.num_rows)
            if cut_hi <= cut_lo:
                continue
            part = batch.slice(cut_lo, cut_hi - cut_lo)
            yield {c: _column_array(part.column(c), c, path) for c in columns}


class _RowStream:
    """Takes exactly ``n`` rows at a time from an iterator of column batches."""

    def __init__(self, batches: Iterator[dict[str, np.ndarray]], columns: Sequence[str]):
        self._batches = batches
        self._columns = list(columns)
        self._buffer: dict[str, list[np.ndarray]] = {c: [] for c in columns}
        self._buffered = 0

    def take(self, n: int) -> dict[str, np.ndarray]:
        while self._buffered < n:
            batch = next(self._batches, None)
            if batch is None:
                raise DatasetError(
                    f"the features have fewer rows than the scores ({self._buffered} left, "
                    f"{n} needed)",
                    hint="the predictions and the dataset split must have the same rows",
                )
            for c in self._columns:
                self._buffer[c].append(batch[c])
            self._buffered += len(batch[self._columns[0]])
        out = {}
        for c in self._columns:
            joined = np.concatenate(self._buffer[c]) if len(self._buffer[c]) > 1 else (
                self._buffer[c][0]
            )
            out[c], rest = joined[:n], joined[n:]
            self._buffer[c] = [rest] if rest.size else []
        self._buffered -= n
        return out


def predictions_scores(
    path: str | Path,
    features: Sequence[str] = (),
    rank: int = 0,
    world_size: int = 1,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    dataset: str | Path | None = None,
    split: str = "test",
) -> Iterator[ScoreBatch]:
    """Score batches from a Parquet predictions file (or a folder of them).

    Feature columns are taken from the file when present, otherwise from ``dataset``'s split,
    row for row (the file must then hold the split's rows in file order).
    """
    path = Path(path)
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files or not files[0].is_file():
        raise DatasetError("no predictions Parquet file", where=str(path),
                           hint="write one with `ctrctl eval --save-predictions`")
    handles = [_parquet(f) for f in files]
    names = set(handles[0].schema_arrow.names)
    base = ["label", "score"] + (["weight"] if "weight" in names else [])
    if "score" in names and "label" not in names:
        raise DatasetError("the predictions file has scores but no labels (scored from "
                           "logs without a label column): evaluation needs labels",
                           where=str(files[0]),
                           hint="score labeled logs or a labeled split with `ctrctl predict`")
    _check_columns(files, base)
    for f, handle in zip(files, handles, strict=True):
        _check_numeric(f, handle.schema_arrow, base)
    own = [f for f in features if f in names]
    others = [f for f in features if f not in names]
    rows = sum(h.metadata.num_rows for h in handles)
    if rows == 0:
        raise DatasetError("the predictions file holds no rows: nothing to evaluate",
                           where=str(path), hint="pass predictions of a non-empty split")
    start, stop = rank_range(rows, rank, world_size)
    stream = None
    if others:
        if dataset is None:
            _check_columns(files, others)  # raises: not in the file, and no dataset
        dataset = Path(dataset)  # type: ignore[arg-type]
        manifest = DatasetManifest.load(dataset)
        if manifest.split(split).rows != rows:
            raise DatasetError(
                f"{path.name} has {rows} rows but split {split!r} has "
                f"{manifest.split(split).rows}",
                hint="pass the dataset and split the predictions were made on",
            )
        stream = _RowStream(
            read_columns(split_files(dataset, manifest, split), others, start, stop), others
        )
    for batch in read_columns(files, base + own, start, stop, batch_rows):
        extra = stream.take(batch["label"].size) if stream is not None else {}
        yield ScoreBatch(
            labels=batch["label"],
            scores=batch["score"],
            weights=batch.get("weight"),
            features={f: batch[f] for f in own} | extra,
        )


def checkpoint_scores(
    checkpoint: str | Path,
    dataset: str | Path,
    split: str = "test",
    features: Sequence[str] = (),
    rank: int = 0,
    world_size: int = 1,
    batch_size: int = 8192,
) -> Iterator[ScoreBatch]:
    """Score batches from a trained checkpoint on a dataset split (this rank's rows).

    Raises:
        CheckpointError / DatasetError: from loading the model or the data.
    """
    from ctrctl.models.scoring import predict_split

    dataset = Path(dataset)
    manifest = DatasetManifest.load(dataset)
    stream = None
    if features:
        start, stop = rank_range(manifest.split(split).rows, rank, world_size)
        stream = _RowStream(
            read_columns(split_files(dataset, manifest, split), features, start, stop), features
        )
    for labels, scores in predict_split(
        Path(checkpoint), dataset, split, batch_size=batch_size, rank=rank,
        world_size=world_size,
    ):
        labels = np.asarray(labels).reshape(-1)
        yield ScoreBatch(
            labels=labels,
            scores=np.asarray(scores).reshape(-1),
            features=stream.take(labels.size) if stream is not None else {},
        )
