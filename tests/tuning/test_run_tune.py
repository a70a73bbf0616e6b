"""``ctrctl run`` with a ``tune:`` section: a tune step before train, skipped when unchanged,
and the train step trains the best trial's settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctrctl.config import load_config
from ctrctl.runner import run_pipeline
from tests.runner.helpers import DEMO, TINY

TUNED = (*TINY, "tune.trials=2", "tune.pruner=none", "tune.finalists=1", "tune.holdouts=1",
         "tune.space={embedding_optimizer.lr: {low: 0.001, high: 0.3, log: true}}")


@pytest.mark.slow
def test_a_tune_section_adds_a_tune_step_that_train_follows(tmp_path: Path) -> None:
    work = tmp_path / "work"
    first = run_pipeline(DEMO, TUNED, workdir=work, until_step="train")
    assert first.outcome("tune").status == "ran" and first.outcome("train").status == "ran"
    best = load_config(work / "tune" / "best.yaml")
    trained = json.loads((work / "train" / "config.json").read_text())
    assert trained["embedding_optimizer"]["lr"] == best.embedding_optimizer.lr
    assert first.outcome("tune").summary["trials.complete"] == 2
    # the YAML's finalists/holdouts reach the search: each rechecked trial on one holdout
    recheck = json.loads((work / "tune" / "recheck.json").read_text())
    assert recheck and all(set(v) == {"h0"} for v in recheck.values()), recheck

    again = run_pipeline(DEMO, TUNED, workdir=work, until_step="train")
    assert again.outcome("tune").status == "skipped"
    assert again.outcome("train").status == "skipped"

    off = run_pipeline(DEMO, (*TUNED, "tune.trials=0"), workdir=work, until_step="train")
    assert off.outcome("tune").status == "unavailable"
    assert off.outcome("train").status == "ran"  # back to the pipeline's own settings
    assert json.loads((work / "train" / "config.json").read_text())[
        "embedding_optimizer"]["lr"] == load_config(DEMO).embedding_optimizer.lr
