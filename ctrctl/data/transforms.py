"""Column transforms as polars expressions: parse, validate, transform, encode.

Every raw column is read as a string (null when empty), so that one bad value marks its row
instead of failing the whole read. Each feature gives two expressions: its parsed value and a
boolean "this raw value is malformed". A row's bad reason is the first that applies, in the
order of :data:`BAD_REASONS`.

Sparse features go through two steps: :func:`sparse_key` parses the raw value into a *key*
(an unsigned int for hex, a signed int for int, the string itself for string), and
:func:`encode_hash` or a vocabulary lookup (``ctrctl.data.vocab``) turn keys into ids in ``[0, num_embeddings)``.

Example:
    >>> value, bad = dense_value(column)     # column: a schema Column with role dense
    >>> lf.select(value.alias(column.name), bad.alias("bad"))
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import polars as pl

from ctrctl.data.manifest import TIME_COLUMN
from ctrctl.data.schema import DERIVED_SIZES, Column, LabelRule, Schema

#: Bad-row reasons in priority order; a row's code is 1 + the index of its first reason.
BAD_REASONS: tuple[str, ...] = ("too_many_fields", "bad_label", "bad_dense", "bad_sparse",
                                "too_few_fields")
#: The extra column that is non-null only on rows with more fields than the schema.
EXTRA = "__extra"
#: True on a TSV row with fewer fields than the schema: its absent fields would read as
#: empty ones, so a row cut short would pass as missing values.
SHORT = "__short"
#: The 0-based row number within an input (a line number once the header is added).
ROW = "__row"
#: The bad-reason code of a row (0 = good).
BAD = "__bad"
#: The split a row goes to, when inputs are divided at random.
SPLIT = "__split"
#: Polars' string hash is stable within a polars version only; the seed is fixed.
STRING_HASH_SEED = 0
#: ``sparse_kinds``' size of a managed-collision feature: raw keys, no modulo.
RAW_KEYS = 0


def stable_key(text: str) -> int:
    """The raw 64-bit key of a string value of a managed-collision feature: the first
    8 bytes of its BLAKE2b digest as a signed little-endian int. It depends on nothing but
    the text, so serving (and the standalone loader, with the stdlib alone) computes it too.
    """
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def label_value(column: Column, rule: LabelRule | None = None) -> tuple[pl.Expr, pl.Expr]:
    """(label as int8, malformed) of the label column; missing is malformed.

    Without a rule the label must be exactly "0" or "1"; with ``rule.map`` the raw text is
    looked up (anything else is malformed); with ``rule.threshold`` the raw number is compared
    (1 when >= threshold; not a finite number, nan or inf, is malformed).
    """
    raw = pl.col(column.name)
    if rule is not None and rule.map is not None:
        mapped = raw.replace_strict(list(rule.map), list(rule.map.values()), default=None,
                                    return_dtype=pl.Int8)
        return mapped.fill_null(0), mapped.is_null()
    if rule is not None and rule.threshold is not None:
        number = raw.str.strip_chars().cast(pl.Float64, strict=False)
        # nan and inf read as numbers, and nan compares above every threshold (a click)
        bad = number.is_null() | ~number.is_finite()
        return (number >= rule.threshold).fill_null(False).cast(pl.Int8), bad
    value = (raw == "1").cast(pl.Int8)
    bad = ~raw.is_in(["0", "1"]).fill_null(False)
    return value, bad


def _parse_number(raw: pl.Expr, value_type: str) -> pl.Expr:
    if value_type == "int":
        return raw.str.to_integer(strict=False).cast(pl.Float64)
    return raw.cast(pl.Float64, strict=False)


def dense_value(column: Column) -> tuple[pl.Expr, pl.Expr]:
    """(transformed float32 value, malformed) of a dense column.

    log1p: missing -> ``fill``, negatives -> 0, then log(x + 1) (the DLRM convention);
    none: missing -> ``fill``; clip: missing -> ``fill``, then clipped to ``clip``.
    """
    raw = pl.col(column.name)
    parsed = _parse_number(raw, column.value_type)
    bad = parsed.is_null() & raw.is_not_null()
    if column.value_type == "float":
        bad = bad | parsed.is_nan() | parsed.is_infinite()
    value = parsed.fill_null(column.fill)
    if column.transform == "log1p":
        value = value.clip(lower_bound=0.0).log1p()
    elif column.transform == "clip":
        assert column.clip is not None
        value = value.clip(column.clip[0], column.clip[1])
    return value.cast(pl.Float32), bad


def _parse_key(raw: pl.Expr, value_type: str) -> pl.Expr:
    if value_type == "hex":
        return raw.str.to_integer(base=16, dtype=pl.UInt64, strict=False)
    if value_type == "int":
        return raw.str.to_integer(strict=False)
    return raw


def sparse_key(column: Column) -> tuple[pl.Expr, pl.Expr]:
    """(key, malformed) of a sparse column: a scalar key, or a list of keys if multi-hot.

    A multi-hot field is split on its separator; empty elements are dropped and a missing
    field is an empty list.
    """
    raw = pl.col(column.name)
    kind = column.value_type
    if column.multi_hot_separator is None:
        key = _parse_key(raw, kind)
        if kind == "string":
            return key, pl.lit(False)
        return key, key.is_null() & raw.is_not_null()
    parts = raw.fill_null("").str.split(column.multi_hot_separator).list.eval(
        pl.element().filter(pl.element() != "")
    )
    if kind == "string":
        return parts, pl.lit(False)
    keys = parts.list.eval(_parse_key(pl.element(), kind))
    bad = keys.list.eval(pl.element().is_null()).list.any()
    return keys, bad


def derived_key(column: Column, kind: str) -> tuple[pl.Expr, pl.Expr]:
    """(value, malformed) of a feature derived from a timestamp column."""
    assert column.derive is not None
    raw = pl.col(column.name)
    text, fmt = raw, column.derive.format
    if "%H" in fmt and "%M" not in fmt:
        # polars wants minutes beside hours (YYMMDDHH has none): append a zero minute.
        text, fmt = raw + "00", fmt + "%M"
    stamp = text.str.strptime(pl.Datetime, fmt, strict=False)
    if kind == "hour_of_day":
        value = stamp.dt.hour()
    elif kind == "weekday":
        value = stamp.dt.weekday()
    else:
        value = stamp.dt.day()
    return value.cast(pl.Int64), stamp.is_null() & raw.is_not_null()


def time_value(column: Column) -> tuple[pl.Expr, pl.Expr]:
    """(value, malformed) of the schema's ``time_column``: the data time in days (float64).

    A number is taken as days; a column with ``derive.format`` is a timestamp, read as days
    since 1970-01-01 (UTC). A missing or unreadable time is malformed: a ``ttl`` table could
    not place the row in time.
    """
    raw = pl.col(column.name)
    if column.derive is not None:
        text, fmt = raw, column.derive.format
        if "%H" in fmt and "%M" not in fmt:  # as derived_key: polars wants minutes
            text, fmt = raw + "00", fmt + "%M"
        stamp = text.str.strptime(pl.Datetime("us"), fmt, strict=False)
        value = stamp.dt.epoch("us").cast(pl.Float64) / (86_400 * 1e6)
    else:
        value = raw.str.strip_chars().cast(pl.Float64, strict=False)
    return value, value.is_null() | value.is_nan()


def _raw_one(key: pl.Expr, kind: str) -> pl.Expr:
    """A managed-collision key as int64: ints as they are, hex bits reinterpreted as signed,
    strings through :func:`stable_key`."""
    if kind == "string":
        return key.map_elements(stable_key, return_dtype=pl.Int64, skip_nulls=True)
    if kind == "hex":
        return key.cast(pl.UInt64).reinterpret(signed=True)
    return key.cast(pl.Int64)


def _hash_one(key: pl.Expr, kind: str, size: int) -> pl.Expr:
    if size == RAW_KEYS:
        return _raw_one(key, kind)
    if kind == "string":
        # Expr.hash gives null a hash of its own; keep a missing value missing (-> id 0).
        return pl.when(key.is_not_null()).then(key.hash(seed=STRING_HASH_SEED) % size).cast(
            pl.Int64)
    # polars' % is a floor modulo: a negative int key still lands in [0, size).
    return (key % size).cast(pl.Int64)


def encode_hash(name: str, kind: str, size: int, multi_hot: bool) -> pl.Expr:
    """Ids of hashed feature ``name`` (keys in that column): key mod ``size``, missing -> 0;
    ``size`` :data:`RAW_KEYS`: the raw 64-bit key itself (a managed-collision feature)."""
    key = pl.col(name)
    if multi_hot:
        return key.list.eval(_hash_one(pl.element(), kind, size)).alias(name)
    return _hash_one(key, kind, size).fill_null(0).alias(name)


def bad_code(reasons: dict[str, list[pl.Expr]]) -> pl.Expr:
    """The row's bad code: 1 + index of its first reason in :data:`BAD_REASONS`, else 0."""
    chain: Any = None
    for index, reason in enumerate(BAD_REASONS):
        exprs = reasons.get(reason, [])
        if not exprs:
            continue
        flag = pl.any_horizontal(exprs) if len(exprs) > 1 else exprs[0]
        if chain is None:
            chain = pl.when(flag).then(pl.lit(index + 1, pl.UInt8))
        else:
            chain = chain.when(flag).then(pl.lit(index + 1, pl.UInt8))
    code = pl.lit(0, pl.UInt8) if chain is None else chain.otherwise(pl.lit(0, pl.UInt8))
    return code.alias(BAD)


