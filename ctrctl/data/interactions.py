"""Implicit-feedback logs (schemas with ``interactions:``): positives and leave-last-out.

A retrieval dataset keeps positives only (rows labelled 1, or every row with
``positives: all``). Its default split is leave-last-out: per user, by time, the last
positive is ``test``, the one before it ``val`` and the rest ``train``; ties in time keep
file order. ``--split-ratio`` divides the positives at random instead.

Example (one user, times 5, 1, 9, 3)::

    time     5      1      9      3
    order    2nd    0th    3rd    1st      (ascending time)
    split    val    train  test   train
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from ctrctl.data.manifest import DatasetManifest
from ctrctl.data.readers import InputSource
from ctrctl.data.schema import Schema
from ctrctl.data.transforms import ROW, label_value
from ctrctl.errors import DatasetError

__all__ = ["interaction_columns", "leave_last_out_applies", "leave_last_out_split",
           "positive_rows", "read_split_frame", "user_history"]


def leave_last_out_applies(schema: Schema, sources: Sequence[InputSource],
                           ratio: tuple[float, float, float] | None,
                           split_by_day: bool) -> bool:
    """Whether the inputs are divided leave-last-out: an interactions schema, no ratio, no
    day split, and every input without a split name."""
    return (schema.interactions is not None and ratio is None and not split_by_day
            and all(s.split is None for s in sources))


def positive_rows(schema: Schema) -> pl.Expr:
    """The rows an interactions schema keeps: positives, plus malformed labels (so that they
    are still reported as bad rows)."""
    assert schema.interactions is not None
    if schema.interactions.positives == "all":
        return pl.lit(True)
    label = next(c for c in schema.columns if c.role == "label")
    value, bad = label_value(label, schema.label_rule)
    return (value == 1) | bad


def leave_last_out_split(schema: Schema) -> pl.Expr:
    """``"train"``, ``"val"`` or ``"test"`` per row of a frame of positives (raw columns)."""
    assert schema.interactions is not None
    user = pl.col(schema.interactions.user)
    time = pl.col(schema.interactions.time).str.strip_chars().cast(pl.Float64, strict=False)
    # position of the row within its user's positives, counted from the latest (0 = last)
    from_end = pl.int_range(pl.len(), dtype=pl.Int64).over(
        user, order_by=[time, pl.col(ROW)], descending=True)
    return (pl.when(from_end == 0).then(pl.lit("test"))
            .when(from_end == 1).then(pl.lit("val"))
            .otherwise(pl.lit("train")))


def read_split_frame(folder: str | Path, manifest: DatasetManifest, split: str,
                     columns: Sequence[str]) -> pl.DataFrame:
    """The ``columns`` of one split of a dataset (empty when the split is absent)."""
    if split not in manifest.splits:
        return pl.DataFrame({c: [] for c in columns}, schema={c: pl.Int64 for c in columns})
    files = [Path(folder) / f for f in manifest.split(split).files]
    return pl.concat([pl.read_parquet(f, columns=list(columns)) for f in files])


def user_history(folder: str | Path, manifest: DatasetManifest, user: str, item: str,
                 splits: Sequence[str]) -> dict[int, list[int]]:
    """User id -> the item ids of the user's interactions in ``splits`` (file order)."""
    frames = [read_split_frame(folder, manifest, s, [user, item]) for s in splits]
    frame = pl.concat(frames) if frames else pl.DataFrame({user: [], item: []})
    grouped = frame.group_by(user, maintain_order=True).agg(pl.col(item))
    return dict(zip(grouped[user].to_list(), grouped[item].to_list(), strict=True))


def interaction_columns(manifest: DatasetManifest) -> tuple[str, str, dict[str, list[str]]]:
    """(user column, item id column, features per tower) of a retrieval dataset.

    Raises:
        DatasetError: the dataset was not preprocessed with an ``interactions:`` schema.
    """
    schema = Schema.from_dict(manifest.schema, where="manifest.json")
    if schema.interactions is None:
        raise DatasetError("the dataset is not an interaction log (its schema has no "
                           "interactions: section)", where="manifest.json",
                           hint="preprocess with schemas/movielens_retrieval.yaml or another "
                                "schema with role: query / item_id features")
    towers = schema.towers()
    if schema.interactions.user not in towers["query"]:
        raise DatasetError(f"interactions.user {schema.interactions.user!r} is not a "
                           "role: query feature", where="manifest.json")
    return schema.interactions.user, towers["item"][0], towers
