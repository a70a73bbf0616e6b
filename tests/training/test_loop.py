"""The train loop: learns, checkpoints, and resumes bitwise (CPU, one process)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ctrctl import checkpoint as ckpt
from ctrctl.config import load_config
from ctrctl.errors import OutputExistsError
from ctrctl.metrics.functional import roc_auc
from ctrctl.models.scoring import load_model, predict_split
from ctrctl.testing.datasets import SyntheticDataset, make_dataset
from ctrctl.training.loop import train

OVERRIDES = [
    "model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
    "training.batch_size=64", "training.epochs=2", "training.val_every=6",
    "training.checkpoint_every=7", "training.log_every=3", "training.num_workers=1",
    "training.shuffle_buffer=300", "training.device=cpu",
]


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> SyntheticDataset:
    return make_dataset(tmp_path_factory.mktemp("ds") / "ds",
                        {"train": 1000, "val": 300, "test": 300}, num_dense=3, num_sparse=4,
                        num_embeddings=[40, 50, 60, 30], row_group_size=256, seed=3)


def _state(out: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict]:  # type: ignore[type-arg]
    path = ckpt.resolve_checkpoint(out)
    meta = ckpt.read_metadata(path)
    wanted = [(t, 0, 0, *meta.table_shape(t)) for t in sorted(meta.tables)]
    tables = {}
    for s in ckpt.load_table_shards(path, wanted):
        tables[s.table] = s.weight
        tables.update({f"{s.table}.{k}": v for k, v in s.optimizer_state.items()})
    dense, optim = ckpt.load_dense(path)
    return tables, dense, optim


def _assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


@pytest.mark.parametrize("stop_after", [5, 15])  # mid-epoch (15 steps per epoch) and across
def test_resume_is_bitwise_equal_to_an_uninterrupted_run(
    ds: SyntheticDataset, tmp_path: Path, stop_after: int
) -> None:
    cfg = load_config(None, OVERRIDES)
    whole = train(ds.path, tmp_path / "whole", cfg)
    first = train(ds.path, tmp_path / "split", cfg, stop_after=stop_after)
    assert first.step == stop_after
    assert ckpt.read_metadata(first.checkpoint).step == stop_after
    resumed = train(ds.path, tmp_path / "split", cfg, resume=True)
    assert resumed.step == whole.step == 2 * 16
    timing = {"train.samples_per_s"}
    assert [{k: v for k, v in h.items() if k not in timing} for h in resumed.history] == [
        {k: v for k, v in h.items() if k not in timing} for h in whole.history]
    assert {k: v for k, v in resumed.metrics.items()} == whole.metrics
    t1, d1, o1 = _state(tmp_path / "whole")
    t2, d2, o2 = _state(tmp_path / "split")
    _assert_bitwise(t1, t2)
    _assert_bitwise(d1, d2)
    for s1, s2 in zip(o1["state"].values(), o2["state"].values(), strict=True):
        _assert_bitwise(s1, s2)


def test_checkpoints_metrics_and_refusal_to_overwrite(ds: SyntheticDataset, tmp_path: Path) -> None:
    cfg = load_config(None, OVERRIDES)
    result = train(ds.path, tmp_path / "run", cfg)
    steps = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    # training.keep_checkpoints=2: the older periodic checkpoints are pruned
    assert steps == ["step-00000028", "step-00000032"]
    assert ckpt.latest_checkpoint(tmp_path / "run" / "checkpoints") == result.checkpoint
    assert (tmp_path / "run" / "metrics.json").is_file()
    assert [h["step"] for h in result.history if "val.auc" in h] == [6, 12, 18, 24, 30, 32]
    assert 0.5 < result.metrics["val.auc"] <= 1.0
    with pytest.raises(OutputExistsError):
        train(ds.path, tmp_path / "run", cfg)
    # predict_split scores the split in file order with the checkpoint's model
    model, manifest, config = load_model(tmp_path / "run")
    assert config == cfg and manifest.table_sizes() == ds.manifest.table_sizes()
    labels, scores = zip(*predict_split(tmp_path / "run", ds.path, "val", batch_size=128),
                         strict=True)
    y, p = np.concatenate(labels), np.concatenate(scores)
    assert len(y) == 300 and ((p > 0) & (p < 1)).all()
    assert roc_auc(y, p) == pytest.approx(result.metrics["val.auc"], abs=1e-6)


def test_learns_the_planted_model(tmp_path: Path) -> None:
    # A clean, learnable signal: the model's AUC approaches the best achievable one.
    data = make_dataset(tmp_path / "ds", {"train": 20000, "val": 4000}, num_dense=2,
                        num_sparse=3, num_embeddings=20, seed=7)
    cfg = load_config(None, [
        "model.embedding_dim=4", "model.dense_arch=[8,4]", "model.over_arch=[16,1]",
        "training.batch_size=256", "training.epochs=3", "training.device=cpu",
        "training.num_workers=1", "embedding_optimizer.lr=0.1", "dense_optimizer.lr=0.05",
    ])
    result = train(data.path, tmp_path / "run", cfg)
    labels = np.concatenate([y for y, _ in predict_split(tmp_path / "run", data.path, "val")])
    best = roc_auc(labels, data.probs["val"])
    assert result.metrics["val.auc"] >= best - 0.01, (result.metrics["val.auc"], best)


@pytest.mark.parametrize("pipeline", ["dcn.yaml", "default.yaml"])
def test_shipped_pipelines_train(ds: SyntheticDataset, tmp_path: Path, pipeline: str) -> None:
    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "pipelines" / pipeline, [
        "training.batch_size=128", "training.max_steps=3", "training.num_workers=0",
        "training.device=cpu"])
    result = train(ds.path, tmp_path / "run", cfg)
    assert result.step == 3 and np.isfinite(result.metrics["train.loss"])
    model, _, config = load_model(tmp_path / "run")
    assert config.model.interaction == cfg.model.interaction
