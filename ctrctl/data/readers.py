"""Raw inputs: ``[SPLIT=]PATH`` arguments, file checks, header detection and lazy scans.

CSV/TSV inputs (plain or gzip) are scanned lazily with every column as a string and one extra
column that is non-null only on rows with more fields than the schema; a row with fewer
fields is flagged in ``__short`` (counted in a first pass over the lines, as the CSV reader
reads absent trailing fields as empty ones; CSV lines with quotes are not counted), and
becomes a bad row.
Parquet inputs are scanned by column name and cast to strings, so that both go through the
same validation. libfm inputs (``label idx:value ...``, space-separated, e.g. Frappe) are read
as space-separated fields and each ``idx:value`` field is cut to its index (sparse columns) or
its value (dense columns); a field without ``:`` is malformed as a bad id or number.

Example:
    >>> source = parse_input("val=logs/day_1.tsv.gz")        # InputSource(split='val', ...)
    >>> scan = scan_input(schema, source.path)               # ScannedInput(frame, header_lines)
"""

from __future__ import annotations

import contextlib
import gzip
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ctrctl.data.schema import Column, Schema
from ctrctl.data.transforms import EXTRA, ROW, SHORT
from ctrctl.errors import InputDataError, SchemaError

SPLIT_NAMES = ("train", "val", "test")
#: Any other split name (``--input holdout=PATH``): a letter, then letters, digits, - or _.
_SPLIT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
_SAMPLE_BYTES = 1 << 20
_DAY = re.compile(r"day_(\d+)")


@dataclass(frozen=True)
class InputSource:
    """One ``--input``: a path and the split it goes to (None: train, or divided at random)."""

    path: Path
    split: str | None = None


@dataclass(frozen=True)
class ScannedInput:
    """A lazy frame of an input's raw string columns plus ``__extra`` and ``__row``.

    Attributes:
        frame: the lazy scan.
        header_lines: lines before the first data row (line of row r = r + 1 + header_lines).
        estimated_rows: rows guessed from the file size, or None (gzip, Parquet).
    """

    frame: pl.LazyFrame
    header_lines: int
    estimated_rows: int | None


def parse_input(text: str) -> InputSource:
    """Parse ``[SPLIT=]PATH``; a path containing ``=`` needs an explicit split.

    SPLIT is ``train``, ``val``, ``test`` or any other name (``holdout=PATH``): a letter,
    then letters, digits, ``-`` or ``_``. Several inputs may name the same split.
    """
    split, sep, path = text.partition("=")
    if sep and (split in SPLIT_NAMES or _SPLIT_NAME.fullmatch(split)) and not Path(
            text).exists():
        return InputSource(Path(path), split)
    if sep and "/" not in split and split and not Path(text).exists():
        raise InputDataError(
            f"invalid split name {split!r} in --input {text!r}",
            hint="a split name is a letter, then letters, digits, - or _, e.g. "
                 "--input holdout=PATH")
    return InputSource(Path(text), None)


def day_of(path: Path) -> int:
    """The day number in a Criteo 1TB file name (``day_23``, ``day_23.gz``)."""
    match = _DAY.search(path.name)
    if match is None:
        raise InputDataError(
            "--split-by-day needs inputs named day_N (as Criteo 1TB's day_0 ... day_23)",
            where=str(path),
        )
    return int(match.group(1))


def check_file(path: Path) -> None:
    """Fail clearly on a missing, non-regular or empty input."""
    if not path.exists():
        raise InputDataError("input file not found", where=str(path),
                             hint="check the path given to --input")
    if not path.is_file():
        raise InputDataError("input is not a regular file", where=str(path))
    if path.stat().st_size == 0:
        raise InputDataError("input file is empty", where=str(path))


def is_gzip(path: Path) -> bool:
    """Whether ``path`` starts with gzip's magic bytes (whatever its suffix)."""
    with path.open("rb") as handle:
        return handle.read(2) == b"\x1f\x8b"


#: What reading a damaged gzip stream raises: in Python's gzip module and in polars.
_GZIP_READ_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, OSError, pl.exceptions.PolarsError)


