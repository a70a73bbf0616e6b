"""The loader refuses data its manifest does not describe, naming feature, file and value."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ctrctl.data.dataset import BatchLoader
from ctrctl.errors import DatasetError
from ctrctl.testing.datasets import make_dataset


def _shrink_table(folder: Path, feature: str, rows: int) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["sparse"]:
        if entry["name"] == feature:
            entry["num_embeddings"] = rows
    path.write_text(json.dumps(manifest))


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    make_dataset(tmp_path / "ds", rows=512, num_sparse=4, multi_hot=("C2",), seed=0)
    return tmp_path / "ds"


def test_ids_beyond_the_manifest_fail_from_statistics(dataset: Path) -> None:
    manifest = json.loads((dataset / "manifest.json").read_text())
    feature = manifest["sparse"][0]["name"]
    _shrink_table(dataset, feature, 2)
    with pytest.raises(DatasetError, match=f"feature '{feature}' has id") as info:
        BatchLoader(dataset, "train", batch_size=64)
    assert "row group" in info.value.render() and ".parquet" in info.value.render()


def test_files_without_statistics_are_checked_when_read(dataset: Path) -> None:
    for path in (dataset / "train").glob("*.parquet"):
        table = pq.read_table(path)
        pq.write_table(table, path, write_statistics=False)
    manifest = json.loads((dataset / "manifest.json").read_text())
    feature = manifest["sparse"][0]["name"]
    _shrink_table(dataset, feature, 2)
    loader = BatchLoader(dataset, "train", batch_size=64)
    with pytest.raises(DatasetError, match=f"feature '{feature}' has id"):
        for _ in loader.epoch(0):
            pass


def test_corrupt_parquet_is_named(dataset: Path) -> None:
    path = sorted((dataset / "train").glob("*.parquet"))[0]
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DatasetError, match="not a readable Parquet file") as info:
        BatchLoader(dataset, "train", batch_size=64)
    assert str(path) in info.value.render()


def test_a_consistent_dataset_loads(dataset: Path) -> None:
    loader = BatchLoader(dataset, "train", batch_size=64)
    assert sum(b.labels.numel() for b in loader.epoch(0)) == loader.rows
