"""The column encoder against the preprocess step: random raw values (hex, ints, strings,
missing, unseen, timestamps) encode to exactly the ids and dense values that ``ctrctl
preprocess`` writes; and what the contract refuses, with the column, row and expectation."""

from __future__ import annotations

import csv
import datetime
import json
import string
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctrctl.data.manifest import DatasetManifest
from ctrctl.data.preprocess import preprocess
from ctrctl.inference.export import _vocabulary_files, input_contract
from ctrctl.inference.standalone import InputError, ServingModel

SCHEMA = """\
name: mixed
format: csv
header: true
label: click
columns:
  - {name: id, role: ignore}
  - {name: click, role: label}
  - name: hour
    role: ignore
    derive: {format: "%y%m%d%H", features: [hour_of_day, weekday, day]}
  - {name: n_int, role: dense, type: int}
  - {name: n_float, role: dense, type: float, transform: clip, clip: [-5, 50], fill: 1.5}
  - {name: h_hex, role: sparse, type: hex, hash_size: 1009}
  - {name: h_int, role: sparse, type: int, hash_size: 97}
  - {name: h_str, role: sparse, type: string, hash_size: 53}
  - {name: m_str, role: sparse, type: string, hash_size: 31, multi_hot_separator: "|"}
  - {name: v_hex, role: sparse, type: hex, min_count: 1}
  - {name: v_int, role: sparse, type: int, min_count: 2}
  - {name: v_str, role: sparse, type: string, min_count: 1}
"""
COLUMNS = ["id", "click", "hour", "n_int", "n_float", "h_hex", "h_int", "h_str", "m_str",
           "v_hex", "v_int", "v_str"]
#: Keys the training split holds (vocabulary features see them; others are unseen).
SEEN = {"hex": ["00ff", "1a2b3c4d", "ffffffffffffffff", "7"],
        "int": ["-3", "0", "12", "123456789012"],
        "str": ["a", "é漢", "x y", "long" * 10]}


def _text(alphabet: str = string.ascii_letters + string.digits + " -_.éß漢🙂") -> Any:
    return st.text(alphabet, min_size=1, max_size=40).filter(lambda s: s != "null")


HEX = st.integers(0, 2**64 - 1).map(lambda v: f"{v:x}") | st.integers(0, 2**20).map(
    lambda v: f"{v:08X}") | st.sampled_from(SEEN["hex"])
INT = st.integers(-2**62, 2**62).map(str) | st.sampled_from(SEEN["int"])
STR = _text() | st.sampled_from(SEEN["str"])
HOUR = st.datetimes(datetime.datetime(1970, 1, 1), datetime.datetime(2069, 12, 31)).map(
    lambda d: d.strftime("%y%m%d%H"))
DENSE_INT = st.integers(-10**6, 10**9).map(str)
DENSE_FLOAT = st.floats(-1e6, 1e6, allow_nan=False).map(repr)


def _maybe(values: Any) -> Any:
    return st.just("") | values


ROW = st.fixed_dictionaries({
    "id": st.just("1"), "click": st.sampled_from(["0", "1"]), "hour": _maybe(HOUR),
    "n_int": _maybe(DENSE_INT), "n_float": _maybe(DENSE_FLOAT), "h_hex": _maybe(HEX),
    "h_int": _maybe(INT), "h_str": _maybe(STR),
    "m_str": st.lists(STR, max_size=3).map("|".join), "v_hex": _maybe(HEX),
    "v_int": _maybe(INT), "v_str": _maybe(STR)})


def _train_rows() -> list[dict[str, str]]:
    rows = []
    for i in range(12):
        rows.append({"id": str(i), "click": str(i % 2), "hour": "14102100", "n_int": str(i),
                     "n_float": "0.5", "h_hex": "ab", "h_int": "1", "h_str": "s",
                     "m_str": "p|q", "v_hex": SEEN["hex"][i % 4], "v_int": SEEN["int"][i % 4],
                     "v_str": SEEN["str"][i % 4] if i % 5 else ""})
    return rows


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def _model(dataset: Path, stage: Path) -> ServingModel:
    """A loaded artifact's encoder over ``dataset``'s transforms (no program: ids only)."""
    manifest = DatasetManifest.load(dataset)
    stage.mkdir(exist_ok=True)
    files = _vocabulary_files(manifest, dataset, stage)
    contract = input_contract(manifest, manifest.sparse_names, files)
    vocabularies = {n: json.loads((stage / p).read_text()) for n, p in files.items()}
    return ServingModel(str(stage), {"input": contract}, None, vocabularies)


