"""``--trace`` (training.trace) to a path that cannot be written is refused before training:
it failed with a traceback at the end, before the final checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.config import load_config
from ctrctl.errors import OutputLocationError
from ctrctl.testing.datasets import make_dataset
from ctrctl.training.loop import train
from tests.inference.conftest import OVERRIDES


def test_an_unwritable_trace_path_is_refused_before_training(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path / "ds", rows=256, num_sparse=3, seed=0)
    config = load_config(None, [*OVERRIDES, "training.trace=/proc/nope/trace.json"])
    with pytest.raises(OutputLocationError, match="cannot write in /proc") as caught:
        train(ds.path, tmp_path / "run", config)
    assert caught.value.where == "/proc/nope/trace.json"
    assert "--trace" in (caught.value.hint or "")
    assert not (tmp_path / "run").exists()  # nothing trained, nothing written
