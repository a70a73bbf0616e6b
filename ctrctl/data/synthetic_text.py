"""Text lines of synthetic logs, made from a chunk's columns without per-row Python.

Rows are laid out in a byte matrix, one fixed slot per field: the separator byte, then the
field's text right-aligned in one 4-byte word (texts of up to 4 characters) or in whole 8-byte
words, zero bytes before it (and in all of a missing field). Text never holds a zero byte, so
dropping the zeros (one polars ``filter`` over a block of rows that stays in cache) leaves the
lines::

    slot of I6 = 41237:  \t 00 00 00 '4' '1' '2' '3' '7'   ->  \t41237
    slot of I3 = 7:      \t 00 00 00 '7'                    ->  \t7
    slot of I3 missing:  \t 00 00 00 00                     ->  \t
    slot of C7 (hex):    \t '0' '0' '1' '9' 'd' 'a' '8' 'b'   ->  \t0019da8b

Separators are written once per matrix; each field is one strided store per row and word.
The words come from lookup tables: 4 decimal or 4 hex digits per table entry, and for a
:class:`Coded` column (values drawn from a :class:`Dictionary`, such as a count taken from a
table of levels or a hash of a rank) the words of every dictionary value, made once, so a
field costs one table read per row. A row's length is the popcount of its keep-bits.

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
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

__all__ = ["Coded", "Column", "Dictionary", "encode_columns", "field_words", "text_words"]

_GROUP = 10_000  # 4 decimal digits per table entry
#: Bytes of the row block kept in cache while fields are written into it.
_BLOCK_BYTES = 1 << 20


class Dictionary:
    """The values a column draws from, with the text of each made once (see :class:`Coded`).

    Codes ``0 .. len - 1`` stand for the values; code ``len`` (:attr:`missing_code`) for a
    missing value, an empty field.

    Args:
        values: integer values (uint32 print as 8 hex digits, other integers in decimal).

    Example:
        >>> d = Dictionary(np.array([5, 1234567890]))
        >>> [t.dtype.name for t in d.tables()]     # text in two 8-byte words
        ['uint64', 'uint64']
        >>> d.decode(np.array([1, 0]))
        array([1234567890,          5])
    """

    def __init__(self, values: np.ndarray):
        self.values = values
        self._tables: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.values)

    @property
    def missing_code(self) -> int:
        return len(self)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """The values at ``codes`` (any value at the missing code)."""
        return np.take(self.values, codes, mode="clip")

    def tables(self) -> list[np.ndarray]:
        """Each value's text as :func:`field_words` lays it out, one array per word of
        ``len + 1`` entries; the last entry is zero: the text of a missing field."""
        if self._tables is None:
            words = field_words(self.values)
            # Made once, read by every chunk; two threads may both make it (the same).
            self._tables = [np.append(w, w.dtype.type(0)) for w in words]
        return self._tables

    def words(self, codes: np.ndarray) -> list[np.ndarray]:
        """The text words (see :func:`field_words`) of the values at ``codes`` (intp); zero
        at the missing code."""
        return [np.take(table, codes) for table in self.tables()]


@dataclass(frozen=True)
class Coded:
    """A column as codes in a :class:`Dictionary`: row ``i`` is the value of ``codes[i]``,
    or missing where it is the dictionary's :attr:`~Dictionary.missing_code`.

    Attributes:
        codes: (n,) intp codes.
        dictionary: the values.
    """

    codes: np.ndarray
    dictionary: Dictionary

    @property
    def dtype(self) -> np.dtype:
        return self.dictionary.values.dtype

    def __len__(self) -> int:
        return len(self.codes)

    def decode(self) -> np.ndarray:
        """The values of the rows, ``(n,)`` (any value where missing)."""
        return self.dictionary.decode(self.codes)

    def missing(self) -> np.ndarray | None:
        """Where the rows are missing, or None when none is."""
        mask = self.codes == self.dictionary.missing_code
        return mask if mask.any() else None


#: A column to print: values (uint32: 8 hex digits; other integers: decimal; or a
#: :class:`Coded` column of them) and a mask of missing values (empty fields), or None
#: (a :class:`Coded` column may also mark them by its codes).
Column = tuple["np.ndarray | Coded", "np.ndarray | None"]


# ----------------------------------------------------------------------------- tables


@functools.lru_cache(maxsize=1)
def _decimal_tables() -> tuple[np.ndarray, np.ndarray]:
    """uint64 words of the 4 zero-padded decimal digits of 0..9999 (in bytes 0-3), and the
    digit count of each (0 has one digit)."""
    v = np.arange(_GROUP)
    chars = np.stack([48 + v // 1000 % 10, 48 + v // 100 % 10, 48 + v // 10 % 10, 48 + v % 10])
    words = np.ascontiguousarray(chars.T.astype(np.uint8)).view(np.uint32).ravel()
    digits = (1 + (v >= 10) + (v >= 100) + (v >= 1000)).astype(np.int64)
    return words.astype(np.uint64), digits


@functools.lru_cache(maxsize=1)
def _hex_table() -> np.ndarray:
    """uint64 words of the 4 lowercase hex digits of every 16-bit value (in bytes 0-3)."""
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    v = np.arange(65536, dtype=np.uint32)
    chars = np.stack([digits[(v >> s) & 15] for s in (12, 8, 4, 0)], axis=1)  # (65536, 4)
    return np.ascontiguousarray(chars).view(np.uint32).ravel().astype(np.uint64)


#: ``_KEEP[c]``: the mask of the last ``c`` bytes of a little-endian word.
_KEEP = np.array([0] + [(2**64 - 1) << (8 * (8 - c)) & (2**64 - 1) for c in range(1, 9)],
                 dtype=np.uint64)


def _word_count(values: np.ndarray) -> int:
    """8-byte words that the widest text of ``values`` (with a minus sign) needs."""
    if values.dtype == np.uint32 or len(values) == 0:
        return 1
    chars = max(len(str(int(values.max()))), len(str(int(values.min()))))
    return -(-chars // 8)


def text_words(values: np.ndarray) -> np.ndarray:
    """Each value's text right-aligned in 8-byte words (as many as the widest value needs),
    zero bytes before it.

    Args:
        values: (n,) integers; uint32 print as 8 lowercase hex digits, others in decimal.

    Returns:
        (n, words) uint64, in byte order: ``.view(np.uint8)`` of a row is its text.

    Example:
        >>> text_words(np.array([-12, 7])).view(np.uint8).tobytes()
        b'\\x00\\x00\\x00\\x00\\x00-12\\x00\\x00\\x00\\x00\\x00\\x00\\x007'
    """
    k = _word_count(values)
    n = len(values)
    if values.dtype == np.uint32:
        hex_words = _hex_table()
        # Little-endian: the low 16 bits, then the high 16 bits; the high ones print first.
        halves = np.ascontiguousarray(values).view(np.uint16).reshape(n, 2)
        high = np.take(hex_words, halves[:, 1].astype(np.intp))
        low = np.take(hex_words, halves[:, 0].astype(np.intp))
        return (high | (low << np.uint64(32)))[:, None]
    if values.dtype.kind not in "iu":
        raise TypeError(f"cannot print {values.dtype} values as integers")
    digit_words, digit_counts = _decimal_tables()
    negative = np.flatnonzero(values < 0) if values.dtype.kind == "i" else np.zeros(0, np.intp)
    rest = values.astype(np.uint64)
    if len(negative):
        rest[negative] = np.uint64(0) - rest[negative]  # |v| (as uint64: int64.min too)
    out = np.empty((n, k), dtype=np.uint64)
    length = np.ones(n, dtype=np.int64)  # text length, minus sign not counted yet
    for g in range(k):  # group g: the 8 digits of word k - 1 - g
        group = rest % np.uint64(10**8)
        if g < k - 1:
            rest = rest // np.uint64(10**8)
        high = (group // np.uint64(_GROUP)).astype(np.intp)
        low = (group % np.uint64(_GROUP)).astype(np.intp)
        out[:, k - 1 - g] = np.take(digit_words, high) | (
            np.take(digit_words, low) << np.uint64(32)
        )
        digits = np.where(high > 0, 4 + np.take(digit_counts, high), np.take(digit_counts, low))
        if g == 0:
            length = digits
        else:
            np.copyto(length, 8 * g + digits, where=group > 0)
    if len(negative):
        length[negative] += 1
    if 8 * k < int(length.max(initial=0)):
        raise ValueError(f"values need more than {k} words of text")
    for g in range(k):
        out[:, k - 1 - g] &= np.take(_KEEP, np.clip(length - 8 * g, 0, 8))
    if len(negative):
        # The minus sign replaces the zero padding byte just before the digits.
        at = length[negative] - 1  # its place counted from the right, from 0
        shift = (8 * (7 - at % 8)).astype(np.uint64)
        word = k - 1 - at // 8
        out[negative, word] = (out[negative, word] & ~(np.uint64(0xFF) << shift)) | (
            np.uint64(ord("-")) << shift
        )
    return out


def field_words(values: np.ndarray) -> list[np.ndarray]:
    """The text of ``values`` as the words of a field's slot, left to right: one uint32 when
    every text fits in 4 bytes, else the 8-byte words of :func:`text_words`.

    Example:
        >>> [w.dtype.name for w in field_words(np.array([7, 1234]))]
        ['uint32']
    """
    words = text_words(values)
    if words.shape[1] == 1 and not np.any(words[:, 0] & np.uint64(0xFFFFFFFF)):
        return [(words[:, 0] >> np.uint64(32)).astype(np.uint32)]
    return [np.ascontiguousarray(words[:, w]) for w in range(words.shape[1])]


# ----------------------------------------------------------------------------- lines


def _words_of(values: np.ndarray | Coded, missing: np.ndarray | None) -> list[np.ndarray]:
    """The words of one field's slot (see :func:`field_words`), zero where ``missing``."""
    if isinstance(values, Coded):
        codes = values.codes
        if missing is not None:
            codes = np.where(missing, values.dictionary.missing_code, codes)
        return values.dictionary.words(codes)
    if missing is None:
        return field_words(values)
    words = field_words(np.where(missing, 0, values))  # widths of the values printed only
    for w in words:
        np.putmask(w, missing, 0)
    return words


