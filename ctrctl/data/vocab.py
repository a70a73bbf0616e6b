"""Vocabularies of sparse features in vocabulary mode, and the id encoding of every feature.

A vocabulary is built on the training split only: keys seen at least ``min_count`` times get
ids ``1..V`` in order of falling count (ties by key), every other key, including keys first
seen in validation, test or later logs, gets id 0 (out of vocabulary). A missing value is a
key like any other (null), so a frequent "missing" gets its own id. ``num_embeddings`` is
``V + 1``. Each vocabulary is saved as ``vocab/<feature>.parquet`` with columns
``value, count, id``.

Example:
    >>> vocabs = build_vocabs(train_parts, {"C1": 5})   # {'C1': DataFrame(value, count, id)}
    >>> encoded = encode(lf, kinds, vocabs)             # ids in [0, num_embeddings)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import polars as pl

from ctrctl.data.transforms import encode_hash
from ctrctl.errors import DatasetError

VOCAB_DIR = "vocab"
#: The key type of each raw value type (see ctrctl.data.transforms.sparse_key).
KEY_DTYPES: dict[str, pl.DataType] = {"hex": pl.UInt64(), "int": pl.Int64(), "string": pl.String()}


def build_vocabs(
    parts: Sequence[Path], min_counts: Mapping[str, int], multi_hot: Mapping[str, bool]
) -> dict[str, pl.DataFrame]:
    """Count keys over ``parts`` (Parquet of parsed keys) and keep the frequent ones.

    Args:
        parts: the training split's staged Parquet files (keys, not ids).
        min_counts: feature -> frequency threshold.
        multi_hot: feature -> values are lists (each element counts once).
    """
    vocabs: dict[str, pl.DataFrame] = {}
    if not min_counts:
        return vocabs
    scan = pl.scan_parquet(list(parts))
    # One feature at a time: the count table of a feature holds every distinct key (millions
    # for Criteo's big features), so counting all at once would hold them all together.
    for name, min_count in min_counts.items():
        keys = scan.select(pl.col(name).alias("value"))
        if multi_hot.get(name, False):
            keys = keys.explode("value")
            keys = keys.filter(pl.col("value").is_not_null())
        vocabs[name] = (
            keys.group_by("value")
            .agg(pl.len().cast(pl.Int64).alias("count"))
            .filter(pl.col("count") >= min_count)
            .sort(["count", "value"], descending=[True, False], nulls_last=True)
            .with_row_index("id", offset=1)
            .select("value", "count", pl.col("id").cast(pl.Int64))
            .collect(engine="streaming")
        )
    return vocabs


def save_vocabs(vocabs: Mapping[str, pl.DataFrame], folder: Path) -> list[str]:
    """Write ``folder/vocab/<feature>.parquet``; returns the relative paths."""
    target = folder / VOCAB_DIR
    target.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, frame in vocabs.items():
        frame.write_parquet(target / f"{name}.parquet")
        paths.append(f"{VOCAB_DIR}/{name}.parquet")
    return paths


def load_vocabs(folder: Path, names: Sequence[str]) -> dict[str, pl.DataFrame]:
    """Read the vocabularies of ``names`` from a dataset folder."""
    vocabs = {}
    for name in names:
        path = folder / VOCAB_DIR / f"{name}.parquet"
        if not path.is_file():
            raise DatasetError(f"vocabulary of feature {name!r} is missing", where=str(path),
                               hint="the dataset is incomplete: preprocess it again")
        vocabs[name] = pl.read_parquet(path)
    return vocabs


def encode(
    frame: pl.LazyFrame,
    kinds: Mapping[str, tuple[str, int | None, bool]],
    vocabs: Mapping[str, pl.DataFrame],
) -> pl.LazyFrame:
    """Replace each sparse feature's keys by ids: hashed, or looked up in its vocabulary.

    Args:
        frame: parsed rows (sparse columns hold keys).
        kinds: feature -> (key kind, hash size or None, multi-hot), from
            :func:`ctrctl.data.transforms.sparse_kinds`.
        vocabs: feature -> vocabulary, for every feature whose hash size is None.
    """
    hashed = [
        encode_hash(name, kind, size, multi)
        for name, (kind, size, multi) in kinds.items()
        if size is not None
    ]
    if hashed:
        frame = frame.with_columns(hashed)
    looked_up = []
    for name, (kind, size, multi) in kinds.items():
        if size is not None:
            continue
        vocab = vocabs[name].with_columns(pl.col("value").cast(KEY_DTYPES[kind]))
        # Keys not in the vocabulary (null keys match null) get id 0, out-of-vocabulary.
        if multi:
            looked_up.append(pl.col(name).list.eval(
                pl.element().replace_strict(vocab["value"], vocab["id"], default=0,
                                            return_dtype=pl.Int64)))
        else:
            looked_up.append(pl.col(name).replace_strict(
                vocab["value"], vocab["id"], default=0, return_dtype=pl.Int64))
    if looked_up:
        frame = frame.with_columns(looked_up)
    return frame


def encode_file(
    source: Path,
    target: Path,
    kinds: Mapping[str, tuple[str, int | None, bool]],
    vocabs: Mapping[str, pl.DataFrame],
    row_group_size: int,
    compression: str,
) -> None:
    """Encode a staged Parquet file one row group at a time into ``target``.

    Batch by batch because a vocabulary lookup (``replace_strict``) inside a streaming query
    holds the whole input in memory; here memory is one batch plus the vocabularies.
    """
    import pyarrow.parquet as pq

    writer: pq.ParquetWriter | None = None
    try:
        for batch in pq.ParquetFile(source).iter_batches(batch_size=row_group_size):
            frame = pl.from_arrow(batch)
            assert isinstance(frame, pl.DataFrame)
            table = encode(frame.lazy(), kinds, vocabs).collect().to_arrow()
            if writer is None:
                writer = pq.ParquetWriter(target, table.schema, compression=compression)
            writer.write_table(table, row_group_size=row_group_size)
    finally:
        if writer is not None:
            writer.close()


def num_embeddings(
    kinds: Mapping[str, tuple[str, int | None, bool]], vocabs: Mapping[str, pl.DataFrame]
) -> dict[str, int]:
    """Feature -> table rows: the hash size, or vocabulary size + 1 (the OOV id)."""
    return {
        name: size if size is not None else vocabs[name].height + 1
        for name, (_, size, _) in kinds.items()
    }
