"""Raw log columns -> model inputs, column by column: the serving artifact's encoder.

Copied into every artifact as ``serving_encoder.py`` beside ``serving.py``, which loads it
by file path; like the loader it must not import ctrctl (numpy only; polars only through the
string hasher the loader hands in). It gives the ids and dense values of the preprocess step
(``ctrctl.data.transforms``, ``ctrctl.data.vocab``), one numpy operation per column instead
of one Python call per value:

- dense: missing -> ``fill``, then log1p (negatives -> 0) or clip, as float32;
- hex / int keys: parsed from the digits' bytes as one (rows x digits) matrix;
- hash mode: key mod hash size (floor modulo), missing -> id 0; vocabulary mode: a binary
  search in the sorted keys built once at load (``null`` is the key of a missing value,
  unseen keys id 0); id mode: the id itself, in range; zch mode (managed collisions): the
  raw 64-bit key (hex bits read as signed, strings through :func:`stable_key`), missing ->
  0, which the exported program maps to a slot;
- string hash: the loader's hasher (polars' hash, proven on the artifact's probes);
- derived features (``hour_of_day`` 0-23, ISO ``weekday`` 1-7, ``day`` 1-31) from their raw
  timestamp column, e.g. Avazu's ``hour`` (``YYMMDDHH``).

A column the contract does not know, a value of the wrong type or form, or a column whose
length is not the row count is an :class:`EncodeError` naming the feature, the row and what
was expected; the loader raises it as its ``InputError``.

Example:
    >>> encoder = Encoder(manifest["input"], vocabularies, hasher)
    >>> dense, ids, lengths = encoder.encode({"hour": ["14102100"], "C1": ["1005"]}, 1)
"""

import hashlib
import itertools
import os
import re
import sys

import numpy as np

#: Text or numbers a raw field may hold; anything else (a list, a dict, a bool) is refused.
_NONE = type(None)
#: Digit values of ASCII bytes (255: not a digit of any base; 254: NUL, the padding of the
#: fixed-width byte strings numpy makes of a column).
_DIGITS = np.full(256, 255, np.uint8)
for _value, _char in enumerate(b"0123456789abcdef"):
    _DIGITS[_char] = _value
for _value, _char in enumerate(b"ABCDEF"):
    _DIGITS[_char] = 10 + _value
_DIGITS[0] = 254
_DERIVED_SIZES = {"hour_of_day": 24, "weekday": 8, "day": 32}
#: Raw text -> id entries remembered per feature (then forgotten and refilled): categorical
#: values repeat, and a dict lookup costs a fraction of parsing and hashing again.
CACHE_LIMIT = 200_000


class EncodeError(ValueError):
    """A raw value or column the contract does not accept.

    Attributes:
        feature: the column (or derived feature) at fault, None for the whole request.
        row: the row index, None when the whole column is at fault.
        expected: what the contract expects there.
    """

    def __init__(self, feature, row, expected, got=None):
        self.feature, self.row, self.expected = feature, row, expected
        where = ", ".join(p for p in (f"column {feature!r}" if feature is not None else "",
                                      f"row {row}" if row is not None else "") if p)
        text = f"expected {expected}"
        if got is not None:
            shown = repr(got)
            text += f", got {shown[:60] + '...' if len(shown) > 60 else shown}"
        super().__init__(f"{where}: {text}" if where else text)


def raw_columns(contract):
    """The raw columns a contract accepts, in order; an artifact written before raw columns
    were recorded takes one column per feature."""
    if "columns" in contract:
        return list(contract["columns"])
    return [d["name"] for d in contract["dense"]] + [s["name"] for s in contract["sparse"]]


