"""Streaming batch scoring for ``ctrctl predict``: scores appended, raw logs chunk by chunk.

Memory stays a few chunks (``batch_size`` rows) plus the model, whatever the input's size:

- raw logs are read by the preprocess step's own reader (``ctrctl.data.readers``: the same
  parsing, header detection, gzip, CSV/TSV/libfm/Parquet) in streamed chunks, and encoded by
  the artifact's column encoder (``serving_encoder.py``), which gives the preprocess step's
  ids; a bad value is a :class:`~ctrctl.errors.DatasetError` naming file, line and column;
- scores (and labels) are appended to a Parquet file in the output's folder, renamed onto
  the output when complete (never a partial file under the output's name).

Example:
    >>> with ScoresWriter(Path("scores.parquet"), overwrite=False) as writer:
    ...     rows = score_raw(serving, schema, Path("test.tsv"), 8192, writer)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ctrctl.data.schema import Schema
from ctrctl.data.transforms import EXTRA, ROW, label_value
from ctrctl.errors import DatasetError, OutputExistsError
from ctrctl.io import remove_stale_temps, temp_path

__all__ = ["ScoresWriter", "score_raw"]


#: Rows gathered before a row group is written (5 bytes a row: label int8 + score float32).
ROW_GROUP_ROWS = 1 << 20


class ScoresWriter:
    """Label + score rows appended to ``out`` (staged beside it, renamed when closed), in
    row groups of up to :data:`ROW_GROUP_ROWS` rows (a Parquet write per scoring batch
    would cost more than the batch's scoring)."""

    def __init__(self, out: Path, *, overwrite: bool, labels: bool = True) -> None:
        self.out, self.overwrite, self.labels = out, overwrite, labels
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out.parent)
        self._tmp = temp_path(out)  # io's temp name: a killed run's is removed by the next one
        tmp = str(self._tmp)
        fields = [pa.field("label", pa.int8())] if labels else []
        self._schema = pa.schema([*fields, pa.field("score", pa.float32())])
        try:
            self._writer = pq.ParquetWriter(tmp, self._schema)
        except BaseException:  # a full disk already: no temp file stays
            self._tmp.unlink(missing_ok=True)
            raise
        self._labels: list[np.ndarray] = []
        self._scores: list[np.ndarray] = []
        self._rows = 0

    def write(self, labels: np.ndarray | None, scores: np.ndarray) -> None:
        self._scores.append(scores.astype(np.float32, copy=False))
        if self.labels:
            assert labels is not None
            self._labels.append(labels.astype(np.int8, copy=False))
        self._rows += len(scores)
        if self._rows >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        columns: list[Any] = [pa.array(np.concatenate(self._scores))]
        if self.labels:
            columns.insert(0, pa.array(np.concatenate(self._labels)))
        self._writer.write_table(pa.Table.from_arrays(columns, schema=self._schema))
        self._labels, self._scores, self._rows = [], [], 0

    def __enter__(self) -> ScoresWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        try:
            if kind is None:
                self._flush()
            self._writer.close()
            if kind is None:
                if self.out.exists() and not self.overwrite:
                    raise OutputExistsError("the scores file already exists",
                                            where=str(self.out),
                                            hint="pass --overwrite to replace it")
                os.replace(self._tmp, self.out)
        finally:
            self._tmp.unlink(missing_ok=True)


def score_raw(serving: Any, schema: Schema, raw: Path, batch_size: int,
              writer: ScoresWriter, *, labeled: bool = True) -> int:
    """Score raw logs chunk by chunk with the artifact's encoder; the rows scored.

    ``labeled=False``: the logs have no label column (serving logs); ``writer`` then
    writes scores only (``ScoresWriter(labels=False)``).

    Raises:
        DatasetError: a row with too many fields, a bad label or a bad value (naming the
            file, line and column).
    """
    import polars as pl

    from ctrctl.data.readers import reading, scan_input

    scan = scan_input(schema, raw, labeled=labeled)
    label = next(c for c in schema.columns if c.role == "label")
    value, bad = label_value(label, schema.label_rule) if labeled else (
        pl.lit(None, pl.Int8), pl.lit(False))
    columns_read = len(schema.columns) - (0 if labeled else 1)
    wanted = list(serving.input_columns())
    rows = 0
    with reading(raw):
        for chunk in _chunks(scan.frame.select(
                pl.col(ROW), pl.col(EXTRA), value.alias("__label"), bad.alias("__bad_label"),
                *[pl.col(c) for c in wanted]), batch_size):
            line = _first_bad_line(chunk, scan.header_lines)
            if line is not None:
                kind, at = line
                raise DatasetError(f"{kind} (the model's schema has {columns_read} "
                                   "columns)" if kind == "too many fields" else kind,
                                   where=f"{raw}:{at}",
                                   hint="fix the row, or score with preprocess's "
                                   "--on-bad-rows skip through --dataset")
            columns = {name: chunk.get_column(name).to_numpy() for name in wanted}
            try:
                scores = serving.score_columns(columns, chunk.height)
            except ValueError as exc:  # the loader's InputError
                row, message, where = getattr(exc, "row", None), str(exc), str(raw)
                if row is not None:  # the chunk's row -> the file's data row and line
                    data_row = int(chunk.get_column(ROW)[row])
                    message = message.replace(f"row {row}:", f"row {data_row}:", 1)
                    where = f"{raw}:{data_row + 1 + scan.header_lines}"
                raise DatasetError(message, where=where,
                                   hint="the value is not what the model's schema reads"
                                   ) from None
            writer.write(chunk.get_column("__label").to_numpy() if labeled else None, scores)
            rows += chunk.height
    return rows


def _chunks(frame: Any, size: int) -> Iterator[Any]:
    for chunk in frame.collect_batches(chunk_size=size, maintain_order=True):
        if chunk.height:
            yield chunk


def _first_bad_line(chunk: Any, header_lines: int) -> tuple[str, int] | None:
    """("too many fields" or "bad label", line) of the chunk's first such row."""
    for column, kind in ((EXTRA, "too many fields"), ("__bad_label", "bad label")):
        flags = chunk.get_column(column)
        flags = flags.is_not_null() if column == EXTRA else flags.fill_null(True)
        if flags.any():
            at = int(flags.arg_true()[0])
            return kind, int(chunk.get_column(ROW)[at]) + 1 + header_lines
    return None
