"""``ctrctl eval`` on a run that did not finish says so; saved predictions carry keys."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from ctrctl.config import load_config
from ctrctl.evaluation.evaluate import evaluate
from ctrctl.testing.datasets import make_dataset
from ctrctl.training.loop import train

OVERRIDES = [
    "model.embedding_dim=4", "model.dense_arch=[8,4]", "model.over_arch=[8,1]",
    "training.batch_size=64", "training.epochs=2", "training.num_workers=0",
    "training.device=cpu", "training.early_stopping.enabled=false",
]


def test_unfinished_run_is_flagged_and_predictions_carry_keys(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ds = make_dataset(tmp_path / "ds", {"train": 640, "test": 300}, num_dense=2,
                      num_sparse=2, num_embeddings=30, seed=4)
    cfg = load_config(None, OVERRIDES)
    train(ds.path, tmp_path / "run", cfg, stop_after=4)  # killed: a periodic checkpoint
    with caplog.at_level("WARNING"):
        partial = evaluate(tmp_path / "e1", checkpoint=tmp_path / "run", dataset=ds.path,
                           baselines=False)
    assert (partial.metrics["checkpoint_finished"], partial.metrics["checkpoint_step"]) == (
        False, 4)
    assert "did not finish" in caplog.text
    train(ds.path, tmp_path / "run", cfg, resume=True)
    done = evaluate(tmp_path / "e2", checkpoint=tmp_path / "run", dataset=ds.path,
                    baselines=False, save_predictions=True, keep=["C1"])
    assert done.metrics["checkpoint_finished"] is True and done.metrics["checkpoint_step"] == 20
    saved = pl.read_parquet(tmp_path / "e2" / "predictions" / "*.parquet")
    assert saved.columns[:3] == ["row", "label", "score"] and "C1" in saved.columns
    assert saved["row"].to_list() == list(range(300))
    split = pl.read_parquet(ds.path / "test" / "*.parquet")
    assert saved["C1"].to_list() == split["C1"].to_list()
    assert saved["label"].to_list() == split["label"].cast(pl.Int8).to_list()