def parsed_columns(schema: Schema) -> tuple[list[pl.Expr], pl.Expr]:
    """The expressions from raw string columns to parsed ones, and the row's bad code.

    Output columns: label (int8), dense (float32, transformed), sparse keys (see
    :func:`sparse_key`), derived keys, and the data time (:data:`TIME_COLUMN`, see
    :func:`time_value`) when the schema names a ``time_column``; in the dataset's order.
    """
    label = next(c for c in schema.columns if c.role == "label")
    value, bad = label_value(label, schema.label_rule)
    out = [value.alias(label.name)]
    reasons: dict[str, list[pl.Expr]] = {
        "too_many_fields": [pl.col(EXTRA).is_not_null()],
        "bad_label": [bad],
        "bad_dense": [],
        "bad_sparse": [],
        "too_few_fields": [pl.col(SHORT)],
    }
    for column in schema.dense:
        value, bad = dense_value(column)
        out.append(value.alias(column.name))
        reasons["bad_dense"].append(bad)
    for column in schema.sparse:
        value, bad = sparse_key(column)
        out.append(value.alias(column.name))
        reasons["bad_sparse"].append(bad)
    for column, name, kind in schema.derived_features():
        value, bad = derived_key(column, kind)
        out.append(value.alias(name))
        reasons["bad_sparse"].append(bad)
    if schema.time_column is not None:
        # Counted as a bad sparse value: the time serves the ttl tables' remapping.
        value, bad = time_value(next(c for c in schema.columns if c.name == schema.time_column))
        out.append(value.alias(TIME_COLUMN))
        reasons["bad_sparse"].append(bad)
    return out, bad_code(reasons)


