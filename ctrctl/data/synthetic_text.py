"""Text lines of synthetic logs, made from a chunk's columns without per-row Python.

Each row is laid out in a fixed-width byte matrix: one slot per field, a separator byte then
the field's widest text (decimal integers right-aligned in groups of 4 digits, hashes as 8 hex
digits). A second matrix of the same shape marks the bytes a row keeps (the separator, the
digits of its value, nothing of a missing field), and one Arrow ``filter`` pass drops the rest.
Digits come from lookup tables (4 decimal digits or 4 hex digits per 32-bit word), written
through unaligned word views of the matrix, so every step is one vectorised call per column.

Every line *starts* with its newline, as :func:`ctrctl.data.synthetic.encode_lines` makes
them: the two encoders give the same bytes for the same columns.

Example:
    >>> lines = encode_columns(
    ...     [(np.array([1, 0], dtype=np.int8), None),
    ...      (np.array([7, -2]), np.array([False, True])),
    ...      (np.array([255, 48879], dtype=np.uint32), None)],
    ...     separator=b"\\t",
    ... )
    >>> lines.to_pylist()
    ['\\n1\\t7\\t000000ff', '\\n0\\t\\t0000beef']
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Column", "encode_columns"]

#: A column to print: values (uint32: 8 hex digits; other integers: decimal) and a mask
#: of missing values (empty fields), or None.
Column = tuple[np.ndarray, "np.ndarray | None"]

_GROUP = 10_000  # 4 decimal digits per 32-bit word
_ONES = np.uint32(0x01010101)
#: Bytes of the row block kept in cache while columns are written into it.
_BLOCK_BYTES = 1 << 20


@functools.lru_cache(maxsize=1)
def _decimal_table() -> tuple[np.ndarray, np.ndarray]:
    """uint32 words of the 4 zero-padded decimal digits of 0..9999, and their digit counts."""
    v = np.arange(_GROUP)
    chars = np.stack([48 + v // 1000 % 10, 48 + v // 100 % 10, 48 + v // 10 % 10, 48 + v % 10])
    words = np.ascontiguousarray(chars.T.astype(np.uint8)).view(np.uint32).ravel()
    digits = (1 + (v >= 10) + (v >= 100) + (v >= 1000)).astype(np.int32)
    return words, digits


@functools.lru_cache(maxsize=1)
def _hex_table() -> np.ndarray:
    """uint32 words of the 4 lowercase hex digits of every 16-bit value."""
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    v = np.arange(65536, dtype=np.uint32)
    chars = np.stack([digits[(v >> s) & 15] for s in (12, 8, 4, 0)], axis=1)
    return np.ascontiguousarray(chars).view(np.uint32).ravel()


@functools.lru_cache(maxsize=8)
def _keep_table(groups: int) -> np.ndarray:
    """(4 * groups + 1, groups) uint32: for a value of ``n`` digits, right-aligned in
    ``groups`` words, the keep-marks (bytes 0/1) of each word."""
    width = 4 * groups
    keep = np.arange(width)[None, :] >= width - np.arange(width + 1)[:, None]
    return np.ascontiguousarray(keep.astype(np.uint8)).view(np.uint32)


def _word_view(matrix: np.ndarray, offset: int, dtype: type = np.uint32) -> np.ndarray:
    """Column view of a (rows, width) uint8 matrix as one (unaligned) word per row."""
    return np.ndarray(
        (matrix.shape[0],), dtype=dtype, buffer=matrix, offset=offset, strides=(matrix.shape[1],)
    )


def _decimal_groups(values: np.ndarray) -> int:
    """Words of 4 digits that the widest value (and a minus sign) needs."""
    if len(values) == 0:
        return 1
    top = max(abs(int(values.max())), abs(int(values.min())))
    width = len(str(top)) + (1 if int(values.min()) < 0 else 0)
    return max(1, -(-width // 4))


def _slot_widths(columns: list[Column]) -> list[tuple[bool, int]]:
    """(is_hex, text width) of each column's slot."""
    widths = []
    for values, _ in columns:
        if values.dtype == np.uint32:
            widths.append((True, 8))
        else:
            widths.append((False, 4 * _decimal_groups(values)))
    return widths


