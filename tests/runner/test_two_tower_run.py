"""ctrctl run of a two-tower pipeline: preprocess, plan, train, index, eval, quantize."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctrctl.errors import ConfigError
from ctrctl.retrieval.synthetic import synthesize_two_tower
from ctrctl.runner import run_pipeline
from tests.runner.helpers import ROOT

PIPELINE = ROOT / "pipelines" / "movielens_two_tower.yaml"
#: The MovieLens pipeline made small: a planted-factor log of 300 users and 200 items.
SMALL = ("model.embedding_dim=8", "model.query_tower.layers=[8]",
         "model.item_tower.layers=[8]", "training.batch_size=128", "training.epochs=2",
         "training.val_every=0", "training.checkpoint_every=0", "training.num_workers=1",
         "register.model_name=null", "index.kind=flat")


def _overrides(logs: Path) -> tuple[str, ...]:
    synthesize_two_tower(logs, users=300, items=200, per_user=8, dim=4, temperature=0.2,
                         seed=3)
    return (*SMALL, f"data.schema_path={logs / 'schema.yaml'}",
            f"data.inputs=[{logs / 'interactions.tsv'}]")


@pytest.mark.slow  # three runs of a small pipeline (about 20 s on a quiet core)
def test_a_two_tower_pipeline_runs_index_and_retrieval_eval_then_skips(
        tmp_path: Path) -> None:
    overrides = _overrides(tmp_path / "logs")
    work = tmp_path / "work"
    first = run_pipeline(PIPELINE, overrides, workdir=work)
    status = {o.name: o.status for o in first.outcomes}
    assert status == {"synth": "unavailable", "preprocess": "ran", "plan": "ran",
                      "tune": "unavailable", "train": "ran", "index": "ran", "eval": "ran",
                      "quantize": "ran", "register": "unavailable"}
    index = json.loads((work / "index" / "manifest.json").read_text())
    assert index["kind"] == "flat" and index["recall@100"] == 1.0
    assert first.outcome("index").key_metric == ("recall@100", 1.0)
    metrics = json.loads((work / "eval" / "metrics.json").read_text())
    assert metrics["queries"] == 300
    for prefix in ("", "index.", "popularity.", "bpr."):
        assert 0.0 <= metrics[f"{prefix}recall@100"] <= 1.0
    # a flat index ranks as exact search does
    assert metrics["index.recall@100"] == pytest.approx(metrics["recall@100"], abs=0.01)
    eval_key = first.outcome("eval").key_metric
    assert eval_key is not None and eval_key == ("recall@100", metrics["recall@100"])
    assert (work / "export" / "manifest.json").is_file()

    again = run_pipeline(PIPELINE, overrides, workdir=work)
    assert all(again.outcome(s).status == "skipped"
               for s in ("preprocess", "train", "index", "eval", "quantize"))
    reindexed = run_pipeline(PIPELINE, (*overrides, "index.kind=sq8"), workdir=work)
    status = {o.name: o.status for o in reindexed.outcomes}
    assert status["train"] == "skipped"
    assert status["index"] == status["eval"] == status["quantize"] == "ran"


def test_a_ranker_pipeline_takes_no_index_step_and_gates_are_refused_for_two_tower(
        tmp_path: Path) -> None:
    from types import SimpleNamespace

    from ctrctl.config import load_config
    from ctrctl.runner.retrieval_steps import no_index
    from tests.runner.helpers import DEMO

    ranker = SimpleNamespace(cfg=load_config(DEMO))
    assert no_index(ranker) == "model.kind is not two_tower"  # type: ignore[arg-type]
    assert no_index(SimpleNamespace(cfg=load_config(PIPELINE))) is None  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="eval.gates"):
        run_pipeline(PIPELINE, (*_overrides(tmp_path / "logs"), "eval.gates={auc: 0.5}"),
                     workdir=tmp_path / "tt")


@pytest.mark.slow  # a two-tower run with MLflow tracking and registration (~40 s)
def test_a_two_tower_run_registers_its_export_with_the_index_and_recall(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    from ctrctl.inference.retrieval import load_retrieval
    from ctrctl.tracking import make_tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = make_tracker(tracking_uri=uri, experiment="tt")
    overrides = (*_overrides(tmp_path / "logs"), "register.model_name=tt-retrieval")
    result = run_pipeline(PIPELINE, overrides, workdir=tmp_path / "w", tracker=tracker,
                          tracking_uri=uri)
    assert result.model_uri == "models:/tt-retrieval/1"
    version = MlflowClient(uri).get_model_version("tt-retrieval", "1")
    assert version.tags["ctrctl.index.kind"] == "flat"
    assert len(version.tags["ctrctl.index.sha256"]) == 64
    assert float(version.tags["ctrctl.eval.recall_at_100"]) == pytest.approx(
        result.outcome("eval").summary["recall@100"])
    import mlflow

    mlflow.set_tracking_uri(uri)
    local = mlflow.artifacts.download_artifacts(f"runs:/{version.run_id}/model",
                                                dst_path=str(tmp_path / "dl"))
    loaded = load_retrieval(local)  # the registered files verify against their manifest
    assert loaded.index.ntotal == json.loads(
        (tmp_path / "w" / "index" / "manifest.json").read_text())["items"]