def gzip_damage(path: Path) -> InputDataError | None:
    """Why the gzip file ``path`` cannot be read to its end, or None when it can.

    Decompresses the whole stream once (every member), counting lines, so the error names
    the line where the data stops; it runs only after a read has failed.
    """
    lines = size = 0
    inflate = zlib.decompressobj(wbits=31)
    problem = None
    with path.open("rb") as raw:
        while True:
            chunk = inflate.unused_data or raw.read(1 << 16)
            if not chunk:
                if not inflate.eof:
                    problem = "is cut off"
                break
            if inflate.eof:  # the next member of a multi-member file
                inflate = zlib.decompressobj(wbits=31)
            try:
                data = inflate.decompress(chunk)
            except zlib.error as exc:
                problem = f"is damaged ({exc})"
                break
            lines += data.count(b"\n")
            size += len(data)
        where = raw.tell()
    if problem is None:
        return None
    return InputDataError(
        f"gzip input {problem}: its data stops after {size:,} decompressed bytes, in line "
        f"{lines + 1:,} (compressed byte {where:,} of {path.stat().st_size:,})",
        where=f"{path}:{lines + 1}",
        hint="download or copy the file again; `gzip -t FILE` checks a file")


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    """Turn a failed read of a truncated or corrupt gzip input into one clear error."""
    try:
        yield
    except _GZIP_READ_ERRORS as exc:
        if isinstance(exc, (FileNotFoundError, PermissionError)) or not is_gzip(path):
            raise
        damage = gzip_damage(path)
        if damage is None:
            raise
        raise damage from exc


def _sample(path: Path) -> bytes:
    """The first MiB of the (decompressed) file."""
    if is_gzip(path):
        with reading(path), gzip.open(path, "rb") as handle:
            return handle.read(_SAMPLE_BYTES)
    with path.open("rb") as handle:
        return handle.read(_SAMPLE_BYTES)


def _fields(line: bytes, sep: str) -> list[str]:
    return line.rstrip(b"\r\n").decode("utf-8", errors="replace").split(sep)


def _read_names(schema: Schema, labeled: bool) -> list[str]:
    """The columns a file holds, in file order: all of the schema's, or all but the label."""
    return [c.name for c in schema.columns if labeled or c.role != "label"]


def _detect_header(schema: Schema, first: list[str], path: Path, labeled: bool = True) -> bool:
    names = _read_names(schema, labeled)
    if schema.header == "auto":
        # an unlabeled file's header has no label name: any of its column names marks it
        has_header = schema.label in first or (not labeled and bool(set(first) & set(names)))
    else:
        has_header = bool(schema.header)
    if has_header and first != names:
        missing = [n for n in names if n not in first]
        extra = [f for f in first if f not in names]
        raise SchemaError(
            f"the file's header does not match the schema's columns (missing: {missing}, "
            f"not in the schema: {extra})"
            if missing or extra
            else "the file's header lists the schema's columns in another order",
            where=f"{path}:1",
            hint="fix `columns:` in the schema to list the file's columns in file order",
        )
    return has_header


def has_label_column(schema: Schema, path: Path) -> bool:
    """Whether the raw logs ``path`` hold the schema's label column (serving logs may not).

    A Parquet file names its columns; a CSV/TSV header lacks the label's name; a headerless
    file's rows have one field fewer than the schema's columns (Criteo's unlabeled test.txt:
    39 fields, not 40): its first row, with no row of the first MiB having all of them.
    libfm rows always start with their label.
    """
    check_file(path)
    if schema.format == "libfm":
        return True
    if schema.format == "parquet":
        try:
            return schema.label in pl.scan_parquet(path).collect_schema().names()
        except pl.exceptions.PolarsError:
            return True  # scan_input reports the unreadable file
    pieces = _sample(path).split(b"\n")
    if len(pieces) > 1 and pieces[-1]:
        pieces.pop()  # the sample may cut its last line
    lines = [line for line in pieces if line.strip()]
    if not lines:
        return True
    first = _fields(lines[0], schema.sep)
    if schema.label in first:
        return True
    if schema.header is True or (schema.header == "auto"
                                 and set(first) & set(_read_names(schema, False))):
        return False  # a header without the label's name
    full = len(schema.columns)
    return not (len(first) == full - 1
                and all(len(_fields(line, schema.sep)) < full for line in lines))