def encode_columns(columns: list[Column], separator: bytes) -> pa.StringArray:
    """Each row of ``columns`` as one line starting with ``\\n``, fields split by ``separator``.

    Args:
        columns: ``(values, missing)`` per field in line order; uint32 values print as 8
            lowercase hex digits, other integer values in decimal; ``missing`` (bool or None)
            marks empty fields.
        separator: one byte between fields.

    Returns:
        A string array of the lines (consecutive in one buffer; see ``text_of``).
    """
    if len(separator) != 1:
        raise ValueError(f"separator must be one byte, got {separator!r}")
    n = len(columns[0][0]) if columns else 0
    columns = [
        (
            np.where(missing, 0, values)
            if missing is not None and values.dtype != np.uint32
            else values,
            missing,
        )
        for values, missing in columns
    ]
    widths = _slot_widths(columns)
    # Slot: a word holding the separator (its 3 other bytes dropped), then the text words;
    # every word is 4-byte aligned (unaligned column writes are several times slower).
    row_width = sum(4 + w for _, w in widths)
    template = np.full(row_width, 48, dtype=np.uint8)  # zero padding of decimal slots
    template_keep = np.ones(row_width, dtype=np.uint8)
    # (byte offset in the row, one uint32 per row) for the text and for the keep-marks.
    text_words: list[tuple[int, np.ndarray]] = []
    keep_words: list[tuple[int, np.ndarray]] = []
    lengths = np.zeros(n, dtype=np.int64)
    words, digit_counts = _decimal_table()
    hex_words = _hex_table()
    slot = 0
    for i, ((values, missing), (is_hex, width)) in enumerate(zip(columns, widths, strict=True)):
        template[slot] = 10 if i == 0 else separator[0]
        template_keep[slot + 1 : slot + 4] = 0
        start = slot + 4
        if is_hex:
            text_words.append((start, np.take(hex_words, values >> np.uint32(16))))
            text_words.append((start + 4, np.take(hex_words, values & np.uint32(0xFFFF))))
            if missing is None:
                lengths += 9
            else:
                present = (~missing).astype(np.uint32) * _ONES
                keep_words += [(start, present), (start + 4, present)]
                lengths += 1 + 8 * (~missing)
        else:
            groups = width // 4
            digits = _decimal_words(text_words, start, groups, values, words, digit_counts)
            if missing is not None:
                digits[missing] = 0
            marks = _keep_table(groups)[digits]
            keep_words += [(start + 4 * g, marks[:, g]) for g in range(groups)]
            lengths += 1 + digits
        slot = start + width
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError("chunk text over 2 GiB: use smaller chunks")
    # Rows go through a block that stays in cache: a column write into a matrix far larger
    # than the cache costs a miss per row.
    block = max(1, min(n, _BLOCK_BYTES // max(row_width, 1)))
    text = np.empty((block, row_width), dtype=np.uint8)
    keep = np.empty((block, row_width), dtype=np.uint8)
    text[:] = template  # separators and padding stay; every other byte is rewritten
    keep[:] = template_keep
    text_views = [(_word_view(text, offset), column) for offset, column in text_words]
    keep_views = [(_word_view(keep, offset), column) for offset, column in keep_words]
    out = np.empty(int(offsets[-1]), dtype=np.uint8)
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        m = hi - lo
        for view, column in text_views:
            view[:m] = column[lo:hi]
        for view, column in keep_views:
            view[:m] = column[lo:hi]
        size = m * row_width
        bits = np.packbits(keep[:m].ravel(), bitorder="little")
        kept = pc.filter(
            pa.Array.from_buffers(pa.uint8(), size, [None, pa.py_buffer(text[:m].ravel())]),
            pa.Array.from_buffers(pa.bool_(), size, [None, pa.py_buffer(bits)]),
        )
        out[offsets[lo] : offsets[hi]] = np.frombuffer(
            kept.buffers()[1], dtype=np.uint8, count=len(kept), offset=kept.offset
        )
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(out))


def _decimal_words(
    text_words: list[tuple[int, np.ndarray]],
    start: int,
    groups: int,
    values: np.ndarray,
    words: np.ndarray,
    digit_counts: np.ndarray,
) -> np.ndarray:
    """Add the words of ``values``, right-aligned in ``groups`` words from byte ``start``,
    to ``text_words``; return the text length of each value (with its minus sign)."""
    negative = None if values.dtype.kind == "u" else values < 0
    if negative is not None and negative.any():
        rest = np.abs(values.astype(np.int64))
    else:
        negative = None
        rest = values
    # Division by a constant is far faster on unsigned words than on int64.
    small = len(rest) == 0 or int(rest.max()) < 2**32
    rest = rest.astype(np.uint32 if small else np.uint64)
    base = rest.dtype.type(_GROUP)
    digits = np.zeros(len(values), dtype=np.int32)
    column_words = []
    for g in range(groups):
        last = g == groups - 1
        if last:
            group = rest
        else:
            quotient = rest // base
            group = rest - quotient * base
            rest = quotient
        column_words.append(np.take(words, group))
        count = np.take(digit_counts, group)
        if g == 0:
            digits = count
        else:
            above = group > 0 if last else (group > 0) | (rest > 0)
            np.copyto(digits, count + 4 * g, where=above)
    if negative is not None:
        rows = np.flatnonzero(negative)
        # The minus sign goes in the byte before the first digit, inside its word.
        sign = start + 4 * groups - 1 - digits[rows]
        word = (sign - start) // 4
        shift = ((sign - start) % 4 * 8).astype(np.uint32)
        for g in np.unique(word):
            at = rows[word == g]
            column = column_words[groups - 1 - g]
            mask = np.uint32(0xFF) << shift[word == g]
            column[at] = (column[at] & ~mask) | (np.uint32(ord("-")) << shift[word == g])
        digits[rows] += 1
    for g, column in enumerate(column_words):
        text_words.append((start + 4 * (groups - 1 - g), column))
    return digits
