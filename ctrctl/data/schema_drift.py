"""Schema drift: raw logs whose columns, types or value formats no longer match the schema.

A new day's logs are checked before any preprocessing or training runs (``ctrctl run`` does
it first in its preprocess step): the first ``sample_lines`` lines of each file are read and

- the columns: a header that names other columns, or rows with more or fewer fields than
  the schema has columns (a column added or dropped);
- the types and value formats: per column, values that the schema's type does not read
  (a dense ``int`` column now holding ``3.5``, a ``hex`` id column now holding ``u-1234``,
  a label outside 0/1 or the label map).

A column drifts when at least ``tolerance`` of its sampled non-empty values fail (a rare bad
row is preprocess's ``on_bad_rows`` business, not drift). Each drift names the column, what
changed and an example line (``file:line`` and its text); :func:`check_schema_drift` raises
one :class:`~ctrctl.errors.SchemaError` listing them all.

Example:
    >>> drifts = find_schema_drift(load_schema("schemas/criteo.yaml"), [Path("day_7.tsv")])
    >>> [(d.column, d.change) for d in drifts]
    [('I3', 'int values now look like float (e.g. "3.5")')]
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ctrctl.data.schema import Column, Schema
from ctrctl.errors import SchemaError

__all__ = ["SchemaDrift", "check_schema_drift", "find_schema_drift"]

SAMPLE_LINES = 2000
TOLERANCE = 0.01

_INT = re.compile(r"^[-+]?\d+$")
_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^[-+]?(inf|nan)$", re.I)
_HEX = re.compile(r"^[0-9a-fA-F]+$")


@dataclass(frozen=True)
class SchemaDrift:
    """One difference between a file and the schema.

    Attributes:
        column: the column (``*`` for the row layout as a whole).
        change: what changed, in words.
        example: ``file:line: text`` of a line that shows it.
        share: the share of sampled values (or rows) affected.
    """

    column: str
    change: str
    example: str
    share: float

    def describe(self) -> str:
        return f"{self.column}: {self.change} ({self.share:.0%} of sampled rows; {self.example})"


def _kind(value: str) -> str:
    if _INT.match(value):
        return "int"
    if _FLOAT.match(value):
        return "float"
    if _HEX.match(value):
        return "hex"
    return "string"


def _reader(column: Column, schema: Schema) -> Callable[[str], bool] | None:
    """Whether a raw value reads as the column's type (None: anything does)."""
    if column.role == "label":
        rule = schema.label_rule
        if rule is not None and rule.map is not None:
            allowed = set(rule.map)
            return lambda v: v in allowed
        if rule is not None:
            return lambda v: bool(_FLOAT.match(v))
        return lambda v: v in ("0", "1")
    if column.role == "ignore" or column.value_type == "string":
        return None
    pattern = {"int": _INT, "float": _FLOAT, "hex": _HEX}[column.value_type]
    separator = column.multi_hot_separator
    if separator:
        return lambda v: all(pattern.match(p) for p in v.split(separator) if p)
    return lambda v: bool(pattern.match(v))


def _lines(path: Path, limit: int) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8", errors="replace", newline="") as handle:
        for line in handle:
            out.append(line.rstrip("\r\n"))
            if len(out) >= limit:
                break
    return out


def _example(path: Path, number: int, line: str) -> str:
    text = line if len(line) <= 160 else line[:157] + "..."
    return f"{path}:{number}: {text!r}"


def _layout(schema: Schema, path: Path, lines: list[str], start: int,
            tolerance: float) -> list[SchemaDrift]:
    names = [c.name for c in schema.columns]
    counts: dict[int, tuple[int, int]] = {}  # fields -> (rows, first line number)
    for number, line in enumerate(lines, start=start):
        if line.strip():
            fields = len(line.split(schema.sep))
            rows, first = counts.get(fields, (0, number))
            counts[fields] = (rows + 1, first)
    total = sum(rows for rows, _ in counts.values())
    drifts = []
    for fields, (rows, first) in sorted(counts.items()):
        if fields == len(names) or rows < tolerance * total:
            continue
        if fields > len(names):
            change = (f"rows have {fields} fields, the schema {len(names)} columns: "
                      f"{fields - len(names)} column(s) added after {names[-1]}, or inside")
        else:
            change = (f"rows have {fields} fields, the schema {len(names)} columns: "
                      f"{len(names) - fields} column(s) dropped (the schema's last "
                      f"{names[fields:][:3]} go unfilled)")
        drifts.append(SchemaDrift("*", change, _example(path, first, lines[first - start]),
                                  rows / max(1, total)))
    return drifts


