"""Tables larger than this machine's memory are refused with one "do not fit" error (a
``hash_size`` of 2**40 died in the allocator with a traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ctrctl.config import load_config
from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import ConfigError
from ctrctl.models import build as model_io
from ctrctl.testing.datasets import make_dataset
from ctrctl.training.loop import train
from tests.inference.conftest import OVERRIDES


def _huge(folder: Path) -> Path:
    """A small dataset whose manifest says C1 has 2**40 rows (as ``hash_size: 2**40`` gives)."""
    ds = make_dataset(folder, rows=128, num_sparse=3, seed=0, num_embeddings=[10, 10, 10])
    data = json.loads((ds.path / "manifest.json").read_text())
    data["sparse"][0].update(num_embeddings=2**40, hash_size=2**40)
    (ds.path / "manifest.json").write_text(json.dumps(data))
    return ds.path


def test_a_table_of_2_to_the_40_rows_does_not_fit(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="do not fit in memory") as caught:
        train(_huge(tmp_path / "ds"), tmp_path / "run", load_config(None, OVERRIDES))
    assert "'C1'" in caught.value.message and "1,099,511,627,776 rows" in caught.value.message
    assert "hash_size" in (caught.value.hint or "")


def test_tables_that_fit_and_cached_tables_are_built(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", rows=128, num_sparse=3, seed=0,
                      num_embeddings=[1000, 10, 10])
    manifest = DatasetManifest.load(ds.path)
    model_io.build_model(load_config(None, OVERRIDES), manifest, torch.device("cpu"))
    big = DatasetManifest.load(_huge(tmp_path / "big"))
    with pytest.raises(ConfigError, match="do not fit"):
        model_io._check_tables_fit(big, 8, set())
    model_io._check_tables_fit(big, 8, {"C1"})  # kept on disk: not counted
