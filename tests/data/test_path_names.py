"""Names that become paths (features, tables, splits, models) cannot leave their folder or
pass a file name's length: one clear error at schema, manifest or config load (N130, N125)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ctrctl.cli.app import main
from ctrctl.config import load_config
from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import ConfigError, FormatError, SchemaError
from ctrctl.io import MAX_NAME_BYTES, path_name_problem
from ctrctl.testing.datasets import make_dataset


def _schema_file(tmp_path: Path, sparse_name: str) -> Path:
    data = {"name": "t", "format": "tsv", "label": "y", "columns": [
        {"name": "y", "role": "label"}, {"name": "d", "role": "dense"},
        {"name": sparse_name, "role": "sparse", "type": "hex", "hash_size": 10}]}
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    return path


@pytest.mark.parametrize(("name", "problem"), [
    ("../../evil", "contains '/'"), ("../" * 8 + "ESCAPED", "contains '/'"), ("..", "'..'"),
    ("a\\b", "contains '\\\\'"), ("x" * 300, "300 bytes long"), ("x" * 10_000, "10,000 bytes"),
    ("é" * 101, "202 bytes long"), ("tab\there", "control character"), ("", "empty")])
def test_a_feature_name_that_is_no_file_name_is_refused_with_nothing_written(
        tmp_path: Path, name: str, problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    schema = _schema_file(tmp_path, name)
    raw = tmp_path / "raw.tsv"
    raw.write_text("".join(f"{i % 2}\t{i}\t{i:x}\n" for i in range(50)))
    out = tmp_path / "ds"
    code = main(["preprocess", "--schema", str(schema), "--input", f"train={raw}",
                 "--out", str(out), "--no-track"])
    err = capsys.readouterr()
    message = " ".join((err.out + err.err).split())
    assert code == 1
    assert problem in message and "schema.yaml" in message
    assert "Traceback" not in message
    assert not out.exists() and not (tmp_path.parent / "evil").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.tsv", "schema.yaml"]


def test_unicode_and_the_longest_names_still_work() -> None:
    assert path_name_problem("Ç1_点击_🙂") is None
    assert path_name_problem("x" * MAX_NAME_BYTES) is None
    assert path_name_problem("x" * (MAX_NAME_BYTES + 1)) is not None


def test_a_dataset_manifest_naming_a_traversing_feature_is_refused(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", {"train": 20, "val": 5, "test": 5}, num_dense=1,
                      num_sparse=1, num_embeddings=[4], seed=0)
    path = ds.path / "manifest.json"
    data = json.loads(path.read_text())
    data["sparse"][0]["name"] = "../../ESCAPED"
    path.write_text(json.dumps(data))
    with pytest.raises(FormatError, match=r"feature name '\.\./\.\./ESCAPED' contains '/'"):
        DatasetManifest.load(ds.path)


@pytest.mark.parametrize("override", [
    "training.val_split=../../x", "model.cached_tables={../evil: 0.5}",
    "register.model_name=a/b", "runner.eval_split=" + "s" * 300, "name=../up"])
def test_config_names_that_become_paths_are_refused(override: str) -> None:
    with pytest.raises(ConfigError, match="the name"):
        load_config(None, [override])


def test_the_schema_error_names_the_name_and_the_file(tmp_path: Path) -> None:
    from ctrctl.data.schema import load_schema

    schema = _schema_file(tmp_path, "../../evil")
    with pytest.raises(SchemaError) as info:
        load_schema(schema)
    assert "'../../evil'" in info.value.render() and str(schema) in info.value.render()