def _values(schema: Schema, path: Path, lines: list[str], start: int,
            tolerance: float) -> list[SchemaDrift]:
    columns = list(schema.columns)
    drifts = []
    for i, column in enumerate(columns):
        reads = _reader(column, schema)
        if reads is None:
            continue
        seen, bad = 0, 0
        first: tuple[int, str, str] | None = None
        kinds: dict[str, int] = {}
        for number, line in enumerate(lines, start=start):
            fields = line.split(schema.sep)
            if len(fields) != len(columns) or not fields[i]:
                continue  # the layout check names such rows; empty is missing
            seen += 1
            if not reads(fields[i]):
                bad += 1
                kind = _kind(fields[i])
                kinds[kind] = kinds.get(kind, 0) + 1
                first = first or (number, line, fields[i])
        if not seen or bad < max(1, tolerance * seen):
            continue
        assert first is not None
        number, line, value = first
        now = max(kinds, key=lambda k: kinds[k])
        expected = "0/1" if column.role == "label" and schema.label_rule is None else (
            "a label value" if column.role == "label" else column.value_type)
        change = (f"{expected} values now look like {now} (e.g. {value!r})"
                  if column.role != "label" else f"labels outside {expected} (e.g. {value!r})")
        drifts.append(SchemaDrift(column.name, change, _example(path, number, line),
                                  bad / seen))
    return drifts


def _header(schema: Schema, path: Path, first: str) -> list[SchemaDrift]:
    names = [c.name for c in schema.columns]
    found = first.split(schema.sep)
    if found == names or (schema.header == "auto" and schema.label not in found):
        return []
    added = [n for n in found if n not in names]
    dropped = [n for n in names if n not in found]
    drifts = [SchemaDrift(n, "column added (not in the schema)", _example(path, 1, first), 1.0)
              for n in added]
    drifts += [SchemaDrift(n, "column missing from the file", _example(path, 1, first), 1.0)
               for n in dropped]
    if not drifts:
        drifts.append(SchemaDrift("*", "the columns come in another order",
                                  _example(path, 1, first), 1.0))
    return drifts


def find_schema_drift(schema: Schema, paths: Sequence[Path], *,
                      sample_lines: int = SAMPLE_LINES,
                      tolerance: float = TOLERANCE) -> list[SchemaDrift]:
    """Every drift between the first ``sample_lines`` lines of each file and ``schema``.

    CSV and TSV files (gzipped or not) are checked; Parquet and libfm inputs name their own
    columns or fields and are left to preprocess's checks.
    """
    if schema.format not in ("csv", "tsv"):
        return []
    drifts: list[SchemaDrift] = []
    for path in paths:
        lines = _lines(Path(path), sample_lines + 1)
        if not lines:
            continue
        start = 1
        if schema.header is True or (schema.header == "auto"
                                     and schema.label in lines[0].split(schema.sep)):
            found = _header(schema, Path(path), lines[0])
            drifts += found
            if found:
                continue  # the values cannot be lined up with the schema's columns
            lines, start = lines[1:], 2
        lines = lines[:sample_lines]
        drifts += _layout(schema, Path(path), lines, start, tolerance)
        drifts += _values(schema, Path(path), lines, start, tolerance)
    return drifts


def check_schema_drift(schema: Schema, paths: Sequence[Path], *,
                       sample_lines: int = SAMPLE_LINES, tolerance: float = TOLERANCE,
                       where: str = "schema") -> None:
    """Raise one SchemaError naming every drift (column, what changed, example line)."""
    drifts = find_schema_drift(schema, paths, sample_lines=sample_lines, tolerance=tolerance)
    if drifts:
        raise SchemaError(
            f"the raw logs no longer match the schema ({len(drifts)} change(s)): "
            + "; ".join(d.describe() for d in drifts), where=where,
            hint="update the schema (and retrain from scratch if features changed), or fix "
                 "the upstream export")
