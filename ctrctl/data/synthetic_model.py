"""The planted click model and the columns it draws (see :mod:`ctrctl.data.synthetic`).

Categorical values are Zipf ranks; a rank's printed value is a bijective 32-bit hash of it
(distinct ranks, distinct values), printed as 8 lowercase hex digits, or an integer from the
column's value table for Avazu's integer columns. A rank's click effect comes from a table
drawn once per feature and seed, for its :data:`EFFECT_HEAD` most frequent ranks.

Columns whose values come from a fixed table (dense counts from their normal levels, hashes of
ranks, integer values, labels, hours) leave the model as
:class:`~ctrctl.data.synthetic_text.Coded` positions in that table, so the text encoder prints
each table entry once and reads it per row.

Example:
    >>> model = click_model("criteo", seed=0)
    >>> batch = model.batch(chunk=0, start_row=0, n=1000, total_rows=1000)
    >>> batch.table.num_rows, float(batch.prob.mean()) > 0
    (1000, True)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pyarrow as pa

from ctrctl.data.synthetic_specs import (
    AVAZU_COLUMNS,
    EFFECT_HEAD,
    FormatSpec,
    SparseSpec,
    format_spec,
)
from ctrctl.data.synthetic_text import Coded, Column, Dictionary, encode_columns, text_words

#: Rows per chunk; part of the output's definition (chunk k draws from stream (seed, k)).
CHUNK_ROWS = 65_536
#: Frequent ranks of each side of the pairwise interaction that get a pair effect.
INTERACTION_HEAD = 100
#: Avazu's ten days of hours, 2014-10-21 00h to 2014-10-30 23h.
AVAZU_HOURS = 240
#: Ranks whose hashes are tabulated (one 8-byte text word per rank: 512 KiB); rarer ranks
#: of larger vocabularies (about a tenth of their rows) are hashed and printed per row.
HASH_TABLE_MAX = 65_536
#: Negative counts (Criteo's I2) follow the normal levels in a dense column's dictionary.
NEGATIVE_VALUES = (-1, -2, -3)
#: Labels and clicks print from this table.
LABELS = Dictionary(np.array([0, 1], dtype=np.int8))

_FORMAT_STREAM = {"criteo": 0, "avazu": 1}


@dataclass(frozen=True)
class SynthBatch:
    """Rows made in memory: the log columns as a table, and each row's click probability.

    Attributes:
        table: the columns of the log format in file order (Criteo: ``label`` int8,
            ``I1..I13`` int64, ``C1..C26`` 8-hex-digit strings, nulls where missing; Avazu:
            ``id`` uint64, ``click`` int8, ``hour`` int64, then int64 or hex string columns).
        prob: float32 true click probability of each row.
    """

    table: pa.Table
    prob: np.ndarray

    @property
    def labels(self) -> np.ndarray:
        name = "label" if "label" in self.table.column_names else "click"
        return self.table.column(name).to_numpy()


@dataclass(frozen=True)
class PlantedRows:
    """Rows as the planted click model draws them, before anything is printed.

    The model's logit is a sum of parts: per sparse feature with an effect, a value per rank
    below ``len(ClickModel.features[i].effects) - 1`` (rarer ranks and missing: none); per
    dense column with an effect, ``effect * effect_scale * z`` (none where missing); the
    pair table ``ClickModel.pair`` of two features' frequent ranks (Criteo); Avazu's hour.

    Attributes:
        ranks: sparse feature -> intp Zipf rank per row (the feature's cardinality where
            missing; Avazu's missing fields are rank 0).
        z: dense column -> the standard-normal value behind each count (0.0 where missing
            or a negative count).
        prob: float32 true click probability.
        label: int8 sampled click.
    """

    ranks: dict[str, np.ndarray]
    z: dict[str, np.ndarray]
    prob: np.ndarray
    label: np.ndarray


@dataclass(frozen=True)
class ChunkColumns:
    """A chunk's log columns as numpy arrays, before any Arrow or text.

    Attributes:
        names: column names in file order.
        columns: ``(values, missing)`` per column (see :data:`Column`): uint32 values are
            hashes printed as 8 hex digits, other integers print in decimal; values drawn
            from a table are :class:`Coded` positions in it.
        prob: float32 true click probability of each row.
        labels: int8 sampled clicks.
    """

    names: tuple[str, ...]
    columns: list[Column]
    prob: np.ndarray
    labels: np.ndarray

    def table(self) -> pa.Table:
        """The columns as Arrow (hex strings, int64 with nulls where missing)."""
        arrays: list[pa.Array] = []
        for column, missing in self.columns:
            if isinstance(column, Coded):
                values, marked = column.decode(), column.missing()
                if marked is not None:
                    missing = marked if missing is None else missing | marked
            else:
                values = column
            if values.dtype == np.uint32:
                arrays.append(hex_strings(values, None if missing is None else ~missing))
            elif missing is not None:
                arrays.append(int_array(values, missing))
            else:
                arrays.append(pa.array(values))
        return pa.table(dict(zip(self.names, arrays, strict=True)))

    def lines(self, separator: str) -> pa.ChunkedArray:
        """Each row as a text line starting with ``\\n`` (see :func:`encode_columns`)."""
        return encode_columns(self.columns, separator.encode())


# ----------------------------------------------------------------------------- hashing


def _mix32(x: np.ndarray) -> np.ndarray:
    """A bijective 32-bit integer mixer (xorshift-multiply): distinct in, distinct out."""
    x = x ^ (x >> np.uint32(16))
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


class RankHashes(Dictionary):
    """The hashes of the ranks ``[0, cardinality)`` of a feature, as a :class:`Dictionary`
    that tabulates only the first :data:`HASH_TABLE_MAX` (Zipf ranks: the frequent ones).

    Args:
        cardinality: number of ranks.
        salt: the feature's salt (different features hash a rank differently).

    Example:
        >>> hashes = RankHashes(10**6, np.uint32(7))
        >>> len(hashes), hashes.decode(np.array([3, 999_999])).dtype
        (1000000, dtype('uint32'))
    """

    def __init__(self, cardinality: int, salt: np.uint32):
        head = min(cardinality, HASH_TABLE_MAX)
        super().__init__(_mix32(np.arange(head, dtype=np.uint32) ^ salt))
        self.cardinality = cardinality
        self.salt = salt

    def __len__(self) -> int:
        return self.cardinality

    def decode(self, codes: np.ndarray) -> np.ndarray:
        return _mix32(codes.astype(np.uint32) ^ self.salt)

    def words(self, codes: np.ndarray) -> list[np.ndarray]:
        if self.cardinality <= HASH_TABLE_MAX:
            return super().words(codes)
        (table,) = self.tables()  # the first HASH_TABLE_MAX ranks, then the empty text
        words = np.take(table, np.minimum(codes, HASH_TABLE_MAX))  # rare ranks: empty
        at = np.flatnonzero(codes >= HASH_TABLE_MAX)
        rare = codes[at]
        at, rare = at[rare < self.cardinality], rare[rare < self.cardinality]  # not missing
        words[at] = text_words(self.decode(rare))[:, 0]
        return [words]


def hex_strings(values: np.ndarray, valid: np.ndarray | None = None) -> pa.StringArray:
    """8-digit lowercase hex strings of uint32 values, null where ``valid`` is False.

    Built as an Arrow string array straight from a byte buffer (no Python strings).

    Example:
        >>> hex_strings(np.array([255, 3735928559], dtype=np.uint32)).to_pylist()
        ['000000ff', 'deadbeef']
    """
    n = len(values)
    words = text_words(np.ascontiguousarray(values, dtype=np.uint32))  # (n, 1): 8 chars each
    offsets = np.arange(0, 8 * n + 1, 8, dtype=np.int32)
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(offsets), pa.py_buffer(words), _bitmap(valid)
    )


def _bitmap(valid: np.ndarray | None) -> pa.Buffer | None:
    """An Arrow validity bitmap (LSB first) from a boolean mask; None when all are valid."""
    if valid is None or bool(valid.all()):
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def int_array(values: np.ndarray, missing: np.ndarray | None = None) -> pa.Array:
    """An Arrow int64 array over ``values`` (no copy), null where ``missing``."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    valid = None if missing is None else ~missing
    return pa.Array.from_buffers(pa.int64(), len(values), [_bitmap(valid), pa.py_buffer(values)])


# ----------------------------------------------------------------------------- the model


def zipf_ranks(u: np.ndarray, cardinality: int, exponent: float) -> np.ndarray:
    """Ranks in ``[0, cardinality)`` with ``P(r) ~ (r + 1) ** -exponent`` from uniforms ``u``,
    as uint32.

    Inverts the continuous density ``x ** -exponent`` on ``[0.5, cardinality + 0.5]``: each
    rank takes the mass of its unit interval (the midpoint rule), so no table of
    ``cardinality`` entries is built. The inverse is tabulated on :data:`ZIPF_BUCKETS`
    equal slices of ``[0, 1)``: a draw whose slice lies within one rank reads it from the
    table, the others (rare ranks) compute it, which gives the same ranks as computing all.
    """
    return _zipf_positions(u, cardinality, exponent).astype(np.uint32)


def _zipf_positions(u: np.ndarray, cardinality: int, exponent: float) -> np.ndarray:
    """:func:`zipf_ranks` as intp, ready to index tables with (numpy indexes several times
    faster with intp than with narrower integers)."""
    if cardinality == 1:
        return np.zeros(len(u), dtype=np.intp)
    table = _zipf_table(cardinality, exponent)
    if table is None:
        return _zipf_inverse(u, cardinality, exponent)
    ranks = np.take(table, (u * ZIPF_BUCKETS).astype(np.intp))
    between = np.flatnonzero(ranks < 0)
    if len(between):
        ranks[between] = _zipf_inverse(u[between], cardinality, exponent)
    return ranks


#: Slices of ``[0, 1)`` in the tabulated Zipf inverse (see :func:`zipf_ranks`).
ZIPF_BUCKETS = 65_536


def _zipf_inverse(u: np.ndarray, cardinality: int, exponent: float) -> np.ndarray:
    """The rank of each uniform by the inverse of the continuous density, as intp."""
    q = 1.0 - exponent
    lo, hi = 0.5**q, (cardinality + 0.5) ** q
    # x = exp(log(lo + u * (hi - lo)) / q) + 0.5, in place: one temporary stays in cache.
    x = u * (hi - lo)
    x += lo
    np.log(x, out=x)
    x *= 1.0 / q
    np.exp(x, out=x)
    x += 0.5
    ranks = x.astype(np.intp)
    ranks -= 1
    np.clip(ranks, 0, cardinality - 1, out=ranks)
    return ranks


@functools.lru_cache(maxsize=128)
def _zipf_table(cardinality: int, exponent: float) -> np.ndarray | None:
    """intp rank of each slice ``[b, b + 1) / ZIPF_BUCKETS``, -1 where it spans ranks;
    None when over 5% of the mass spans ranks (large vocabularies): computing is faster."""
    edges = np.arange(ZIPF_BUCKETS + 1, dtype=np.float64) / ZIPF_BUCKETS
    first = _zipf_inverse(edges[:-1], cardinality, exponent)
    last = _zipf_inverse(np.nextafter(edges[1:], 0.0), cardinality, exponent)
    if np.mean(first != last) > 0.05:
        return None
    return np.where(first == last, first, -1).astype(np.intp)


#: Levels of the standard normal behind the dense counts (see :func:`_normal_levels`).
NORMAL_LEVELS = 65_536


@functools.lru_cache(maxsize=1)
def _normal_levels() -> np.ndarray:
    """Normal quantiles at the midpoints of :data:`NORMAL_LEVELS` equal-probability slices.

    A dense count draws one level (a 16-bit integer) and reads its value from a table made
    once per column, instead of a normal draw and an ``exp`` per row; the levels reach
    +-4.3 standard deviations.
    """
    inverse = NormalDist().inv_cdf
    return np.array([inverse((i + 0.5) / NORMAL_LEVELS) for i in range(NORMAL_LEVELS)])


@dataclass
class _Feature:
    spec: SparseSpec
    salt: np.uint32
    effects: np.ndarray  # (min(K, EFFECT_HEAD) + 1,) float64; the last entry (rare/missing) 0
    int_values: np.ndarray | None  # (K,) int64 for integer-valued columns
    dictionary: Dictionary  # the printed value of every rank: int_values or hashes


class ClickModel:
    """The planted click model of one format and seed (effects, value tables, bias).

    Args:
        spec: the format's columns.
        seed: the model's seed (the same seed that makes the rows).
    """

    def __init__(self, spec: FormatSpec, seed: int):
        self.spec = spec
        self.seed = seed
        self.features = [self._feature(i, f) for i, f in enumerate(spec.sparse)]
        # Each dense column's count at every normal level: floor(median * exp(sigma * z)).
        z = _normal_levels()
        self.dense_values = [
            np.minimum(np.floor(d.median * np.exp(np.minimum(d.sigma * z, 20.0))), 2.0**31).astype(
                np.int64
            )
            for d in spec.dense
        ]
        # A dense column's codes: its level, or NORMAL_LEVELS + i for NEGATIVE_VALUES[i].
        self.dense_dictionaries = [
            Dictionary(np.concatenate([values, np.array(NEGATIVE_VALUES, dtype=np.int64)]))
            for values in self.dense_values
        ]
        self.hours = Dictionary(_avazu_hours(np.arange(AVAZU_HOURS)))
        self.by_name = {f.spec.name: f for f in self.features}
        self.pair: np.ndarray | None = None
        if spec.interaction is not None:
            a, b, std = spec.interaction
            ha = min(self.by_name[a].spec.cardinality, INTERACTION_HEAD)
            hb = min(self.by_name[b].spec.cardinality, INTERACTION_HEAD)
            rng = np.random.default_rng([seed, 2])
            pair = np.zeros((ha + 1, hb + 1))
            pair[:ha, :hb] = rng.standard_normal((ha, hb)) * std * spec.effect_scale
            self.pair = pair
        self.bias = 0.0
        self.bias = self._solve_bias()

    def _feature(self, index: int, spec: SparseSpec) -> _Feature:
        rng = np.random.default_rng([self.seed, 1, index])
        salt = np.uint32(rng.integers(0, 2**32, dtype=np.uint64))
        head = min(spec.cardinality, EFFECT_HEAD)
        effects = np.zeros(head + 1)
        if spec.effect:
            effects[:head] = rng.standard_normal(head) * spec.effect * self.spec.effect_scale
        int_values = None
        if spec.is_int:
            listed = np.array(spec.values or (), dtype=np.int64)[: spec.cardinality]
            extra = spec.cardinality - len(listed)
            low, high = spec.value_range or (int(listed.max()) + 1, int(listed.max()) + 1)
            pool = np.setdiff1d(np.arange(low, high + 1, dtype=np.int64), listed)
            if len(pool) < extra:  # a cardinality beyond the real range: continue past it
                pool = np.concatenate(
                    [pool, np.arange(extra - len(pool), dtype=np.int64) + high + 1]
                )
            int_values = np.concatenate([listed, rng.permutation(pool)[:extra]])
        dictionary = (
            Dictionary(int_values)
            if int_values is not None
            else RankHashes(spec.cardinality, salt)
        )
        return _Feature(spec, salt, effects, int_values, dictionary)

    def _solve_bias(self) -> float:
        """The bias giving the target label rate, by bisection on a calibration sample."""
        rng = np.random.default_rng([self.seed, 3])
        logits = self._draw(rng, CHUNK_ROWS, start_row=0, total_rows=CHUNK_ROWS)[0]
        lo, hi = -15.0, 15.0
        for _ in range(60):
            mid = (lo + hi) / 2
            rate = float(np.mean(1.0 / (1.0 + np.exp(-(logits + mid)))))
            lo, hi = (mid, hi) if rate < self.spec.target_label_rate else (lo, mid)
        return (lo + hi) / 2

    def _draw(
        self, rng: np.random.Generator, n: int, start_row: int, total_rows: int
    ) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Logits (without bias) and raw columns of ``n`` rows.

        Returns:
            logits (n,), sparse name -> ranks, dense name -> codes in the column's
            dictionary; both intp, the dictionary's missing code where missing.
        """
        spec = self.spec
        logits = np.zeros(n)
        # Scratch arrays reused feature after feature stay in cache (a fresh temporary per
        # step would not); rng.random(n, out=u) draws what rng.random(n) would.
        u = np.empty(n)
        effect = np.empty(n)
        index = np.empty(n, dtype=np.intp)
        missing: dict[str, np.ndarray] = {}
        for group, rate in spec.groups.items():
            if group in spec.complements:
                missing[group] = ~missing[spec.complements[group]]
            else:
                missing[group] = rng.random(n, out=u) < rate
        dense: dict[str, np.ndarray] = {}
        for d, dictionary in zip(spec.dense, self.dense_dictionaries, strict=True):
            level = rng.integers(0, NORMAL_LEVELS, n, dtype=np.uint16).astype(np.intp)
            mask = missing.get(d.group) if d.group else None
            if d.effect:
                np.take(_normal_levels(), level, out=effect, mode="clip")  # unbuffered
                effect *= d.effect * spec.effect_scale
                if mask is not None:
                    np.putmask(effect, mask, 0.0)
                logits += effect
            codes = level
            if d.negative_rate:
                negative = np.flatnonzero(rng.random(n) < d.negative_rate)
                # Mostly -1, rarely -2 or -3, as Criteo's I2.
                deeper = rng.random(len(negative)) < 0.05
                deepest = rng.random(len(negative)) < 0.3
                codes[negative] = NORMAL_LEVELS + deeper * (1 + deepest.astype(np.intp))
            if mask is not None:
                np.putmask(codes, mask, dictionary.missing_code)
            dense[d.name] = codes
        sparse: dict[str, np.ndarray] = {}
        placeholder = spec.name == "avazu"  # Avazu has no empty fields: rank 0 stands in
        for f in self.features:
            s = f.spec
            mask = missing.get(s.group) if s.group else None
            rng.random(n, out=u)
            if mask is not None and placeholder:
                ranks = _zipf_positions(u, max(s.cardinality - 1, 1), s.exponent) + 1
                np.minimum(ranks, s.cardinality - 1, out=ranks)
                np.putmask(ranks, mask, 0)
                mask = None
            else:
                ranks = _zipf_positions(u, s.cardinality, s.exponent)
                if mask is not None:
                    # The missing code, cardinality, is past every rank: in the effect and
                    # pair tables below it reads the last entry (no effect), as rare ranks.
                    np.putmask(ranks, mask, f.dictionary.missing_code)
            if s.effect:
                np.minimum(ranks, len(f.effects) - 1, out=index)
                logits += np.take(f.effects, index, out=effect, mode="clip")
            sparse[s.name] = ranks
        if self.pair is not None and spec.interaction is not None:
            a, b, _ = spec.interaction
            ia = np.minimum(sparse[a], self.pair.shape[0] - 1)
            ib = np.minimum(sparse[b], self.pair.shape[1] - 1)
            logits += np.take(self.pair.ravel(), ia * self.pair.shape[1] + ib)
        if spec.name == "avazu":
            hours = _avazu_hour_index(start_row, n, total_rows)
            logits += 0.2 * np.sin(2 * np.pi * (hours % 24) / 24.0)
        return logits, sparse, dense

    def _sample(
        self, chunk: int, start_row: int, n: int, total_rows: int
    ) -> tuple[np.random.Generator, dict[str, np.ndarray], dict[str, np.ndarray],
               np.ndarray, np.ndarray]:
        """A chunk's draws: its generator (past the labels), ranks, dense codes, true
        probabilities and labels."""
        stream = _FORMAT_STREAM[self.spec.name]
        rng = np.random.default_rng([self.seed, 4, stream, chunk])
        logits, sparse, dense = self._draw(rng, n, start_row, total_rows)
        prob = (1.0 / (1.0 + np.exp(-(logits + self.bias)))).astype(np.float32)
        label = (rng.random(n) < prob).astype(np.int8)
        return rng, sparse, dense, prob, label

    def planted(self, chunk: int, start_row: int, n: int, total_rows: int) -> PlantedRows:
        """The same rows as :meth:`columns`, as the click model sees them (module docstring):
        for fitting a model told the planted structure, the ceiling of what the rows teach."""
        _, sparse, dense, prob, label = self._sample(chunk, start_row, n, total_rows)
        levels = _normal_levels()
        z = {}
        for name, codes in dense.items():
            normal = codes < NORMAL_LEVELS  # not missing, not one of NEGATIVE_VALUES
            z[name] = np.where(normal, levels[np.where(normal, codes, 0)], 0.0)
        return PlantedRows(sparse, z, prob, label)

    def columns(self, chunk: int, start_row: int, n: int, total_rows: int) -> ChunkColumns:
        """Rows ``[start_row, start_row + n)`` of chunk ``chunk`` as raw columns."""
        rng, sparse, dense, prob, label = self._sample(chunk, start_row, n, total_rows)
        columns: dict[str, Column] = {}
        if self.spec.name == "avazu":
            columns["id"] = (rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False), None)
            columns["click"] = (Coded(label.astype(np.intp), LABELS), None)
            hours = _avazu_hour_index(start_row, n, total_rows)
            if n and int(hours[-1]) < AVAZU_HOURS:
                columns["hour"] = (Coded(hours, self.hours), None)
            else:  # rows past total_rows: hours past the tenth day
                columns["hour"] = (_avazu_hours(hours), None)
        else:
            columns["label"] = (Coded(label.astype(np.intp), LABELS), None)
            for d, dictionary in zip(self.spec.dense, self.dense_dictionaries, strict=True):
                columns[d.name] = (Coded(dense[d.name], dictionary), None)
        for f in self.features:
            columns[f.spec.name] = (Coded(sparse[f.spec.name], f.dictionary), None)
        names = AVAZU_COLUMNS if self.spec.name == "avazu" else tuple(columns)
        return ChunkColumns(names, [columns[name] for name in names], prob, label)

    def batch(self, chunk: int, start_row: int, n: int, total_rows: int) -> SynthBatch:
        """Rows ``[start_row, start_row + n)`` of chunk ``chunk`` as a :class:`SynthBatch`."""
        raw = self.columns(chunk, start_row, n, total_rows)
        return SynthBatch(raw.table(), raw.prob)


def _avazu_hour_index(start_row: int, n: int, total_rows: int) -> np.ndarray:
    """Hours since the first one: rows are in time order over ten days, as the real file."""
    rows = np.arange(start_row, start_row + n, dtype=np.intp)
    return rows * AVAZU_HOURS // max(total_rows, 1)


def _avazu_hours(hours: np.ndarray) -> np.ndarray:
    """Avazu's YYMMDDHH of hours since 2014-10-21 00h: day 21 + h // 24, hour h % 24."""
    return (14_100_000 + (21 + hours // 24) * 100 + hours % 24).astype(np.int64)


@functools.lru_cache(maxsize=8)
def click_model(
    format: str, seed: int, cardinalities: tuple[tuple[str, int], ...] = ()
) -> ClickModel:
    """The (cached) click model of a format, seed and cardinality overrides."""
    spec = format_spec(format).with_cardinalities(dict(cardinalities))
    return ClickModel(spec, seed)
