"""Rows cut short (fewer fields than the schema) are bad rows, refused or skipped and counted
like the others, on the native path and on polars; they were read as missing values,
silently (a row cut to 20 of Criteo's 40 fields moved its score by up to 0.19)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.data.preprocess import preprocess
from ctrctl.data.synthetic import synthesize
from ctrctl.errors import InputDataError

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ["criteo.yaml", "criteo_vocab.yaml"]  # the native fast path, and polars


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    folder = tmp_path_factory.mktemp("short-rows")
    synthesize(folder / "logs", rows=400, format="criteo", seed=2, splits={"train": 1.0})
    return (folder / "logs" / "train.tsv").read_text().splitlines()


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("schema", SCHEMAS)
def test_a_row_cut_to_20_fields_is_refused(schema: str, lines: list[str],
                                           tmp_path: Path) -> None:
    cut = [*lines[:10], "\t".join(lines[10].split("\t")[:20]), *lines[11:]]
    src = _write(tmp_path / "cut.tsv", cut)
    with pytest.raises(InputDataError, match=r"cut\.tsv:11: row has fewer fields than the "
                                             r"schema's 40 columns"):
        preprocess(ROOT / "schemas" / schema, [f"train={src}"], tmp_path / "ds",
                   val_fraction=0.0)
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("schema", SCHEMAS)
def test_skipped_short_rows_are_counted(schema: str, lines: list[str], tmp_path: Path) -> None:
    cut = [("\t".join(line.split("\t")[:35]) if i % 50 == 7 else line)
           for i, line in enumerate(lines)]
    src = _write(tmp_path / "cut.tsv", cut)
    m = preprocess(ROOT / "schemas" / schema, [f"train={src}"], tmp_path / "ds",
                   val_fraction=0.0, on_bad_rows="skip")
    assert m.bad_rows["too_few_fields"] == 8
    assert m.splits["train"].rows == len(lines) - 8


@pytest.mark.parametrize("schema", SCHEMAS)
def test_empty_trailing_fields_are_missing_values_not_short(schema: str, lines: list[str],
                                                            tmp_path: Path) -> None:
    emptied = ["\t".join(line.split("\t")[:30] + [""] * 10) for line in lines]
    src = _write(tmp_path / "empty.tsv", emptied)
    m = preprocess(ROOT / "schemas" / schema, [f"train={src}"], tmp_path / "ds",
                   val_fraction=0.0)
    assert m.splits["train"].rows == len(lines) and not any(m.bad_rows.values())


def test_a_csv_row_cut_short_is_refused_and_a_quoted_one_is_not_counted(
        tmp_path: Path) -> None:
    synthesize(tmp_path / "logs", rows=200, format="avazu", seed=3, splits={"train": 1.0})
    lines = (tmp_path / "logs" / "train.csv").read_text().splitlines()
    assert "," in lines[0] and not lines[0][0].isdigit()  # a header line
    cut = [*lines[:6], ",".join(lines[6].split(",")[:10]), *lines[7:]]
    src = _write(tmp_path / "cut.csv", cut)
    with pytest.raises(InputDataError, match=r"cut\.csv:7: row has fewer fields"):
        preprocess(ROOT / "schemas" / "avazu.yaml", [f"train={src}"], tmp_path / "ds",
                   val_fraction=0.0)
    # a quoted field holding a line break makes two short lines of one whole row: not short
    fields = lines[6].split(",")
    quoted = ",".join([*fields[:5], f'"{fields[5]}\nx"', *fields[6:]])
    src = _write(tmp_path / "quoted.csv", [*lines[:6], quoted, *lines[7:]])
    m = preprocess(ROOT / "schemas" / "avazu.yaml", [f"train={src}"], tmp_path / "ds2",
                   val_fraction=0.0, on_bad_rows="skip")
    assert m.bad_rows.get("too_few_fields", 0) == 0  # (its value is a bad hex id instead)
    assert m.splits["train"].rows == len(lines) - 2
