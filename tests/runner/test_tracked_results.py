"""What MLflow shows of a ``ctrctl run``: the kept model's validation on the train run, the
verdict on the parent run, and an experiment MLflow 3 opens as model training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctrctl.runner import run_pipeline
from ctrctl.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, make_tracker
from tests.runner.helpers import DEMO, tiny_inputs


@pytest.mark.slow  # a run of every step to eval with an MLflow store: ~30 s on 2 busy cores
def test_train_run_shows_the_kept_weights_and_the_parent_the_verdict(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # min_delta nothing can beat: the first validation stays the best, later ones are worse
    # or equal, and the run ends with the first validation's weights restored.
    overrides = (*tiny_inputs(tmp_path / "raw"), "training.val_every=2",
                 "training.early_stopping.min_delta=10", "training.early_stopping.patience=99")
    tracker = make_tracker(enabled=True, tracking_uri=uri, experiment="kept")
    result = run_pipeline(DEMO, overrides, workdir=tmp_path / "work", tracker=tracker,
                          tracking_uri=uri, until_step="quantize")

    saved = json.loads((tmp_path / "work" / "train" / "metrics.json").read_text())
    validations = [h for h in saved["history"] if "val.logloss" in h]
    assert len(validations) >= 2 and saved["best_step"] == validations[0]["step"]
    assert validations[-1]["val.logloss"] != validations[0]["val.logloss"]

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("kept")
    assert experiment.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"
    runs = client.search_runs([experiment.experiment_id])
    train = next(r for r in runs if r.data.tags.get("ctrctl.step") == "train")
    assert train.data.metrics["val.logloss"] == validations[0]["val.logloss"]
    assert train.data.metrics["early_stopping.best_step"] == saved["best_step"]

    parent = next(r for r in runs if r.data.tags.get("ctrctl.step") == "run")
    evaluated = result.outcome("eval").summary
    assert parent.data.metrics["eval.auc"] == evaluated["auc"]
    assert parent.data.metrics["eval.gates_passed"] == float(evaluated["gates_passed"])
    assert parent.data.tags["ctrctl.gates.passed"] == str(result.gates_passed).lower()
    # no register step: the parent names the model the quantize step logged
    assert parent.data.tags["ctrctl.model_uri"] == result.model_uri
    assert result.model_uri and result.model_uri.split(":/")[0] in ("runs", "models")
