"""``quantize`` of a run still training: one step folder is read from start to end, and one
deleted meanwhile (the run's checkpoint retention) is said as such, not "no checkpoint found"."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from ctrctl import checkpoint as ckpt
from ctrctl.errors import CheckpointError
from ctrctl.inference import quantize as quantize_module
from ctrctl.inference.export import quantize_to_artifact
from ctrctl.inference.quantize import QuantizeConfig
from tests.inference.conftest import Trained, trained  # noqa: F401  (the shared checkpoint)


def test_a_step_deleted_while_it_is_read(trained: Trained, tmp_path: Path,  # noqa: F811
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained.run, run)
    step = ckpt.resolve_checkpoint(run)
    real = quantize_module.quantize_checkpoint
    read: list[Path] = []

    def retention_meanwhile(checkpoint: Path, config: Any) -> Any:
        read.append(Path(checkpoint))
        shutil.rmtree(step)  # the training run's retention removes it
        return real(checkpoint, config)

    monkeypatch.setattr(quantize_module, "quantize_checkpoint", retention_meanwhile)
    with pytest.raises(CheckpointError, match="deleted while it was read") as caught:
        quantize_to_artifact(run, tmp_path / "export", QuantizeConfig(),
                             dataset=trained.dataset.path)
    assert read == [step]  # the step folder resolved once, not the run folder
    assert caught.value.where == str(step) and "run has ended" in (caught.value.hint or "")
    assert not (tmp_path / "export").exists()
