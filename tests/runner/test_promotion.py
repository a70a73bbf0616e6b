"""Champion/challenger: the champion alias moves only on a real gain."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.runner.promotion import decide


def test_decide_promotes_only_on_a_gain_above_min_gain() -> None:
    assert decide("auc", 0.70, None, 0.0).promote  # the first one takes the alias
    assert decide("auc", 0.752, 0.750, 0.001).promote
    assert not decide("auc", 0.7505, 0.750, 0.001).promote
    assert not decide("auc", 0.75, 0.75, 0.0).promote  # a tie keeps the champion
    assert decide("logloss", 0.44, 0.45, 0.0).promote  # lower is better
    assert not decide("logloss", 0.46, 0.45, 0.0).promote
    assert decide("logloss", 0.44, 0.45, 0.0).gain == pytest.approx(0.01)


@pytest.mark.slow
def test_a_worse_model_keeps_the_champion(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from ctrctl.runner import run_pipeline
    from ctrctl.tracking import make_tracker
    from tests.runner.helpers import DEMO, tiny_inputs
    from tests.runner.test_registry import _shuffle_train_labels

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = make_tracker(tracking_uri=uri, experiment="promotion")
    settings = ("register.model_name=ctr", "register.champion_metric=auc", "eval.gates={}")
    good = tiny_inputs(tmp_path / "raw-good", rows=8000)
    run_pipeline(DEMO, (*good, *settings), workdir=tmp_path / "a", tracker=tracker,
                 tracking_uri=uri)
    client = MlflowClient(tracking_uri=uri)
    assert str(client.get_model_version_by_alias("ctr", "champion").version) == "1"
    # a deliberately worse day: the same rows with shuffled training labels
    worse = tiny_inputs(tmp_path / "raw-bad", rows=8000)
    _shuffle_train_labels(tmp_path / "raw-bad")
    run_pipeline(DEMO, (*worse, *settings), workdir=tmp_path / "b", tracker=tracker,
                 tracking_uri=uri)
    assert str(client.get_model_version_by_alias("ctr", "candidate").version) == "2"
    assert str(client.get_model_version_by_alias("ctr", "champion").version) == "1"
    tags = client.get_model_version("ctr", "2").tags
    assert tags["ctrctl.promotion.decision"] == "kept"
    assert tags["ctrctl.promotion.champion_version"] == "1"
    assert float(tags["ctrctl.promotion.candidate_auc"]) < float(
        tags["ctrctl.promotion.champion_auc"])
    assert client.get_model_version("ctr", "1").tags["ctrctl.promotion.decision"] == "champion"