def _preprocessed(root: Path, rows: list[dict[str, str]]) -> tuple[Path, dict[str, Any]]:
    (root / "schema.yaml").write_text(SCHEMA)
    _write(root / "train.csv", _train_rows())
    _write(root / "test.csv", rows)
    dataset = root / "dataset"
    preprocess(root / "schema.yaml", [f"train={root / 'train.csv'}",
                                      f"test={root / 'test.csv'}"], dataset, overwrite=True)
    table = pq.read_table(sorted((dataset / "test").glob("*.parquet")))
    return dataset, table.to_pydict()


def _expected(model: ServingModel, split: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """The split's (dense, ids, lengths) laid out as the program's inputs."""
    dense = np.stack([np.asarray(split[d["name"]], np.float32)
                      for d in model.contract["dense"]], 1)
    ids, lengths = [], []
    for feature in model.contract["order"]:
        for value in split[feature]:
            keys = value if isinstance(value, list) else [value]
            ids.extend(keys)
            lengths.append(len(keys))
    return dense, np.asarray(ids, np.int64), np.asarray(lengths, np.int64)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.data_too_large])
@given(rows=st.lists(ROW, min_size=1, max_size=25))
def test_random_raw_values_encode_to_the_preprocessed_ids(
        rows: list[dict[str, str]], tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("prop")
    dataset, split = _preprocessed(root, rows)
    model = _model(dataset, root / "export")
    dense, ids, lengths = _expected(model, split)
    columns = {name: [r[name] for r in rows] for name in COLUMNS}
    got = model.encode_columns(columns, len(rows))
    np.testing.assert_array_equal(got[1].numpy(), ids)
    np.testing.assert_array_equal(got[2].numpy(), lengths)
    np.testing.assert_array_equal(got[0].numpy(), dense)
    # Again, every value now from the encoder's caches (ids and dense values).
    again = model.encode_columns(columns, len(rows))
    for a, b in zip(got, again, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # Rows (dicts, None for missing) encode as the columns do.
    records = [{k: (v or None) for k, v in r.items()} for r in rows]
    np.testing.assert_array_equal(model.encode(records)[1].numpy(), ids)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> ServingModel:
    root = tmp_path_factory.mktemp("mixed")
    dataset, _ = _preprocessed(root, _train_rows()[:3])
    return _model(dataset, root / "export")


def test_the_contract_lists_raw_columns_not_derived_features(mixed: ServingModel) -> None:
    assert mixed.input_columns() == ["hour", "n_int", "n_float", "h_hex", "h_int", "h_str",
                                     "m_str", "v_hex", "v_int", "v_str"]
    assert mixed.contract["ignored"] == ["id", "click"]
    assert "hour_of_day" in mixed.contract["order"]


def test_numbers_and_arrays_encode_as_their_text(mixed: ServingModel) -> None:
    text = {"hour": ["14102103", None], "n_int": ["7", ""], "h_int": ["12", None],
            "v_int": ["12", None], "n_float": ["2.5", None]}
    typed = {"hour": np.array([14102103.0, np.nan]), "n_int": [7, None],
             "h_int": np.array([12.0, np.nan]), "v_int": np.array([12.0, np.nan]),
             "n_float": np.array([2.5, np.nan])}
    for a, b in zip(mixed.encode_columns(text, 2), mixed.encode_columns(typed, 2),
                    strict=True):
        assert np.array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize(("columns", "feature", "row", "needle"), [
    ({"I99": ["1", "2"]}, "I99", None, "none named 'I99'"),
    ({"H_HEX": ["1", "2"]}, "H_HEX", None, "did you mean 'h_hex'"),
    ({"h_hex": ["1", "zzzz"]}, "h_hex", 1, "a hex string"),
    ({"h_hex": ["1" * 17, "1"]}, "h_hex", 0, "at most 16 digits"),
    ({"h_int": ["1", "2.5"]}, "h_int", 1, "an integer"),
    ({"n_int": ["1", "abc"]}, "n_int", 1, "an integer"),
    ({"n_float": ["1", "x"]}, "n_float", 1, "a number"),
    ({"n_float": ["1", [1, 2]]}, "n_float", 1, "not a list"),
    ({"h_str": ["a", ["b"]]}, "h_str", 1, "not a list"),
    ({"n_int": [True, 1]}, "n_int", 0, "not bool"),
    ({"hour": ["14102100", "14139900"]}, "hour", 1, "a timestamp"),
    ({"hour": ["1410210", None]}, "hour", 0, "8 characters"),
    ({"h_int": ["1"]}, "h_int", None, r"2 values \(one per row\)"),
    ({"h_int": np.zeros((2, 3))}, "h_int", None, "scalar values"),
])
def test_bad_values_are_refused_naming_column_row_and_expectation(
        mixed: ServingModel, columns: dict[str, Any], feature: str, row: int | None,
        needle: str) -> None:
    with pytest.raises(InputError, match=needle) as caught:
        mixed.encode_columns(columns, 2)
    assert (caught.value.feature, caught.value.row) == (feature, row)
    assert caught.value.expected and isinstance(caught.value, ValueError)


def test_records_that_are_not_objects_and_absent_columns(mixed: ServingModel) -> None:
    with pytest.raises(InputError, match="row 1: expected an object"):
        mixed.encode([{"h_int": "1"}, ["1", "2"]])  # type: ignore[list-item]
    dense, ids, lengths = mixed.encode([{}, {"click": "1", "id": "9"}])  # ignored columns
    assert lengths.tolist() == [1] * 6 + [0, 0] + [1] * 12  # m_str: no elements
    # Missing: id 0 when hashed, the id of the key null in a vocabulary that has one.
    null_str = json.loads(Path(mixed.folder, "vocab", "v_str.json").read_text())["null"]
    assert ids.tolist() == [0] * 10 + [null_str] * 2 + [0] * 6
    assert dense[:, 1].tolist() == [1.5, 1.5]  # n_float's fill


def test_two_digit_years_pivot_as_polars_reads_them(mixed: ServingModel) -> None:
    # chrono (polars' strptime) reads %y 00-69 as 20xx and 70-99 as 19xx (Python: 69 is
    # 1969): 2069-01-01 was a Tuesday, 1970-01-01 a Thursday.
    _, ids, lengths = mixed.encode_columns({"hour": ["69010100", "70010123"]}, 2)
    order = mixed.contract["order"]
    ends = lengths.view(len(order), 2).sum(1).cumsum(0).tolist()
    by_feature = {name: ids[end - 2:end].tolist() for name, end in zip(order, ends,
                                                                        strict=True)}
    assert by_feature["weekday"] == [2, 4] and by_feature["hour_of_day"] == [0, 23]


def test_cached_values_encode_as_parsed_ones_and_errors_keep_their_row(
        mixed: ServingModel) -> None:
    columns = {"h_hex": ["ab", None, "AB"], "v_int": ["12", "", "12"], "h_int": ["-3", "", "5"],
               "n_int": ["7", "", None], "n_float": ["0.25", None, "60"]}
    first = [t.numpy() for t in mixed.encode_columns(columns, 3)]  # parsed, then remembered
    again = [t.numpy() for t in mixed.encode_columns(columns, 3)]  # from the cache
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(InputError) as caught:
        mixed.encode_columns({"h_hex": ["ab", "ab", "zz-top"]}, 3)
    assert (caught.value.feature, caught.value.row) == ("h_hex", 2)
    with pytest.raises(InputError, match="not a list") as caught:  # unhashable: no lookup
        mixed.encode_columns({"h_hex": ["ab", ["ab"], "ab"]}, 3)
    assert (caught.value.feature, caught.value.row) == ("h_hex", 1)
    # Dense values: cached text beside new text, the new one at fault keeps its row.
    np.testing.assert_allclose(first[0][:, 0], np.log1p([7, 0, 0], dtype=np.float32))
    np.testing.assert_array_equal(first[0][:, 1], [0.25, 1.5, 50])
    for column, row in ((["7", "0.5", "7"], 1), (["7", "", "x"], 2), (["7", True, "7"], 1)):
        with pytest.raises(InputError) as caught:
            mixed.encode_columns({"n_int": column}, 3)
        assert (caught.value.feature, caught.value.row) == ("n_int", row)
    mixed.encode_columns({"n_float": ["0.5"]}, 1)  # a float's cache is not an int's:
    with pytest.raises(InputError, match="an integer"):
        mixed.encode_columns({"n_int": ["0.5"]}, 1)
