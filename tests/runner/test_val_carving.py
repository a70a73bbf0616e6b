"""``ctrctl run`` with only train and test inputs carves a val split and stops early on it."""

from __future__ import annotations

import json
from pathlib import Path

from ctrctl.config import DEFAULT_VAL_FRACTION, DataConfig
from ctrctl.runner import run_pipeline
from tests.runner.helpers import DEMO, TINY


def test_library_cli_and_pipeline_share_one_val_fraction_default() -> None:
    import inspect

    from ctrctl.cli.preprocess import preprocess_command
    from ctrctl.data.preprocess import preprocess

    library = inspect.signature(preprocess).parameters["val_fraction"].default
    cli = inspect.signature(preprocess_command).parameters["val_fraction"].default
    assert library == cli == DataConfig().val_fraction == DEFAULT_VAL_FRACTION > 0


def test_run_with_train_and_test_only_carves_val_and_early_stops(tmp_path: Path) -> None:
    from ctrctl.data.synthetic import synthesize

    raw = tmp_path / "raw"
    synthesize(raw, rows=3000, format="criteo", seed=0)
    inputs = f"train={raw / 'train.tsv'},test={raw / 'test.tsv'}"
    # patience 1 and a min_delta nothing can beat: the second validation stops the run.
    overrides = (*TINY, "synth.format=null", f"data.inputs=[{inputs}]", "training.epochs=3",
                 "training.val_every=3", "training.early_stopping.patience=1",
                 "training.early_stopping.min_delta=10")
    result = run_pipeline(DEMO, overrides, workdir=tmp_path / "work", until_step="train")
    manifest = json.loads((tmp_path / "work" / "dataset" / "manifest.json").read_text())
    assert manifest["splits"]["val"]["rows"] > 0
    metrics = json.loads((tmp_path / "work" / "train" / "metrics.json").read_text())
    assert metrics["stop_reason"] == "early_stopping"
    assert metrics["val"]["carved"]["fraction"] == DEFAULT_VAL_FRACTION
    assert result.outcome("train").status == "ran"
