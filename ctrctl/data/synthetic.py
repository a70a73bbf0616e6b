"""Synthetic click logs in Criteo's and Avazu's raw formats, with a known click model.

``ctrctl synth`` writes logs that look like the real ones (Zipf-distributed categorical
values with real cardinalities, heavy-tailed counts, values missing together at real rates)
and whose labels come from a planted click model, so that a model has something to learn and
the best achievable AUC is known: the true click probability of every row is written beside
the logs.

Click model::

    logit = bias + sum_f effect_f[rank_f]           per-value effects of some features,
                                                    only for their frequent values
                 + sum_d w_d * z_d                  a few dense counts (their latent normal)
                 + pair[rank_a, rank_b]             one pairwise interaction
    p     = sigmoid(logit);  label ~ Bernoulli(p)

``bias`` is solved for so that the label rate matches the format (22.5% Criteo, 17% Avazu).

Rows are made in chunks of :data:`CHUNK_ROWS`, chunk ``k`` from its own random stream
``(seed, k)``: the output is the same bytes for the same arguments whatever the number of
threads, and memory stays bounded for any row count.

Example:
    >>> result = synthesize(Path("synth"), rows=100_000, format="criteo", seed=0)
    >>> result.best_auc["test"]            # the AUC of the true probability on test
    0.78...
    >>> batch = generate_criteo(1000, seed=0)   # in memory: a pyarrow table + probabilities
    >>> batch.table.num_columns
    40
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ctrctl.data.synthetic_model import (
    CHUNK_ROWS,
    ChunkColumns,
    ClickModel,
    SynthBatch,
    click_model,
    hex_strings,
    zipf_ranks,
)
from ctrctl.data.synthetic_specs import AVAZU_COLUMNS, EFFECT_HEAD, FORMATS, format_spec
from ctrctl.errors import ConfigError
from ctrctl.io import check_destination, staged_folder, write_json_atomic
from ctrctl.metrics.functional import MetricError, roc_auc
from ctrctl.progress import Progress
from ctrctl.tracking import Tracker

__all__ = [
    "CHUNK_ROWS",
    "DEFAULT_SPLITS",
    "ChunkColumns",
    "FORMATS",
    "ClickModel",
    "SynthBatch",
    "SynthResult",
    "click_model",
    "encode_lines",
    "encoded_chunks",
    "generate_avazu",
    "generate_criteo",
    "hex_strings",
    "iter_batches",
    "parse_assignments",
    "split_rows",
    "synthesize",
    "text_of",
    "zipf_ranks",
]

logger = logging.getLogger(__name__)


def _model(format: str, seed: int, cardinalities: Mapping[str, int] | None) -> ClickModel:
    return click_model(format, seed, tuple(sorted((cardinalities or {}).items())))


def iter_batches(
    format: str,
    rows: int,
    seed: int = 0,
    cardinalities: Mapping[str, int] | None = None,
) -> Iterator[SynthBatch]:
    """Rows in chunks of :data:`CHUNK_ROWS` (the last one shorter), in order."""
    model = _model(format, seed, cardinalities)
    for chunk, start in enumerate(range(0, rows, CHUNK_ROWS)):
        yield model.batch(chunk, start, min(CHUNK_ROWS, rows - start), rows)


def _generate(
    format: str, rows: int, seed: int, cardinalities: Mapping[str, int] | None
) -> SynthBatch:
    batches = list(iter_batches(format, rows, seed, cardinalities))
    if not batches:
        return _model(format, seed, cardinalities).batch(0, 0, 0, 0)
    table = pa.concat_tables([b.table for b in batches])
    return SynthBatch(table, np.concatenate([b.prob for b in batches]))


def generate_criteo(
    rows: int, seed: int = 0, cardinalities: Mapping[str, int] | None = None
) -> SynthBatch:
    """``rows`` Criteo rows in memory: the rows ``synthesize`` writes, over all splits in
    order, for the same ``rows``, seed and cardinalities.

    Args:
        rows: number of rows.
        seed: the click model's and the rows' seed.
        cardinalities: sparse feature -> distinct values, replacing the defaults.

    Returns:
        A :class:`SynthBatch`: the 40 columns as a pyarrow table and the true probabilities.

    Example:
        >>> batch = generate_criteo(1000, seed=1)
        >>> batch.table.column_names[:3], batch.prob.dtype
        (['label', 'I1', 'I2'], dtype('float32'))
    """
    return _generate("criteo", rows, seed, cardinalities)


def generate_avazu(
    rows: int, seed: int = 0, cardinalities: Mapping[str, int] | None = None
) -> SynthBatch:
    """``rows`` Avazu rows in memory (columns as Avazu's ``train.csv``); see
    :func:`generate_criteo` for the arguments.

    Example:
        >>> generate_avazu(10, seed=0).table.column_names[:3]
        ['id', 'click', 'hour']
    """
    return _generate("avazu", rows, seed, cardinalities)


# ----------------------------------------------------------------------------- text


def encode_lines(table: pa.Table, separator: str) -> pa.StringArray:
    """Each row as one text line, every line *starting* with ``\\n`` (none at the end).

    Missing values become empty fields. Leading newlines let the lines be joined by one
    vectorised call and still concatenate into a file: drop the first byte of a file and add
    one newline at its end (see :func:`text_of`).
    """
    fields = [pc.cast(column, pa.string()) for column in table.itercolumns()]
    if not fields:
        return pa.array([], type=pa.string())
    fields[0] = pc.binary_join_element_wise("", fields[0], "\n")
    joined = pc.binary_join_element_wise(
        *fields, separator, null_handling="replace", null_replacement=""
    )
    if isinstance(joined, pa.ChunkedArray):
        joined = joined.combine_chunks()
    return joined


def text_of(lines: pa.StringArray | pa.ChunkedArray) -> memoryview:
    """The bytes of consecutive lines of a string array, without copying (those of a
    chunked array are joined)."""
    if isinstance(lines, pa.ChunkedArray):
        return memoryview(b"".join(text_of(piece) for piece in lines.chunks))
    if len(lines) == 0:
        return memoryview(b"")
    _, offsets_buffer, data = lines.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32)[
        lines.offset : lines.offset + len(lines) + 1
    ]
    return memoryview(data)[int(offsets[0]) : int(offsets[-1])]


def _best_auc(prob: np.ndarray, label: np.ndarray) -> float:
    """The AUC of the true click probabilities (the best any model can reach), or NaN when a
    split holds one class only."""
    try:
        return roc_auc(label, prob)
    except MetricError:
        return float("nan")


def encoded_chunks(
    format: str,
    rows: int,
    seed: int = 0,
    cardinalities: Mapping[str, int] | None = None,
    workers: int = 2,
) -> Iterator[tuple[int, ChunkColumns, pa.ChunkedArray]]:
    """``(start_row, columns, lines)`` per chunk, made by ``workers`` threads, in order.

    The lines are encoded straight from the chunk's numpy columns (no Arrow table; the same
    bytes as :func:`encode_lines` of the table). numpy and Arrow release the GIL in their
    loops, so chunks are made in parallel; each chunk draws from its own stream, so the
    bytes do not depend on ``workers``.
    """
    model = _model(format, seed, cardinalities)
    separator = "," if format == "avazu" else "\t"

    def make(chunk: int) -> tuple[int, ChunkColumns, pa.ChunkedArray]:
        start = chunk * CHUNK_ROWS
        raw = model.columns(chunk, start, min(CHUNK_ROWS, rows - start), rows)
        return start, raw, raw.lines(separator)

    chunks = range((rows + CHUNK_ROWS - 1) // CHUNK_ROWS)
    if workers <= 1:
        yield from map(make, chunks)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        # At most 2 * workers chunks in flight keeps memory bounded.
        pending = []
        for chunk in chunks:
            pending.append(pool.submit(make, chunk))
            if len(pending) >= 2 * workers:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()


# ----------------------------------------------------------------------------- files

SYNTH_FORMAT = "ctrctl.synth"
SYNTH_VERSION = 1
DEFAULT_SPLITS: dict[str, float] = {"train": 0.8, "val": 0.1, "test": 0.1}


@dataclass(frozen=True)
class SynthResult:
    """What :func:`synthesize` wrote.

    Attributes:
        out: the output folder.
        format: ``criteo`` or ``avazu``.
        seed: the seed.
        rows: rows per split, in file order.
        label_rate: share of clicks per split.
        best_auc: AUC of the true probability against the labels per split (NaN when a split
            has one class only): the best any model can reach on it.
        files: split -> log file path.
        cardinalities: sparse feature -> number of distinct values of the generator.
        seconds: wall time of making and writing the rows.
    """

    out: Path
    format: str
    seed: int
    rows: dict[str, int]
    label_rate: dict[str, float]
    best_auc: dict[str, float]
    files: dict[str, Path]
    cardinalities: dict[str, int]
    seconds: float

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    @property
    def rows_per_second(self) -> float:
        return self.total_rows / self.seconds if self.seconds > 0 else float("inf")


def split_rows(rows: int, splits: Mapping[str, float]) -> dict[str, int]:
    """Rows per split from fractions that sum to 1; the last split takes the rounding rest.

    Example:
        >>> split_rows(1001, {"train": 0.8, "val": 0.1, "test": 0.1})
        {'train': 800, 'val': 100, 'test': 101}
    """
    if rows < 1:
        raise ConfigError(f"--rows must be at least 1, not {rows}: no logs to write",
                          hint="e.g. --rows 100000")
    if not splits:
        raise ConfigError("no splits given", hint="e.g. --split train=0.8 --split test=0.2")
    for name, fraction in splits.items():
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(
                f"split name {name!r} is not a plain name", hint="use letters, digits, - and _"
            )
        if not 0.0 <= fraction <= 1.0:
            raise ConfigError(f"split {name} has fraction {fraction}", hint="use 0 <= f <= 1")
    total = sum(splits.values())
    if abs(total - 1.0) > 1e-6:
        raise ConfigError(
            f"split fractions sum to {total:g}, not 1",
            where=", ".join(f"{k}={v:g}" for k, v in splits.items()),
            hint="make them add up to 1",
        )
    names = list(splits)
    counts = {name: int(rows * splits[name]) for name in names[:-1]}
    counts[names[-1]] = rows - sum(counts.values())
    return counts


def parse_assignments(items: list[str] | None, kind: type, option: str) -> dict[str, Any]:
    """``["train=0.8", "test=0.2"]`` -> ``{"train": 0.8, "test": 0.2}`` (values of ``kind``).

    Example:
        >>> parse_assignments(["C3=1000"], int, "--cardinality")
        {'C3': 1000}
    """
    parsed: dict[str, Any] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError(item)
            parsed[name.strip()] = kind(value)
        except ValueError:
            raise ConfigError(
                f"cannot read {item!r} as NAME={kind.__name__.upper()}",
                where=option,
                hint=f"e.g. {option} {'train=0.8' if kind is float else 'C3=100000'}",
            ) from None
    return parsed


def _extension(format: str) -> str:
    return "csv" if format == "avazu" else "tsv"


class _SplitWriter:
    """One split's log file; chunk text arrives with a newline *before* each line."""

    def __init__(self, path: Path, header: bytes):
        self.path = path
        self.file = path.open("wb")
        self.file.write(header)
        self.rows = 0
        self.probs: list[np.ndarray] = []
        self.labels: list[np.ndarray] = []

    def write(self, lines: pa.ChunkedArray, prob: np.ndarray, label: np.ndarray) -> None:
        if len(lines) == 0:
            return
        for piece in lines.chunks:
            text = text_of(piece)
            if len(text):
                self.file.write(text[1:] if self.rows == 0 else text)
                self.rows += len(piece)
        self.probs.append(prob)
        self.labels.append(label)

    def close(self) -> tuple[np.ndarray, np.ndarray]:
        if self.rows:
            self.file.write(b"\n")
        self.file.close()
        prob = np.concatenate(self.probs) if self.probs else np.zeros(0, dtype=np.float32)
        label = np.concatenate(self.labels) if self.labels else np.zeros(0, dtype=np.int8)
        return prob, label


