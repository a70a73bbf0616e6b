"""A small trained checkpoint shared by the inference tests (one tiny training run)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ctrctl.config import load_config
from ctrctl.testing.datasets import SyntheticDataset, make_dataset
from ctrctl.testing.threads import torch_threads
from ctrctl.training.loop import train

OVERRIDES = [
    "model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
    "training.batch_size=64", "training.epochs=2", "training.num_workers=1",
    "training.device=cpu", "training.checkpoint_every=0", "training.val_every=0",
]


@dataclass(frozen=True)
class Trained:
    dataset: SyntheticDataset
    run: Path


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    root = tmp_path_factory.mktemp("trained")
    ds = make_dataset(root / "ds", {"train": 2000, "val": 300, "test": 600}, num_dense=3,
                      num_sparse=5, num_embeddings=[40, 50, 60, 30, 200], row_group_size=256,
                      seed=3)
    with torch_threads(1):  # session-scoped: outside the per-test fixture
        train(ds.path, root / "run", load_config(None, OVERRIDES))
    return Trained(ds, root / "run")