class Encoder:
    """The contract's encoding, with vocabularies indexed once.

    Args:
        contract: the manifest's ``input``.
        vocabularies: feature -> {key text: id} of vocabulary-mode features.
        string_hasher: feature entry -> a function (list of str) -> list of ids; called
            the first time a string-hashed feature has values.
    """

    def __init__(self, contract, vocabularies, string_hasher):
        self.contract = contract
        self.columns = raw_columns(contract)
        self._known = set(self.columns)
        self._ignored = set(contract.get("ignored", [])) | {contract.get("label")} - {None}
        self._string_hasher = string_hasher
        kinds = {f["name"]: f.get("type") for f in contract["sparse"]}
        self._vocab = {name: _Vocabulary(mapping, kinds[name])
                       for name, mapping in vocabularies.items()}
        self._simple = [(f["name"], f.get("type") or "id") for f in contract["sparse"]
                        if not f.get("derive") and not f.get("separator")
                        and (f.get("type") or "id") != "string"]
        self._cache: dict = {name: {} for name, _ in self._simple}  # text (or None) -> id
        self._dense_cache: dict = {}  # dense kind -> {text (or None): value, NaN if missing}

    def check_columns(self, names):
        """Raise :class:`EncodeError` for the first column the contract does not know."""
        for name in names:
            if name in self._known or name in self._ignored:
                continue
            if not isinstance(name, str):
                raise EncodeError(None, None, f"named raw columns "
                                  f"({', '.join(self.columns[:4])}, ...), not a column "
                                  f"numbered {name!r} (a tensor or a list of lists)")
            near = [c for c in self.columns if c.lower() == name.lower()]
            listing = ", ".join(self.columns[:8]) + (", ..." if len(self.columns) > 8 else "")
            if near:
                expected = (f"a column of the model: names are case-sensitive, did you mean "
                            f"{near[0]!r}?")
            else:
                expected = f"a column of the model ({listing}); it has none named {name!r}"
            raise EncodeError(name, None, expected)

    def encode(self, columns, n_rows):
        """(dense (B, F_dense) float32, ids (N,) int64, lengths (F * B,) int64) as numpy.

        Args:
            columns: raw column -> values (a sequence or a 1-D array of ``n_rows``); an
                absent column is missing in every row.
            n_rows: the row count B.
        """
        if isinstance(n_rows, bool) or not isinstance(n_rows, (int, np.integer)) or n_rows < 0:
            raise EncodeError(None, None, "a row count >= 0", got=n_rows)
        n_rows = int(n_rows)
        self.check_columns(columns)
        raw = {name: _as_column(name, values, n_rows) for name, values in columns.items()
               if name in self._known}
        # Columns of one kind are parsed as one array (per-call overhead, not per value,
        # dominates a request of a few hundred rows); where that fails, column by column,
        # to name the column and row at fault. Values seen before come from a cache.
        dense = np.empty((n_rows, len(self.contract["dense"])), np.float32)
        values = self._dense_columns(raw, n_rows)
        for j, feature in enumerate(self.contract["dense"]):
            dense[:, j] = _dense(feature, values.get(feature["name"]), n_rows)
        hits, unseen = self._lookup([(name, self._cache[name]) for name, _ in self._simple],
                                    raw, n_rows, -1)
        parsed = _grouped({k: v for k, v in unseen.items() if len(v)}, self._simple,
                          _integer_keys, {name: miss for name, (_, miss) in hits.items()})
        ids, lengths = [], []
        stamps: dict = {}  # timestamp column -> its parts, parsed once for all its features
        for feature in self.contract["sparse"]:
            hit = hits.get(feature["name"])  # every id from the cache: nothing to parse
            keys, counts = ((hit[0], np.ones(n_rows, np.int64)) if hit and not len(hit[1])
                            else self._sparse(feature, unseen, n_rows, stamps, parsed, hits))
            ids.append(keys)
            lengths.append(counts)
        if not ids:
            return dense, np.zeros(0, np.int64), np.zeros(0, np.int64)
        return dense, np.concatenate(ids), np.concatenate(lengths)

    def _lookup(self, features, raw, n_rows, absent):
        """Values of ``features`` (name, cache) found in their caches: ({name: (found,
        rows not found)}, the raw columns holding only the values not found)."""
        hits, unseen = {}, dict(raw)
        for name, cache in features:
            column = raw.get(name)
            if column is not None and column.dtype == object and cache:
                try:
                    found = np.fromiter(map(cache.get, column, itertools.repeat(absent)),
                                        type(absent), count=n_rows)
                except TypeError:  # an unhashable value (a list): parsed, and refused
                    continue
                miss = np.flatnonzero(found == absent)
                hits[name], unseen[name] = (found, miss), column[miss]
        return hits, unseen

    # ---- dense features -----------------------------------------------------------------
    def _dense_columns(self, raw, n_rows):
        """{name: (float64 values, missing)} of the dense columns given: text seen before
        from its kind's cache (a missing value as NaN there), the rest parsed."""
        features = [(d["name"], d.get("type", "float")) for d in self.contract["dense"]]
        caches = [(name, self._dense_cache.setdefault(kind, {})) for name, kind in features]
        hits, unseen = self._lookup(caches, raw, n_rows, np.inf)
        parsed = _grouped({k: v for k, v in unseen.items() if len(v)}, features,
                          _dense_values, {name: miss for name, (_, miss) in hits.items()})
        for name, cache in caches:
            column = unseen.get(name)
            values = parsed[name][0] if column is not None and len(column) else None
            if values is not None and set(map(type, column)) <= {str, _NONE}:  # text only
                if len(cache) + len(column) > CACHE_LIMIT:
                    cache.clear()
                cache.update(zip(column.tolist(), values.tolist(), strict=True))
            if name in hits:
                found, miss = hits[name]
                if values is not None:
                    found[miss] = values
                parsed[name] = found, np.isnan(found)
        return parsed

    # ---- sparse features ----------------------------------------------------------------
    def _sparse(self, feature, raw, n_rows, stamps, parsed, hits):
        name, mode, size = feature["name"], feature["mode"], int(feature["num_embeddings"])
        derive = feature.get("derive")
        if derive is not None:
            source = derive["column"]
            if source not in stamps:
                stamps[source] = _timestamps(source, raw.get(source), n_rows, derive["format"])
            value, missing = stamps[source][derive["kind"]], stamps[source]["missing"]
            ids = np.where(missing, 0, value % _DERIVED_SIZES[derive["kind"]])
            return ids.astype(np.int64), np.ones(n_rows, np.int64)
        column = raw.get(name)
        separator = feature.get("separator")
        if separator:
            texts, rows, counts = _split_lists(name, column, n_rows, separator)
        elif name in hits:  # ``column`` holds the values the cache lacks, at rows ``rows``
            texts, rows, counts = column, hits[name][1], np.ones(n_rows, np.int64)
        else:
            texts, rows, counts = column, None, np.ones(n_rows, np.int64)
        kind = feature.get("type") or "id"
        n = len(counts) if rows is None else len(rows)
        if kind == "string":
            return self._strings(feature, texts, n, rows, mode), counts
        if name in parsed:
            keys, missing = parsed[name]
        else:
            keys, missing = _integer_keys(name, texts, n, kind, rows)
        if mode == "hash":
            if kind == "hex":
                ids = (keys.astype(np.uint64) % np.uint64(size)).astype(np.int64)
            else:
                ids = np.mod(keys.astype(np.int64), size)  # floor modulo, as polars' %
            ids[missing] = 0
        elif mode == "vocab":
            ids = self._vocab[name].lookup(keys, missing)
        elif mode == "zch":  # the raw 64-bit key; the program maps it to a slot
            ids = keys.astype(np.uint64).view(np.int64) if kind == "hex" \
                else keys.astype(np.int64)
            ids = np.where(missing, 0, ids)
        else:  # ids as given
            ids = np.where(missing, 0, keys.astype(np.int64))
            bad = (ids < 0) | (ids >= size)
            if bad.any():
                at = int(np.flatnonzero(bad)[0])
                raise EncodeError(name, at if rows is None else int(rows[at]),
                                  f"an id in [0, {size})", got=int(ids[at]))
        if name in self._cache:
            self._remember(name, texts, ids)
            if name in hits:
                found, miss = hits[name]
                found[miss] = ids
                ids = found
        return ids, counts

    def _remember(self, name, texts, ids):
        """Cache text -> id of a column's values (only text and None: other types, which
        compare equal to text of no kind, are encoded afresh)."""
        if texts is None or texts.dtype != object or not len(texts):
            return
        if not set(map(type, texts)) <= {str, _NONE}:
            return
        cache = self._cache[name]
        if len(cache) + len(texts) > CACHE_LIMIT:
            cache.clear()
        cache.update(zip(texts.tolist(), ids.tolist(), strict=True))

    def _strings(self, feature, texts, n, rows, mode):
        """Ids of a string feature: hashed (missing -> 0) or looked up (missing -> null)."""
        name = feature["name"]
        values, missing = _texts(name, texts, n, "a string", rows)
        ids = np.zeros(n, np.int64)
        present = np.flatnonzero(~missing)
        if mode == "vocab":
            vocabulary = self._vocab[name]
            found = vocabulary.strings
            ids[present] = [found.get(values[i], 0) for i in present]
            ids[missing] = vocabulary.null_id
        elif mode == "zch":
            ids[present] = [stable_key(values[i]) for i in present]
        elif len(present):
            hasher = self._string_hasher(feature)
            ids[present] = hasher([values[i] for i in present])
        return ids