def synthesize(
    out: Path,
    rows: int = 100_000,
    format: str = "criteo",
    seed: int = 0,
    splits: Mapping[str, float] | None = None,
    cardinalities: Mapping[str, int] | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    workers: int | None = None,
    tracker: Tracker | None = None,
) -> SynthResult:
    """Write synthetic raw logs with their true click probabilities.

    Writes ``OUT/{split}.tsv`` (Criteo: no header, TAB-separated, 40 fields) or
    ``OUT/{split}.csv`` (Avazu: header line, 24 columns), ``OUT/{split}.prob.npy`` (float32
    true click probability per line, same order) and ``OUT/synth.json`` (format, seed, rows,
    label rates, cardinalities, best AUC per split). The folder is built beside ``out`` and
    renamed into place at the end, so a failed run leaves nothing behind.

    Args:
        out: the output folder; refused if it exists, unless ``overwrite``.
        rows: total rows over all splits.
        format: ``criteo`` or ``avazu``.
        seed: the same seed and arguments give the same bytes.
        splits: split name -> fraction of rows (default train 0.8, val 0.1, test 0.1); splits
            are consecutive ranges of one stream of rows, in the order given.
        cardinalities: sparse feature -> number of distinct values, replacing the defaults
            (Criteo 1TB's sizes, those of a million or more divided by ten).
        overwrite: replace an existing ``out``.
        progress: receives rows as they are written.
        workers: threads making chunks (default: up to 4, by CPU count).
        tracker: tracks one run ``synth``: the arguments as params, rows, label rates and
            best AUC per split as metrics, ``synth.json`` as an artifact.

    Returns:
        A :class:`SynthResult`.

    Example:
        >>> r = synthesize(Path("logs"), rows=10_000, format="avazu", seed=3)
        >>> sorted(p.name for p in r.out.iterdir())[:3]
        ['synth.json', 'test.csv', 'test.prob.npy']
    """
    format_spec(format)  # an unknown format is an error before anything is written
    counts = split_rows(rows, dict(splits) if splits is not None else DEFAULT_SPLITS)
    out = Path(out)
    check_destination(out, overwrite)
    _model(format, seed, cardinalities)  # unknown features too, before any tracking or output
    tracker = tracker or Tracker()
    with tracker.run("synth") as run:
        run.log_params(
            {
                "format": format,
                "rows": rows,
                "seed": seed,
                "splits": dict(splits) if splits is not None else DEFAULT_SPLITS,
                "cardinalities": dict(cardinalities or {}),
                "out": str(out),
            }
        )
        result = _write(out, counts, format, seed, cardinalities, progress, workers,
                        overwrite)
        metrics = {"rows_per_second": result.rows_per_second, "seconds": result.seconds}
        for name, count in result.rows.items():
            metrics[f"rows.{name}"] = count
            for key, values in (("label_rate", result.label_rate), ("best_auc", result.best_auc)):
                if not math.isnan(values[name]):
                    metrics[f"{key}.{name}"] = values[name]
        run.log_metrics(metrics)
        run.log_artifact(out / "synth.json")
    return result


