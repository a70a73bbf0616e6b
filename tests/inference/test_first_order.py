"""A model without dense features and its learned vector (``model.first_order``) through
training, checkpoints, quantized sharded serving and export; checkpoints written before the
setting existed load as the pairs-only model they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ctrctl.config import load_config
from ctrctl.data.dataset import BatchLoader
from ctrctl.inference.export import export_program, load_artifact, write_artifact
from ctrctl.inference.predictor import batch_inputs
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
from ctrctl.models.scoring import load_model
from ctrctl.testing.datasets import make_dataset
from ctrctl.training.loop import train

from .conftest import OVERRIDES


@pytest.fixture(scope="module")
def sparse_only(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sparse-only")
    ds = make_dataset(root / "ds", {"train": 1500, "val": 200, "test": 300}, num_dense=0,
                      num_sparse=3, num_embeddings=[40, 60, 30], row_group_size=256, seed=5)
    # the dot interaction, the one with the learned vector (auto would pick dcn: 3 features)
    train(ds.path, root / "run", load_config(None, [*OVERRIDES, "training.epochs=1",
                                                    "model.interaction=dot"]))
    return ds.path, root / "run"


def _batch(dataset: Path) -> object:
    return next(iter(BatchLoader.for_scoring(dataset, "test", 64, num_workers=0).epoch(0)))


@pytest.mark.parametrize("dense_dtype", ["fp32", "bf16"])
def test_the_learned_vector_is_served_sharded_and_exported(
        sparse_only: tuple[Path, Path], dense_dtype: str, tmp_path: Path) -> None:
    dataset, run = sparse_only
    fp32, _, config = load_model(run)
    assert config.model.first_order and fp32.dense_anchor is not None
    assert not torch.equal(fp32.dense_anchor, torch.ones_like(fp32.dense_anchor))  # it learned
    batch = _batch(dataset)
    with torch.no_grad():
        reference = torch.sigmoid(fp32(batch.dense, batch.sparse))  # type: ignore[attr-defined]
    one = quantize_checkpoint(run, QuantizeConfig(dtype="int8", dense_dtype=dense_dtype))
    two = quantize_checkpoint(run, QuantizeConfig(dtype="int8", num_shards=2,
                                                  dense_dtype=dense_dtype))
    inputs = batch_inputs(batch, two.model.input_features)  # type: ignore[arg-type]
    served = two.model(*inputs)
    assert torch.equal(served, one.model(*batch_inputs(
        batch, one.model.input_features)))  # type: ignore[arg-type]
    assert 0 < float((served - reference).abs().max()) < 0.03
    assert torch.equal(export_program(two.model).module()(*inputs), served)
    # the artifact, loaded by the standalone loader (torch alone), scores the same
    folder = write_artifact(two, tmp_path / "export", dataset=dataset)
    assert torch.equal(load_artifact(folder).score(*inputs), served)


def test_a_checkpoint_from_before_the_setting_loads_without_the_vector(
        sparse_only: tuple[Path, Path], tmp_path: Path) -> None:
    dataset, _ = sparse_only
    run = tmp_path / "run"
    train(dataset, run, load_config(None, [*OVERRIDES, "training.epochs=1",
                                           "model.interaction=dot", "model.first_order=false"]))
    trained, _, _ = load_model(run)
    batch = _batch(dataset)
    with torch.no_grad():
        before = trained(batch.dense, batch.sparse)  # type: ignore[attr-defined]
    edited = 0
    for meta in run.rglob("metadata.json"):  # as an older ctrctl wrote them
        data = json.loads(meta.read_text())
        del data["config"]["model"]["first_order"]
        meta.write_text(json.dumps(data))
        edited += 1
    assert edited
    old, _, config = load_model(run)
    assert not config.model.first_order and old.dense_anchor is None
    with torch.no_grad():
        assert torch.equal(old(batch.dense, batch.sparse), before)  # type: ignore[attr-defined]