def stable_key(text):
    """A string's raw key for a managed-collision feature, as preprocess computes it
    (``ctrctl.data.transforms.stable_key``): BLAKE2b's first 8 bytes, signed little-endian."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class _Vocabulary:
    """A vocabulary (key text -> id) as sorted integer keys, or a dict for strings."""

    def __init__(self, mapping, kind):
        self.null_id = int(mapping.get("null", 0))
        self.strings = {k: int(v) for k, v in mapping.items() if k != "null"}
        dtype = np.uint64 if kind == "hex" else np.int64
        if kind in ("hex", "int", "id", None):
            keys = np.array([int(k) for k in self.strings], dtype=dtype)
            ids = np.array(list(self.strings.values()), dtype=np.int64)
            order = np.argsort(keys, kind="stable")
            self.keys, self.ids = keys[order], ids[order]

    def lookup(self, keys, missing):
        if not len(self.keys):
            ids = np.zeros(len(keys), np.int64)
        else:
            keys = keys.astype(self.keys.dtype)
            at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
            ids = np.where(self.keys[at] == keys, self.ids[at], 0)
        ids[missing] = self.null_id
        return ids


# ---- columns ------------------------------------------------------------------------------
def _as_column(name, values, n_rows):
    """A raw column as a 1-D numpy array of ``n_rows`` (object for text)."""
    if isinstance(values, np.ndarray):
        column = values
    elif isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise EncodeError(name, None, f"a list of {n_rows} values", got=type(values).__name__)
    else:
        if len(values) != n_rows:
            raise EncodeError(name, None, f"{n_rows} values (one per row)",
                              got=f"{len(values)} values")
        column = np.fromiter(values, dtype=object, count=n_rows)
    if column.ndim != 1 or len(column) != n_rows:
        raise EncodeError(name, None, f"{n_rows} scalar values (one per row)",
                          got=f"an array of shape {column.shape}")
    if column.dtype.kind in "US":
        column = column.astype(object)
    return column


def _missing_mask(column):
    """Missing values of a column: None, "" and NaN."""
    if column.dtype.kind == "f":
        return np.isnan(column)
    if column.dtype.kind in "iub":
        return np.zeros(len(column), bool)
    n = len(column)
    if set(map(type, column)) <= {str, _NONE}:  # the common case: compared in C
        return (column == None) | (column == "")  # noqa: E711  (elementwise, in C)
    return np.fromiter((v is None or (isinstance(v, str) and v == "") or
                        (isinstance(v, float) and v != v) for v in column), bool, count=n)


def _bad_scalar(name, column, rows, expected, ok_types):
    """Raise for the first element whose type is not one of ``ok_types``."""
    for i, value in enumerate(column):
        if value is not None and not isinstance(value, ok_types) or isinstance(value, bool):
            kind = ("a list" if isinstance(value, (list, tuple, np.ndarray)) else
                    type(value).__name__)
            raise EncodeError(name, i if rows is None else int(rows[i]),
                              f"{expected}, not {kind}", got=value)


def _grouped(raw, features, parse, positions=None):
    """{name: parse(name, column, n, kind, rows)} of the columns of ``features`` (name,
    kind), the object columns of one kind parsed as one array. ``positions``: name -> the
    rows a column's values come from, where it holds only some rows (for messages)."""
    positions = positions or {}
    out = {}
    by_kind: dict = {}  # kind -> names of its object columns
    for name, kind in features:
        column = raw.get(name)
        if column is not None and column.dtype == object:
            by_kind.setdefault(kind, []).append(name)
        elif column is not None:
            out[name] = parse(name, column, len(column), kind, positions.get(name))
    for kind, names in by_kind.items():
        if len(names) > 1:
            sizes = [len(raw[k]) for k in names]
            try:
                whole = parse(names[0], np.concatenate([raw[k] for k in names]), sum(sizes),
                              kind, None)
            except EncodeError:
                pass  # column by column below, to name the column and row at fault
            else:
                ends = np.cumsum(sizes)
                for name, end, size in zip(names, ends, sizes, strict=True):
                    out[name] = tuple(part[end - size:end] for part in whole)
                continue
        for name in names:
            out[name] = parse(name, raw[name], len(raw[name]), kind, positions.get(name))
    return out


