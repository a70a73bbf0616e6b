"""What the manifest says about features (statistics over written Parquet), and bad-row messages.

Statistics are computed from the written split (columnar Parquet, cheap to scan) rather than
during the CSV pass: dense mean/std/min/max after the transform, sparse cardinality (distinct
ids) and mean list length of multi-hot features.

Example:
    >>> dense, sparse = dataset_features(schema, kinds, vocabs, folder, parts, missing, rows, None)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from ctrctl.data.manifest import DatasetManifest, DenseFeature, SparseFeature
from ctrctl.data.readers import ScannedInput, raw_row
from ctrctl.data.schema import Schema
from ctrctl.data.transforms import (
    EXTRA,
    SHORT,
    dense_value,
    derived_key,
    label_value,
    sparse_key,
)
from ctrctl.data.vocab import num_embeddings
from ctrctl.errors import InputDataError

if TYPE_CHECKING:
    from ctrctl.data.fastpath import SplitSummary

#: Cardinality is exact up to this many rows and a HyperLogLog estimate (~1% error) above,
#: where an exact distinct count over every sparse column costs more than the parse.
EXACT_CARDINALITY_ROWS = 250_000


def dataset_features(
    schema: Schema,
    kinds: Mapping[str, tuple[str, int | None, bool]],
    vocabs: Mapping[str, pl.DataFrame],
    folder: Path,
    parts: Sequence[Path],
    missing: Mapping[str, int],
    rows: int,
    followed: DatasetManifest | None,
    summary: SplitSummary | None = None,
) -> tuple[tuple[DenseFeature, ...], tuple[SparseFeature, ...]]:
    """Dense and sparse feature entries of the manifest, from the split in ``parts``.

    Sparse cardinality is exact up to :data:`EXACT_CARDINALITY_ROWS` rows, estimated above:
    from ``summary`` where the fast path gathered one while writing (no second read), else
    by polars over the written files.

    A dataset that follows another (``--reuse-transforms``) keeps that dataset's entries, so
    that its table sizes are the model's.
    """
    if followed is not None:
        return followed.dense, followed.sparse
    dense_names = [c.name for c in schema.dense]
    exact = rows <= EXACT_CARDINALITY_ROWS
    if summary is not None and not exact and summary.rows == rows:
        stats = _summary_stats(summary)
    else:
        stats = _scan_stats(parts, dense_names, kinds, exact)
    dense = tuple(
        DenseFeature(
            name=n, mean=float(stats[f"{n}.mean"] or 0.0), std=float(stats[f"{n}.std"] or 0.0),
            min=float(stats[f"{n}.min"] or 0.0), max=float(stats[f"{n}.max"] or 0.0),
            missing_rate=missing.get(n, 0) / max(rows, 1),
        )
        for n in dense_names
    )
    sizes = num_embeddings(kinds, vocabs)
    min_counts = {c.name: c.min_count for c in schema.sparse}
    zch = {c.name: c.collision for c in schema.sparse if c.collision is not None}
    sparse = tuple(
        SparseFeature(
            name=n, mode="zch" if n in zch else "hash" if size is not None else "vocab",
            num_embeddings=zch[n].capacity if n in zch else sizes[n],
            cardinality=int(stats[f"{n}.card"]), hash_size=None if n in zch else size,
            min_count=min_counts.get(n), multi_hot=multi,
            mean_length=float(stats.get(f"{n}.len") or 0.0) if multi else 1.0,
            collision=zch[n].model_dump(exclude_none=True) if n in zch else None,
        )
        for n, (_, size, multi) in kinds.items()
    )
    return dense, sparse


def _scan_stats(parts: Sequence[Path], dense_names: list[str],
                kinds: Mapping[str, tuple[str, int | None, bool]], exact: bool) -> dict[str, Any]:
    exprs: list[pl.Expr] = []
    for name in dense_names:
        col = pl.col(name)
        exprs += [col.mean().alias(f"{name}.mean"), col.std(ddof=0).alias(f"{name}.std"),
                  col.min().alias(f"{name}.min"), col.max().alias(f"{name}.max")]
    for name, (_, _, multi) in kinds.items():
        col = pl.col(name)
        if multi:
            exprs.append(col.list.len().mean().alias(f"{name}.len"))
            col = col.explode().drop_nulls()
        exprs.append((col.n_unique() if exact else col.approx_n_unique()).alias(f"{name}.card"))
    if not exprs:
        return {}
    return pl.scan_parquet(list(parts)).select(exprs).collect(engine="streaming").row(
        0, named=True)


def _summary_stats(summary: SplitSummary) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    for name, (mean, std, low, high) in summary.dense_stats().items():
        stats.update({f"{name}.mean": mean, f"{name}.std": std, f"{name}.min": low,
                      f"{name}.max": high})
    stats.update({f"{name}.card": card for name, card in summary.cardinalities().items()})
    return stats


def locate_bad_row(
    schema: Schema, scan: ScannedInput, path: Path, row: int, total_bad: int
) -> InputDataError:
    """The error for the malformed data row ``row``: file, line, column and what is wrong."""
    raw = raw_row(scan, row)
    line = row + 1 + scan.header_lines
    names = [c.name for c in schema.columns]
    hint = ("fix the input, or pass --on-bad-rows skip to drop such rows "
            f"({total_bad:,} in this file)")
    if raw.get(SHORT):
        return InputDataError(f"row has fewer fields than the schema's {len(names)} columns "
                              "(cut short?)", where=f"{path}:{line}", hint=hint)
    if raw.get(EXTRA) is not None:
        return InputDataError(f"row has more fields than the schema's {len(names)} columns",
                              where=f"{path}:{line}:{len(names) + 1}", hint=hint)
    frame = pl.DataFrame({n: [raw.get(n)] for n in names}, schema={n: pl.String for n in names})
    checks: list[tuple[str, pl.Expr, str]] = []
    label = next(c for c in schema.columns if c.role == "label")
    checks.append((label.name, label_value(label, schema.label_rule)[1],
                   "label is not 0 or 1" if schema.label_rule is None
                   else "label matches neither label.map nor a finite number for label.threshold"))
    for column in schema.dense:
        checks.append((column.name, dense_value(column)[1],
                       f"dense value is not a{'n integer' if column.value_type == 'int' else ' number'}"))
    for column in schema.sparse:
        checks.append((column.name, sparse_key(column)[1], f"not a valid {column.value_type} id"))
    for column, _, kind in schema.derived_features():
        assert column.derive is not None
        checks.append((column.name, derived_key(column, kind)[1],
                       f"not a timestamp in format {column.derive.format!r}"))
    for name, expr, what in checks:
        if frame.select(expr).item():
            return InputDataError(
                f"column {name!r}: {what}: {raw.get(name)!r}",
                where=f"{path}:{line}:{names.index(name) + 1}", hint=hint,
            )
    return InputDataError("malformed row", where=f"{path}:{line}", hint=hint)
