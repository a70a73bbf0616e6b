"""Resuming a run that already finished says so and changes nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ctrctl import checkpoint as ckpt
from ctrctl.config import load_config
from ctrctl.testing.datasets import make_dataset
from ctrctl.training.loop import train

OVERRIDES = [
    "model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
    "training.batch_size=64", "training.epochs=1", "training.val_every=0",
    "training.num_workers=1", "training.device=cpu",
]


def test_resuming_a_finished_run_does_nothing(tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    ds = make_dataset(tmp_path / "ds", {"train": 320, "val": 64}, num_dense=2, num_sparse=3,
                      num_embeddings=[20, 30, 40], seed=1)
    cfg = load_config(None, OVERRIDES)
    first = train(ds.path, tmp_path / "run", cfg)
    assert first.stop_reason == "epochs" and not first.already_finished
    folders = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    metrics = (tmp_path / "run" / "metrics.json").read_text()
    log = logging.getLogger("ctrctl")  # the CLI may have stopped it propagating to root
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="ctrctl"):
            again = train(ds.path, tmp_path / "run", cfg, resume=True)
    finally:
        log.removeHandler(caplog.handler)
    assert again.already_finished and again.step == first.step
    assert again.samples_per_s == 0.0 and again.metrics == first.metrics
    assert "already finished at step" in caplog.text and "samples/s" not in caplog.text
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == folders
    assert (tmp_path / "run" / "metrics.json").read_text() == metrics
    assert ckpt.read_metadata(again.checkpoint).step == first.step