def _dense_values(name, column, n, kind, rows):
    """(float64 values, missing) of a raw dense column; not a number is an error."""
    expected = "an integer" if kind == "int" else "a number"
    missing = _missing_mask(column)
    if column.dtype.kind in "iuf":
        values = column.astype(np.float64)
    else:
        if column.dtype.kind == "b" or bool in set(map(type, column)):
            _bad_scalar(name, column, rows, expected, (str, int, float, np.number))
        filled = column.copy()
        filled[missing] = "nan"
        try:
            values = filled.astype(np.float64)
        except (TypeError, ValueError):
            values = _dense_slowly(name, filled, missing, expected, rows)
    values[missing] = np.nan
    bad = ~missing & ~np.isfinite(values)
    if kind == "int":
        bad |= ~missing & (values != np.floor(values))
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        raise EncodeError(name, at if rows is None else int(rows[at]), expected,
                          got=column[at])
    return values, missing


def _dense(feature, parsed, n_rows):
    """One dense feature's transformed float32 values from its parsed (values, missing)."""
    fill = float(feature.get("fill", 0.0))
    if parsed is None:
        values = np.full(n_rows, fill)
    else:
        values, missing = parsed
        values = np.where(missing, fill, values)
    transform = feature.get("transform", "none")
    if transform == "log1p":
        values = np.log1p(np.maximum(values, 0.0))
    elif transform == "clip":
        low, high = feature["clip"]
        values = np.clip(values, low, high)
    return values.astype(np.float32)