def _write(
    out: Path,
    counts: dict[str, int],
    format: str,
    seed: int,
    cardinalities: Mapping[str, int] | None,
    progress: Progress | None,
    workers: int | None,
    overwrite: bool,
) -> SynthResult:
    rows = sum(counts.values())
    model = _model(format, seed, cardinalities)
    progress = progress or Progress()
    workers = workers if workers is not None else max(1, min(4, os.cpu_count() or 1))
    t0 = time.perf_counter()
    with staged_folder(out, overwrite=overwrite) as tmp:
        ext = _extension(format)
        header = (",".join(AVAZU_COLUMNS) + "\n").encode() if format == "avazu" else b""
        # Split s holds rows [bounds[s], bounds[s + 1]) of the stream.
        names = list(counts)
        bounds = np.cumsum([0, *counts.values()])
        writers = {name: _SplitWriter(tmp / f"{name}.{ext}", header) for name in names}
        label_rate: dict[str, float] = {}
        best_auc: dict[str, float] = {}

        def finish(name: str) -> None:
            prob, label = writers[name].close()
            np.save(tmp / f"{name}.prob.npy", prob)
            label_rate[name] = float(label.mean()) if len(label) else float("nan")
            best_auc[name] = _best_auc(prob, label)

        progress.start(f"synth {format}", total=rows, unit="rows")
        finished = 0  # splits closed: a split closes with its last chunk, so that its AUC
        # is computed while the threads make the next chunks
        for start, batch, lines in encoded_chunks(format, rows, seed, cardinalities, workers):
            n = len(batch.prob)
            labels = batch.labels
            for s, name in enumerate(names):
                lo = max(int(bounds[s]), start) - start
                hi = min(int(bounds[s + 1]), start + n) - start
                if hi > lo:
                    writers[name].write(lines.slice(lo, hi - lo), batch.prob[lo:hi], labels[lo:hi])
            while finished < len(names) and bounds[finished + 1] <= start + n:
                finish(names[finished])
                finished += 1
            progress.advance(n)
        for name in names[finished:]:
            finish(name)
        progress.finish()
        seconds = time.perf_counter() - t0
        cards = model.spec.cardinalities()
        meta = {
            "format": SYNTH_FORMAT,
            "version": SYNTH_VERSION,
            "log_format": format,
            "seed": seed,
            "chunk_rows": CHUNK_ROWS,
            "rows": counts,
            "files": {name: f"{name}.{ext}" for name in names},
            "label_rate": {k: _json_float(v) for k, v in label_rate.items()},
            "best_auc": {k: _json_float(v) for k, v in best_auc.items()},
            "cardinalities": cards,
            "click_model": {
                "bias": model.bias,
                "effects": {f.name: f.effect for f in model.spec.sparse if f.effect},
                "dense_effects": {d.name: d.effect for d in model.spec.dense if d.effect},
                "interaction": list(model.spec.interaction) if model.spec.interaction else None,
                "effect_head": EFFECT_HEAD,
                "zipf_exponents": {f.name: f.exponent for f in model.spec.sparse},
            },
        }
        write_json_atomic(tmp / "synth.json", meta)
    logger.info("synth: %d rows in %.2f s (%.0f rows/s) -> %s", rows, seconds, rows / seconds, out)
    return SynthResult(
        out=out,
        format=format,
        seed=seed,
        rows=counts,
        label_rate=label_rate,
        best_auc=best_auc,
        files={name: out / f"{name}.{ext}" for name in names},
        cardinalities=cards,
        seconds=seconds,
    )


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) else value
