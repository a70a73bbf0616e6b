"""What the background-tracking tests share: one run logging every kind of thing, and the
MLflow view of a run to compare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctrctl.tracking import DatasetRef, Tracker
from ctrctl.tracking.journal import JOURNAL_TAG

DATASET = DatasetRef("demo/train", "ab" * 32, "/data/demo/train", {"label": "long", "c1": "string"},
                     {"rows": 3, "files": 1})


def log_everything(tracker: Tracker, work: Path, name: str = "step") -> None:
    """One run of every call a step makes: params, metrics at steps, tags, artifacts (a file
    and a folder), a dict and a dataset."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "notes.json").write_text('{"kept": true}\n')
    (work / "folder").mkdir(exist_ok=True)
    (work / "folder" / "a.txt").write_text("a\n")
    with tracker.run(name, tags={"extra": "1"}) as run:
        run.log_params({"lr": 0.01, "model": {"dim": 16, "kind": "dlrm"}})
        run.log_metrics({"loss": 0.5, "auc": 0.7}, step=1)
        run.log_metrics({"loss": 0.4, "auc": 0.72}, step=2)
        run.log_metrics({"recall@100": 0.5})  # MLflow refuses "@": sent as recall_at_100
        run.log_metrics({"loss": 0.3, "flag": True})  # a bool is not a metric
        run.set_tags({"ctrctl.kind": "test", "index.recall@100": "0.9"})
        run.log_artifact(work / "notes.json")
        run.log_artifact(work / "folder", "dir")
        run.log_dict({"k": [1, 2]}, "d.json")
        run.log_dataset(DATASET, "train")
    # Changed after the run: the run keeps what was logged.
    (work / "notes.json").write_text('{"kept": false}\n')


def snapshot(uri: str, run_id: str) -> dict[str, Any]:
    """A run as MLflow holds it, less what differs between two runs of one body (ids,
    times, the journal tag)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    metrics = {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
               for key in run.data.metrics}
    artifacts: dict[str, str] = {}
    local = Path(client.download_artifacts(run_id, ""))
    for path in sorted(local.rglob("*")):
        if path.is_file():
            artifacts[path.relative_to(local).as_posix()] = path.read_text()
    datasets = [(d.dataset.name, d.dataset.digest, d.dataset.source, d.dataset.schema,
                 d.dataset.profile, sorted((t.key, t.value) for t in d.tags))
                for d in run.inputs.dataset_inputs]
    tags = {k: v for k, v in run.data.tags.items() if k != JOURNAL_TAG}
    return {"status": run.info.status, "name": run.info.run_name, "params": run.data.params,
            "metrics": metrics, "tags": tags, "artifacts": artifacts, "datasets": datasets}


def runs_of(uri: str, experiment: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])