def _dense_slowly(name, column, missing, expected, rows):
    """Element by element, to name the first value that is not a number."""
    _bad_scalar(name, column, rows, expected, (str, int, float, np.number))
    out = np.empty(len(column))
    for i, value in enumerate(column):
        try:
            out[i] = np.nan if missing[i] else float(value)
        except (TypeError, ValueError):
            raise EncodeError(name, i if rows is None else int(rows[i]), expected,
                              got=value) from None
    return out


def _split_lists(name, column, n_rows, separator):
    """A multi-hot column -> (element texts, their rows, elements per row): a text is
    split on the separator (empty parts dropped), a list taken as its elements."""
    if column is None:
        return np.zeros(0, object), np.zeros(0, np.int64), np.zeros(n_rows, np.int64)
    parts, counts = [], np.zeros(n_rows, np.int64)
    for i, value in enumerate(column):
        if value is None or (isinstance(value, float) and value != value):
            continue
        if isinstance(value, str):
            items = [p for p in value.split(separator) if p != ""]
        elif isinstance(value, (list, tuple, np.ndarray)):
            items = [p for p in value if p is not None and p != ""]
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            items = [str(value)]
        else:
            raise EncodeError(name, i, f"a {separator!r}-separated text or a list",
                              got=value)
        parts.extend(items)
        counts[i] = len(items)
    rows = np.repeat(np.arange(n_rows), counts)
    return np.fromiter(parts, dtype=object, count=len(parts)), rows, counts


def _texts(name, column, n, expected, rows):
    """(values as an object array of str, missing mask); numbers become their text."""
    if column is None:
        return np.full(n, "", dtype=object), np.ones(n, bool)
    missing = _missing_mask(column)
    if column.dtype.kind in "iu":
        return column.astype(str).astype(object), missing
    if column.dtype.kind == "f" or column.dtype.kind == "b":
        column = column.astype(object)
    types = set(map(type, column))
    if not types <= {str, _NONE}:
        _bad_scalar(name, column, rows, expected, (str, int, float, np.number))
        column = np.array([_number_text(v) if not isinstance(v, str) and v is not None
                           else v for v in column], dtype=object)
    return column, missing


def _number_text(value):
    """A number as a log file writes it: 3.0 (a pandas int column with gaps) is "3"."""
    if isinstance(value, float) and value == value and value == int(value):
        return str(int(value))
    return str(value)


