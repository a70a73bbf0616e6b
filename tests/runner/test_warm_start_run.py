"""``ctrctl run`` with ``training.init_from``: the registered version names its parent."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from ctrctl import checkpoint as ckpt
from ctrctl.runner import run_pipeline
from ctrctl.tracking import make_tracker
from tests.runner.helpers import DEMO, TINY

#: Two tiny demo runs, each exporting and registering: about a minute on 2 cores.
pytestmark = pytest.mark.slow


def test_a_warm_started_run_registers_its_parent(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = make_tracker(tracking_uri=uri, experiment="warm")
    register = "register.model_name=warm-ctr"
    first = run_pipeline(DEMO, (*TINY, register), workdir=tmp_path / "a", tracker=tracker,
                         tracking_uri=uri)
    second = run_pipeline(DEMO, (*TINY, register, "training.init_from=models:/warm-ctr/1"),
                          workdir=tmp_path / "b", tracker=tracker, tracking_uri=uri)
    version = MlflowClient(tracking_uri=uri).get_model_version("warm-ctr", "2")
    parent = ckpt.resolve_checkpoint(tmp_path / "a" / "train")
    assert version.tags["ctrctl.parent.model_version"] == "1"
    assert version.tags["ctrctl.parent.checkpoint"] == str(parent)
    assert version.tags["ctrctl.parent.source"] == "models:/warm-ctr/1"
    assert first.model_uri and second.model_uri
    # from a local parent: its content is an input of the train step
    run_pipeline(DEMO, (*TINY, f"training.init_from={tmp_path / 'a' / 'train'}"),
                 workdir=tmp_path / "c", until_step="train")
    assert ckpt.read_metadata(tmp_path / "c" / "train").extra["parent"]["checkpoint"] == \
        str(parent)
    again = run_pipeline(DEMO, (*TINY, f"training.init_from={tmp_path / 'a' / 'train'}"),
                         workdir=tmp_path / "c", until_step="train")
    assert again.outcome("train").status == "skipped"
