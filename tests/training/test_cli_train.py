"""``ctrctl train`` end to end in a subprocess: checkpoints, metrics, MLflow read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ctrctl import checkpoint as ckpt
from ctrctl.models.scoring import predict_split
from ctrctl.testing.datasets import SyntheticDataset, make_dataset

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
    "training.batch_size=64", "training.max_steps=12", "training.val_every=5",
    "training.checkpoint_every=5", "training.log_every=2", "training.num_workers=1",
    "training.device=cpu",
]


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> SyntheticDataset:
    return make_dataset(tmp_path_factory.mktemp("ds") / "ds",
                        {"train": 1200, "val": 301, "test": 200}, num_dense=3, num_sparse=4,
                        num_embeddings=[40, 50, 60, 30], row_group_size=256, seed=5)


def _ctrctl(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MLFLOW_TRACKING_URI="")
    env.pop("MLFLOW_TRACKING_URI")
    return subprocess.run([sys.executable, "-m", "ctrctl", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_train_command_writes_checkpoints_metrics_and_tracks(
    ds: SyntheticDataset, tmp_path: Path
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "run"
    proc = _ctrctl(["train", "--dataset", str(ds.path), "--out", str(out), "--config",
                    str(ROOT / "pipelines" / "small.yaml"), *SMALL, "training.log_checkpoint=true",
                    "--tracking-uri", uri, "--experiment", "cli-test"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    steps = sorted(p.name for p in (out / "checkpoints").glob("step-*"))
    assert steps == ["step-00000010", "step-00000012"]  # keep_checkpoints=2
    meta = ckpt.read_metadata(out)
    assert meta.step == 12 and meta.world_size == 1
    assert meta.config["training"]["max_steps"] == 12
    assert sorted(meta.tables) == ["C1", "C2", "C3", "C4"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["finished"] and metrics["step"] == 12
    assert 0.0 < metrics["metrics"]["val.auc"] <= 1.0
    assert [h["step"] for h in metrics["history"] if "val.auc" in h] == [5, 10, 12]
    assert json.loads((out / "config.json").read_text())["model"]["embedding_dim"] == 8

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("cli-test")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "train"
    assert meta.extra["mlflow_run_id"] == run.info.run_id
    assert run.data.params["training.batch_size"] == "64"
    assert run.data.metrics["val.auc"] == pytest.approx(metrics["metrics"]["val.auc"])
    loss_history = client.get_metric_history(run.info.run_id, "train.loss")
    assert [m.step for m in loss_history] == [2, 4, 6, 8, 10, 12]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "metrics.json", "model"} <= artifacts
    model_files = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert "model/metadata.json" in model_files


def test_train_command_resume_and_errors(
    ds: SyntheticDataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ctrctl.cli.app import main

    out = tmp_path / "run"
    args = ["train", "--dataset", str(ds.path), "--out", str(out), *SMALL, "--no-track"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "already holds checkpoints" in err and "Traceback" not in err
    assert main([*args, "training.max_steps=15", "--resume"]) == 0
    assert ckpt.read_metadata(out).step == 15
    capsys.readouterr()
    assert main(["train", "--dataset", str(ds.path), "--out", str(tmp_path / "x"),
                 "training.batch_sise=3", "--no-track"]) == 1
    err = capsys.readouterr().err
    assert "unknown key 'training.batch_sise'" in err and "Traceback" not in err


@pytest.mark.distributed
@pytest.mark.slow
def test_train_two_processes_through_torchrun(ds: SyntheticDataset, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # eval.batch_size=150: rank 0 scores 150 val rows (one batch), rank 1 151 (two), and
    # validation must still take the same number of steps on both.
    proc = _ctrctl(["train", "--dataset", str(ds.path), "--out", str(out), *SMALL,
                    "eval.batch_size=150", "--nproc-per-node", "2", "--no-track"],
                   cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    meta = ckpt.read_metadata(out)
    assert meta.world_size == 2 and meta.step == 12
    assert meta.plan is not None
    ranks = {p.rank for t in meta.tables for p in meta.pieces(t)}
    assert ranks == {0, 1}, "both ranks saved their tables"
    # the two-process checkpoint loads in one process and scores every val row
    labels = np.concatenate([y for y, _ in predict_split(out, ds.path, "val")])
    assert len(labels) == 301
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["metrics"]["val.rows"] == 301
    # and training resumes from it in one process (tables resharded on load)
    from ctrctl.cli.app import main

    assert main(["train", "--dataset", str(ds.path), "--out", str(out), *SMALL,
                 "training.max_steps=15", "--resume", "--no-track"]) == 0
    resumed = ckpt.read_metadata(out)
    assert resumed.step == 15 and resumed.world_size == 1


@pytest.mark.slow
def test_the_checkpoint_stays_out_of_mlflow_by_default(ds: SyntheticDataset,
                                                       tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = _ctrctl(["train", "--dataset", str(ds.path), "--out", str(tmp_path / "run"), *SMALL,
                    "--tracking-uri", uri, "--experiment", "no-model"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("no-model")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "metrics.json" in artifacts and "model" not in artifacts


@pytest.mark.slow
@pytest.mark.distributed
def test_pipeline_and_trace_flags_on_two_processes(ds: SyntheticDataset, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    proc = _ctrctl(["train", "--dataset", str(ds.path), "--out", str(tmp_path / "run"),
                    *SMALL, "--nproc-per-node", "2", "--pipeline", "semi-sync",
                    "training.semi_sync_start_step=4", "--trace", str(trace), "--no-track"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    assert "pipeline semi-sync" in proc.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    ranks = {e["pid"] for e in events if e["ph"] == "X"}
    assert ranks == {0, 1}
    ahead = sorted(e["args"]["step"] for e in events
                   if e["name"] == "embedding_ahead" and e["pid"] == 1)
    assert ahead == list(range(4, 12))


def test_unknown_pipeline_is_a_config_error(ds: SyntheticDataset, tmp_path: Path) -> None:
    proc = _ctrctl(["train", "--dataset", str(ds.path), "--out", str(tmp_path / "run"),
                    *SMALL, "--pipeline", "turbo", "--no-track"], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "training.pipeline" in proc.stderr and "sparse-dist" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()