def _integer_keys(name, column, n, kind, rows):
    """(keys, missing) of a hex (uint64), int or id (int64) column."""
    if column is None:
        return np.zeros(n, np.int64), np.ones(n, bool)
    if kind != "hex" and column.dtype.kind in "iu":
        return column.astype(np.int64), np.zeros(n, bool)
    if kind != "hex" and column.dtype.kind == "f":
        missing = np.isnan(column)
        bad = ~missing & (column != np.floor(column))
        if bad.any():
            at = int(np.flatnonzero(bad)[0])
            raise EncodeError(name, at if rows is None else int(rows[at]),
                              "an integer", got=float(column[at]))
        return np.where(missing, 0, column).astype(np.int64), missing
    expected = "a hex string (0-9, a-f)" if kind == "hex" else "an integer"
    texts, missing = _texts(name, column, n, expected, rows)
    filled = texts.copy()
    filled[missing] = "0"
    try:
        data = filled.astype("S")
    except UnicodeEncodeError:
        data = None
    keys = None if data is None else _parse_integers(data, 16 if kind == "hex" else 10)
    if keys is None or keys[1].any():
        bad = np.ones(n, bool) if keys is None else keys[1]
        for i in np.flatnonzero(bad & ~missing):
            if _parses(filled[i], kind):
                continue
            raise EncodeError(name, int(i) if rows is None else int(rows[i]),
                              expected + (" of at most 16 digits" if kind == "hex" else
                                          " of 64 bits"), got=texts[i])
        values = [int(t, 16) if kind == "hex" else int(t) for t in filled]
        keys = (np.array(values, dtype=np.uint64 if kind == "hex" else np.int64), None)
    return keys[0], missing


def _parses(text, kind):
    """Whether ``text`` is a key polars' ``str.to_integer`` reads (u64 hex, i64 int)."""
    if kind == "hex":
        return bool(re.fullmatch(r"\+?[0-9a-fA-F]+", text)) and int(text, 16) < 2**64
    return bool(re.fullmatch(r"[+-]?[0-9]+", text)) and -2**63 <= int(text) < 2**63


def _parse_integers(data, base):
    """Fixed-width byte strings -> (values, bad mask), whole column at once.

    Bytes become digit values through a table; a row is bad where a byte before its end
    is no digit of ``base`` or where it may not fit in 64 bits (those are read again one
    by one). Decimal values take a leading minus sign.
    """
    n, width = len(data), data.dtype.itemsize
    matrix = data.view(np.uint8).reshape(n, width)  # (rows, width) bytes, NUL-padded
    digits = _DIGITS[matrix]
    negative = np.zeros(n, bool)
    if base == 10:
        negative = matrix[:, 0] == ord("-")
        digits[negative, 0] = 254  # skipped like the padding
    present = digits != 254
    length = present.sum(1)
    bad = ((digits >= base) & present).any(1) | (length == 0)
    bad |= length > (16 if base == 16 else 18)
    # Horner's rule over the byte columns; padding (after a row's end) leaves a row as is.
    values = np.zeros(n, np.uint64)
    step = np.uint64(base)
    for i in range(width):
        column = digits[:, i]
        values = np.where(present[:, i], values * step + column, values)
    if base == 10:
        values = values.astype(np.int64)
        values[negative] = -values[negative]
    return values, bad


# ---- timestamps ----------------------------------------------------------------------------
#: The timestamp parser beside this file: ``serving_timestamps.py`` in an artifact, the
#: package's ``standalone_timestamps.py`` otherwise (loaded by path, as this file is).
TIMESTAMP_FILES = ("serving_timestamps.py", "standalone_timestamps.py")
_stamps = None


def _timestamps(name, column, n_rows, fmt):
    """Derived parts of a timestamp column: hour_of_day, ISO weekday (1-7), day, missing."""
    global _stamps
    if _stamps is None:
        here = os.path.dirname(os.path.abspath(__file__))
        path = next(os.path.join(here, f) for f in TIMESTAMP_FILES
                    if os.path.isfile(os.path.join(here, f)))
        # run from its text, as the loader runs this file: no __pycache__ in the artifact
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        module = type(sys)("_ctrctl_serving_timestamps")
        module.__file__ = path
        sys.modules[module.__name__] = module
        exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102  (a listed file)
        _stamps = module
    if column is None:
        zeros = np.zeros(n_rows, np.int64)
        return {"hour_of_day": zeros, "weekday": zeros, "day": zeros,
                "missing": np.ones(n_rows, bool)}
    texts, missing = _texts(name, column, n_rows, f"a timestamp {fmt!r}", None)
    filled = texts.copy()
    filled[missing] = ""
    try:
        return _stamps.parts(filled, missing, fmt)
    except _stamps.StampError as exc:
        raise EncodeError(name, exc.row, exc.expected, got=exc.got) from None