def scan_input(schema: Schema, path: Path, *, labeled: bool = True) -> ScannedInput:
    """A lazy scan of one input with every schema column as a nullable string.

    ``labeled=False`` reads logs without the label column (:func:`has_label_column`): the
    other columns in the schema's order, and no label column in the frame.

    Raises:
        InputDataError: the file is missing or has no data rows.
        SchemaError: its header or field count does not match the schema.
    """
    check_file(path)
    names = _read_names(schema, labeled)
    if schema.format == "parquet":
        frame = pl.scan_parquet(path)
        try:
            present = frame.collect_schema().names()
        except pl.exceptions.PolarsError as exc:
            raise InputDataError(f"cannot read Parquet: {exc}", where=str(path)) from exc
        missing = [n for n in names if n not in present]
        if missing:
            raise SchemaError(f"columns {missing} of the schema are not in the file",
                              where=str(path), hint=f"the file has {present}")
        frame = frame.select(
            *[pl.col(n).cast(pl.String) for n in names], pl.lit(None, pl.String).alias(EXTRA),
            pl.lit(False).alias(SHORT))
        return ScannedInput(frame.with_row_index(ROW), 0, None)

    sample = _sample(path)
    lines = sample.split(b"\n")
    if not sample.strip():
        raise InputDataError("input has no data rows", where=str(path))
    first = _fields(lines[0], schema.sep)
    has_header = _detect_header(schema, first, path, labeled)
    data_lines = [line for line in lines[1 if has_header else 0 :] if line.strip()]
    if not data_lines:
        raise InputDataError("input has a header but no data rows", where=str(path))
    n_fields = len(_fields(data_lines[0], schema.sep))
    if n_fields > len(names) or (n_fields == 1 and len(names) > 1):
        raise SchemaError(
            f"the file's first row has {n_fields} fields separated by {schema.sep!r}, the "
            f"schema {len(names)} columns",
            where=f"{path}:{2 if has_header else 1}",
            hint="check the schema's format/separator and columns against the file",
        )
    estimated = None
    if not is_gzip(path) and len(lines) > 1:
        mean_line = max(1.0, (len(sample) - len(lines[-1])) / max(1, len(lines) - 1))
        estimated = int(path.stat().st_size / mean_line)
    frame = pl.scan_csv(
        path,
        has_header=False,
        skip_lines=1 if has_header else 0,
        separator=schema.sep,
        quote_char='"' if schema.format == "csv" else None,
        schema={**{n: pl.String for n in names}, EXTRA: pl.String},
        missing_columns="insert",
        extra_columns="ignore",
        empty_string_is_null=True,
    )
    if schema.format == "libfm":
        frame = frame.with_columns(_libfm_field(c) for c in schema.columns
                                   if c.role in ("dense", "sparse"))
    short = (_short_rows(path, schema, 1 if has_header else 0, len(names))
             if schema.format in ("tsv", "csv") else [])
    frame = frame.with_row_index(ROW).with_columns(
        (pl.col(ROW).is_in(short) if short else pl.lit(False)).alias(SHORT))
    return ScannedInput(frame, 1 if has_header else 0, estimated)


def _short_rows(path: Path, schema: Schema, skip_lines: int, columns: int) -> list[int]:
    """The rows of a TSV or CSV input with fewer fields than the schema's columns.

    The CSV reader fills absent trailing fields exactly as empty ones, so a row cut short
    would read as missing values: count each line's separators instead (one streaming pass;
    TSV has no quoting, so every separator ends a field). A CSV line with a quote is not
    counted (a quoted field may hold the separator, or a line break that makes two lines).
    """
    full = columns - 1  # separators in a whole row
    counted = pl.col("line").fill_null("")
    cut = counted.str.count_matches(schema.sep, literal=True) < full
    if schema.format == "csv":
        cut = cut & ~counted.str.contains('"', literal=True)
    lines = pl.scan_csv(path, has_header=False, skip_lines=skip_lines, separator="\x1f",
                        quote_char=None, schema={"line": pl.String}, extra_columns="ignore",
                        empty_string_is_null=False)
    try:
        found = (lines.with_row_index(ROW)
                 .filter(cut)
                 .select(ROW).collect(engine="streaming"))
    except (OSError, pl.exceptions.PolarsError):
        return []  # a damaged file: the scan itself reports it, with what is known of it
    return [int(r) for r in found[ROW].to_list()]


def _libfm_field(column: Column) -> pl.Expr:
    """A libfm ``idx:value`` field: the index for a sparse column, the value for a dense one
    (a field without ``:`` becomes ``!``, which no id or number parses)."""
    raw = pl.col(column.name).str.strip_chars_end("\r")
    part = r"^([^:]*):" if column.role == "sparse" else r":([^:]*)$"
    return pl.when(raw.str.contains(":")).then(raw.str.extract(part, 1)).otherwise(
        pl.when(raw.is_null()).then(None).otherwise(pl.lit("!"))).alias(column.name)


def raw_row(scan: ScannedInput, row: int) -> dict[str, str | None]:
    """The raw string fields of data row ``row`` (for error messages)."""
    frame = scan.frame.filter(pl.col(ROW) == row).collect(engine="streaming")
    return frame.drop(ROW).row(0, named=True) if frame.height else {}
