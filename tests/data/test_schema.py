"""Schema YAML: the shipped schemas load, and each kind of mistake is a clear SchemaError."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ctrctl.data.schema import Schema, load_schema
from ctrctl.errors import SchemaError

ROOT = Path(__file__).resolve().parents[2]


def _schema(**overrides: object) -> dict:
    data = {
        "name": "t",
        "format": "tsv",
        "label": "y",
        "columns": [
            {"name": "y", "role": "label"},
            {"name": "d", "role": "dense"},
            {"name": "s", "role": "sparse", "type": "hex", "hash_size": 10},
        ],
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize("name", ["criteo", "avazu", "criteo_1tb"])
def test_shipped_schemas_load(name: str) -> None:
    schema = load_schema(ROOT / "schemas" / f"{name}.yaml")
    assert schema.name == name
    assert len(schema.content_hash()) == 64


def test_criteo_schema_layout() -> None:
    schema = load_schema(ROOT / "schemas" / "criteo.yaml")
    assert [c.name for c in schema.columns][:2] == ["label", "I1"]
    assert [c.name for c in schema.dense] == [f"I{i}" for i in range(1, 14)]
    assert schema.sparse_names == [f"C{i}" for i in range(1, 27)]
    assert schema.sep == "\t" and schema.header is False
    sizes = [c.hash_size for c in schema.sparse]
    assert max(sizes) == 1_000_000 and min(sizes) == 1000
    assert all(c.transform == "log1p" for c in schema.dense)


def test_avazu_schema_derives_time_features() -> None:
    schema = load_schema(ROOT / "schemas" / "avazu.yaml")
    assert schema.label == "click" and schema.sep == "," and schema.header == "auto"
    assert schema.sparse_names[-2:] == ["hour_of_day", "weekday"]
    assert "id" not in schema.sparse_names and not schema.dense


def test_hash_ignores_layout_but_not_content(tmp_path: Path) -> None:
    a = Schema.from_dict(_schema())
    path = tmp_path / "s.yaml"
    path.write_text("# comment\n" + yaml.safe_dump(_schema(), default_flow_style=True))
    assert load_schema(path).content_hash() == a.content_hash()
    assert Schema.from_dict(_schema(name="u")).content_hash() != a.content_hash()


def test_with_vocab_switches_every_sparse_column() -> None:
    schema = Schema.from_dict(_schema()).with_vocab(5)
    assert [(c.min_count, c.hash_size, c.mode) for c in schema.sparse] == [(5, None, "vocab")]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"label": "nope"}, "label 'nope'"),
        ({"columns": [{"name": "y", "role": "label"}]}, "no dense and no sparse"),
        ({"columns": [{"name": "y", "role": "label"}, {"name": "s", "role": "sparse"}]},
         "exactly one of hash_size"),
        ({"columns": [{"name": "y", "role": "label"},
                      {"name": "s", "role": "sparse", "hash_size": 3, "min_count": 2}]},
         "exactly one of hash_size"),
        ({"columns": [{"name": "y", "role": "label"}, {"name": "y", "role": "dense"}]},
         "duplicate"),
        ({"columns": [{"name": "y", "role": "label"}, {"name": "d", "role": "dense",
                                                       "transform": "clip"}]}, "clip"),
        ({"format": "xlsx"}, "format"),
        ({"columns": [{"name": "y", "role": "label"},
                      {"name": "d", "role": "dense", "colour": 1}]}, "colour"),
    ],
)
def test_invalid_schemas_are_clear_errors(change: dict, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        Schema.from_dict(_schema(**change), where="bad.yaml")


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="not found"):
        load_schema(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SchemaError, match="invalid YAML"):
        load_schema(bad)