def sparse_kinds(schema: Schema) -> dict[str, tuple[str, int | None, bool]]:
    """Feature -> (key kind, hash size, None for vocabulary mode or :data:`RAW_KEYS` for
    managed collisions, multi-hot)."""
    kinds: dict[str, tuple[str, int | None, bool]] = {
        c.name: (c.value_type, RAW_KEYS if c.collision is not None else c.hash_size,
                 c.multi_hot_separator is not None)
        for c in schema.sparse
    }
    for _, name, kind in schema.derived_features():
        kinds[name] = ("int", DERIVED_SIZES[kind], False)
    return kinds


def random_unit(row: pl.Expr, stream: int, seed: int) -> pl.Expr:
    """A uniform float in [0, 1) per row from (seed, stream, row): splitmix64 finalizer.

    Pure integer arithmetic (UInt64 wraps), so the split is identical across machines and
    polars versions, unlike ``Expr.hash``.
    """
    # The (seed, stream) offset is itself mixed, so that another seed is not a shift of rows.
    base = _splitmix64(_splitmix64(seed) ^ stream)
    z = row.cast(pl.UInt64) * pl.lit(0x9E3779B97F4A7C15, pl.UInt64) + pl.lit(base, pl.UInt64)
    z = (z ^ (z // 2**30)) * pl.lit(0xBF58476D1CE4E5B9, pl.UInt64)
    z = (z ^ (z // 2**27)) * pl.lit(0x94D049BB133111EB, pl.UInt64)
    z = z ^ (z // 2**31)
    return (z // 2**11).cast(pl.Float64) * (1.0 / 2**53)


def random_unit_numpy(row: np.ndarray, stream: int, seed: int) -> np.ndarray:
    """:func:`random_unit` of uint64 row numbers in numpy: the same floats, bit for bit."""
    base = np.uint64(_splitmix64(_splitmix64(seed) ^ stream))
    with np.errstate(over="ignore"):
        z = row.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + base
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def _splitmix64(value: int) -> int:
    mask = 2**64 - 1
    z = (value + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)
