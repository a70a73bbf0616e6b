"""The quantize and register steps: a model version whose tags lead back to the data."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ctrctl.runner import run_pipeline, tree_sha256
from ctrctl.tracking import make_tracker
from tests.runner.helpers import DEMO, TINY, tiny_inputs

pytest.importorskip("ctrctl.inference.export")
#: About 90 s on 2 cores: two runs, each exporting (torch.export) and logging a pyfunc model.
pytestmark = pytest.mark.slow


def _shuffle_train_labels(raw: Path) -> None:
    lines = (raw / "train.tsv").read_text().splitlines()
    labels = [line.split("\t", 1)[0] for line in lines]
    random.Random(0).shuffle(labels)
    (raw / "train.tsv").write_text("".join(
        f"{label}\t{line.split(chr(9), 1)[1]}\n"
        for label, line in zip(labels, lines, strict=True)))


def test_registered_version_leads_back_to_the_digest_and_a_failed_gate_keeps_the_alias(
        tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from ctrctl.runner.lineage import split_files

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = make_tracker(tracking_uri=uri, experiment="registry")
    name = "tiny-ctr"
    good = run_pipeline(DEMO, (*TINY, f"register.model_name={name}"), workdir=tmp_path / "a",
                        tracker=tracker, tracking_uri=uri)
    assert good.outcome("quantize").status == "ran" and good.gates_passed
    assert good.model_uri == f"models:/{name}/1"
    client = MlflowClient(tracking_uri=uri)
    version = client.get_model_version(name, "1")
    dataset = tmp_path / "a" / "dataset"
    recomputed = tree_sha256(dataset, split_files(dataset, "train"))
    assert version.tags["ctrctl.dataset.digest"] == recomputed
    assert version.tags["ctrctl.dataset.source"] == str(dataset.resolve())
    assert version.tags["ctrctl.gates.passed"] == "true"
    assert version.tags["ctrctl.training_run_id"] == good.outcome("train").summary["run_id"]
    for key in ("ctrctl.schema.hash", "ctrctl.plan.sha256", "ctrctl.checkpoint.sha256",
                "ctrctl.quantize", "ctrctl.eval.auc", "ctrctl.gates"):
        assert version.tags[key], key
    assert json.loads(version.tags["ctrctl.quantize"])["dtype"] == "int8"
    run = client.get_run(version.run_id)  # version -> run -> dataset inputs
    logged = [json.loads(i.dataset.profile)["sha256"] for i in run.inputs.dataset_inputs
              if i.dataset.name == "demo/train"]
    assert logged == [recomputed]
    assert str(client.get_model_version_by_alias(name, "candidate").version) == "1"
    import mlflow

    mlflow.set_tracking_uri(uri)
    served = mlflow.pyfunc.load_model(f"models:/{name}@candidate")
    assert served.metadata.run_id == version.run_id

    raw = tmp_path / "raw"
    overrides = tiny_inputs(raw, rows=8000)
    _shuffle_train_labels(raw)
    bad = run_pipeline(DEMO, (*overrides, f"register.model_name={name}",
                              "eval.gates={auc: 0.6}"), workdir=tmp_path / "b",
                       tracker=tracker, tracking_uri=uri)
    assert not bad.gates_passed and bad.exit_code == 3
    assert bad.model_uri == f"models:/{name}/2"
    assert client.get_model_version(name, "2").tags["ctrctl.gates.passed"] == "false"
    assert str(client.get_model_version_by_alias(name, "candidate").version) == "1"