def _word_view(matrix: np.ndarray, offset: int, dtype: np.dtype) -> np.ndarray:
    """Column view of a (rows, width) uint8 matrix as one (unaligned) word per row."""
    return np.ndarray(
        (matrix.shape[0],), dtype=dtype, buffer=matrix, offset=offset,
        strides=(matrix.shape[1],),
    )


def _bitmap_words(mask: pa.Array, words: int) -> np.ndarray:
    """The bits of a boolean Arrow array as ``words`` uint64 (LSB first)."""
    if isinstance(mask, pa.ChunkedArray):
        mask = mask.combine_chunks()
    if mask.offset % 64:
        return np.packbits(mask.to_numpy(zero_copy_only=False), bitorder="little").view(
            np.uint64
        )
    return np.frombuffer(mask.buffers()[1], dtype=np.uint64, count=words, offset=mask.offset // 8)


def encode_columns(columns: list[Column], separator: bytes) -> pa.ChunkedArray:
    """Each row of ``columns`` as one line starting with ``\\n``, fields split by ``separator``.

    Args:
        columns: ``(values, missing)`` per field in line order; uint32 values print as 8
            lowercase hex digits, other integer values in decimal, a :class:`Coded` column
            as its values; ``missing`` (bool or None) marks empty fields (as do the missing
            codes of a :class:`Coded` column).
        separator: one byte between fields (not a zero byte).

    Returns:
        The lines as a chunked string array, one chunk per block of rows (the filter's
        output, not copied again); each chunk's lines are consecutive in one buffer.
    """
    if len(separator) != 1 or separator == b"\0":
        raise ValueError(f"separator must be one nonzero byte, got {separator!r}")
    n = len(columns[0][0]) if columns else 0
    fields = [_words_of(values, missing) for values, missing in columns]
    # Slot of a field: its separator byte then its words; rows padded to 64 bytes so that
    # the keep-bits of a row are whole uint64 words (counted by popcount).
    widths = [1 + sum(w.itemsize for w in words) for words in fields]
    starts = np.cumsum([0, *widths])
    row_width = -(-int(starts[-1]) // 64) * 64
    block = max(1, min(n, _BLOCK_BYTES // max(row_width, 1)))
    matrix = np.zeros((block, row_width), dtype=np.uint8)
    views = []
    for i, (start, words) in enumerate(zip(starts[:-1], fields, strict=True)):
        matrix[:, start] = 10 if i == 0 else separator[0]
        at = int(start) + 1
        for w in words:
            views.append((_word_view(matrix, at, w.dtype), w))
            at += w.itemsize
    pieces = []  # one string array per block, over the filter's output
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        m = hi - lo
        for view, column in views:
            view[:m] = column[lo:hi]
        # polars filters a byte array several times faster than Arrow's filter kernel, whose
        # per-bit loop mispredicts on these mixed masks; the Series wraps the matrix.
        flat = pl.Series(matrix[:m].reshape(-1))
        keep = flat != 0
        kept = flat.filter(keep).to_arrow()
        bits = _bitmap_words(keep.to_arrow(), m * row_width // 64)
        counts = np.bitwise_count(bits).reshape(m, -1)  # (m, row_width / 64)
        offsets = np.zeros(m + 1, dtype=np.int32)
        length = offsets[1:]
        length[:] = counts[:, 0]
        for word in range(1, counts.shape[1]):
            length += counts[:, word]
        np.cumsum(offsets, out=offsets)
        data = kept.buffers()[1]
        if kept.offset:
            data = data.slice(kept.offset)
        pieces.append(pa.StringArray.from_buffers(m, pa.py_buffer(offsets), data))
    return pa.chunked_array(pieces, type=pa.string())
