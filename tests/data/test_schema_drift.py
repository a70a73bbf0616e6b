"""Schema drift: a new day's raw logs whose columns, types or formats changed are named
(column, what changed, example line) before preprocessing, and ``ctrctl run`` stops there."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.data.schema import load_schema
from ctrctl.data.schema_drift import check_schema_drift, find_schema_drift
from ctrctl.data.synthetic import synthesize
from ctrctl.errors import SchemaError

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schemas" / "criteo_vocab.yaml"


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = tmp_path_factory.mktemp("raw") / "logs"
    synthesize(raw, rows=400, format="criteo", seed=2)
    return raw / "train.tsv"


def _rewrite(src: Path, dst: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    lines = src.read_text().splitlines()
    dst.write_text("\n".join(edit(i, line.split("\t")) for i, line in enumerate(lines)) + "\n")
    return dst


def test_logs_that_match_the_schema_pass(day: Path) -> None:
    assert find_schema_drift(load_schema(SCHEMA), [day]) == []
    check_schema_drift(load_schema(SCHEMA), [day])


def test_a_changed_type_and_format_are_named_with_an_example_line(day: Path,
                                                                  tmp_path: Path) -> None:
    def edit(i: int, f: list[str]) -> str:
        if f[3]:
            f[3] = f"{f[3]}.5"             # I3: int -> float
        if f[14 + 5]:
            f[14 + 5] = f"u-{i}"            # C6: hex -> free text
        if i == 7:
            f[20] = "zz!"                   # one bad value in C7: a bad row, not drift
        return "\t".join(f)

    drifted = _rewrite(day, tmp_path / "day2.tsv", edit)
    drifts = {d.column: d for d in find_schema_drift(load_schema(SCHEMA), [drifted])}
    assert set(drifts) == {"I3", "C6"}
    assert drifts["I3"].change.startswith("int values now look like float")
    assert "hex values now look like" in drifts["C6"].change and "'u-" in drifts["C6"].change
    line = next(i for i, text in enumerate(drifted.read_text().splitlines(), start=1)
                if text.split("\t")[3])
    assert drifts["I3"].example.startswith(f"{drifted}:{line}: ")
    with pytest.raises(SchemaError, match=r"I3: int values now look like float.*C6: hex"):
        check_schema_drift(load_schema(SCHEMA), [drifted])


def test_an_added_column_and_bad_labels_are_named(day: Path, tmp_path: Path) -> None:
    added = _rewrite(day, tmp_path / "added.tsv", lambda i, f: "\t".join([*f, "x"]))
    (drift,) = find_schema_drift(load_schema(SCHEMA), [added])
    assert drift.column == "*" and "41 fields, the schema 40 columns" in drift.change
    assert drift.share == 1.0 and drift.example.startswith(f"{added}:1: ")
    labels = _rewrite(day, tmp_path / "labels.tsv",
                      lambda i, f: "\t".join(["-1" if f[0] == "0" else f[0], *f[1:]]))
    (drift,) = find_schema_drift(load_schema(SCHEMA), [labels])
    assert drift.column == "label" and "labels outside 0/1 (e.g. '-1')" in drift.change


def test_ctrctl_run_stops_before_preprocessing(day: Path, tmp_path: Path) -> None:
    from ctrctl.runner import run_pipeline
    from tests.runner.helpers import DEMO, TINY

    drifted = _rewrite(day, tmp_path / "train.tsv",
                       lambda i, f: "\t".join([*f[:13], *f[14:]]))  # I13 dropped
    inputs = f"[train={drifted},test={drifted}]"
    with pytest.raises(SchemaError, match="39 fields, the schema 40 columns"):
        run_pipeline(DEMO, (*TINY, "synth.format=null", f"data.inputs={inputs}"),
                     workdir=tmp_path / "work")
    assert not (tmp_path / "work" / "dataset" / "manifest.json").exists()
