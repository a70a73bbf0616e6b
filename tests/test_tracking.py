"""MLflow tracking: the tracker module, a command tracked to sqlite, --no-track, a real server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctrctl.cli.app import main
from ctrctl.distributed.processes import free_port
from ctrctl.tracking import PARENT_RUN_ENV, MlflowTracker, Tracker, make_tracker

VENV_BIN = Path(sys.executable).parent
SERVER_START_TIMEOUT_S = 90


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No tracking URI or parent run from the caller's shell; any default store lands in tmp."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(PARENT_RUN_ENV, raising=False)
    monkeypatch.chdir(tmp_path)


def sqlite_uri(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite store for the module: creating one runs MLflow's migrations (seconds)."""
    return sqlite_uri(tmp_path_factory.mktemp("mlflow") / "store.db")


def only_run(client: object, experiment: str = "ctrctl") -> object:
    exp = client.get_experiment_by_name(experiment)  # type: ignore[attr-defined]
    assert exp is not None, f"experiment {experiment} was not created"
    runs = client.search_runs([exp.experiment_id])  # type: ignore[attr-defined]
    assert len(runs) == 1
    return runs[0]


def artifact_names(client: object, run_id: str) -> list[str]:
    return sorted(a.path for a in client.list_artifacts(run_id))  # type: ignore[attr-defined]


def check_synth_run(client: object, out: Path, experiment: str = "ctrctl") -> None:
    """The run a `ctrctl synth --rows 2000 --seed 3` leaves: params, metrics, synth.json."""
    run = only_run(client, experiment)
    assert run.info.run_name == "synth" and run.info.status == "FINISHED"
    params = run.data.params
    assert params["format"] == "criteo" and params["rows"] == "2000" and params["seed"] == "3"
    assert params["splits.train"] == "0.8"
    meta = json.loads((out / "synth.json").read_text())
    metrics = run.data.metrics
    assert metrics["rows.train"] == 1600 and metrics["rows.test"] == 200
    for split in ("train", "val", "test"):
        assert metrics[f"best_auc.{split}"] == pytest.approx(meta["best_auc"][split])
    assert artifact_names(client, run.info.run_id) == ["synth.json"]
    with tempfile.TemporaryDirectory() as tmp:
        local = client.download_artifacts(run.info.run_id, "synth.json", tmp)
        assert json.loads(Path(local).read_text()) == meta


# ----------------------------------------------------------------------------- the module


def test_mlflow_tracker_logs_flattened_params_stepped_metrics_and_dicts(
    tmp_path: Path, store_uri: str
) -> None:
    from mlflow.tracking import MlflowClient

    uri = store_uri
    tracker = make_tracker(enabled=True, tracking_uri=uri, experiment="unit")
    assert isinstance(tracker, MlflowTracker) and tracker.enabled
    with tracker.run("step", tags={"team": "ctr"}) as run:
        run.log_params({"model": {"dim": 64, "arch": [512, 256]}, "lr": 0.1})
        for step, loss in enumerate([0.7, 0.6, 0.5]):
            run.log_metrics({"loss": loss, "nested": {"auc": 0.5 + step / 10}}, step=step)
        run.log_dict({"b": 1, "a": [1, 2]}, "config.json")
        run_id = run.run_id
    client = MlflowClient(tracking_uri=uri)
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and got.info.run_name == "step"
    assert got.data.params == {"model.dim": "64", "model.arch": "[512, 256]", "lr": "0.1"}
    assert got.data.tags["team"] == "ctr" and got.data.tags["ctrctl.step"] == "step"
    history = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
        (0, 0.7),
        (1, 0.6),
        (2, 0.5),
    ]
    assert got.data.metrics["nested.auc"] == pytest.approx(0.7)
    local = client.download_artifacts(run_id, "config.json", str(tmp_path))
    assert json.loads(Path(local).read_text()) == {"a": [1, 2], "b": 1}


def test_a_failing_step_is_marked_failed_and_children_nest(
    store_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    uri = store_uri
    tracker = make_tracker(tracking_uri=uri, experiment="nesting")
    with tracker.run("parent") as parent:
        parent_id = parent.run_id
    with pytest.raises(RuntimeError), tracker.run("broken") as broken:
        broken_id = broken.run_id
        raise RuntimeError("boom")
    monkeypatch.setenv(PARENT_RUN_ENV, str(parent_id))
    with tracker.run("child") as child:
        child_id = child.run_id
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(broken_id).info.status == "FAILED"
    assert client.get_run(child_id).data.tags["mlflow.parentRunId"] == parent_id


def test_disabled_tracker_is_a_noop_and_touches_nothing(tmp_path: Path) -> None:
    tracker = make_tracker(enabled=False)
    assert type(tracker) is Tracker and not tracker.enabled
    with tracker.run("anything") as run:
        run.log_params({"a": {"b": 1}})
        run.log_metrics({"m": 1.0}, step=3)
        run.log_dict({"x": 1}, "x.json")
        assert run.run_id is None
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- commands


def test_synth_tracked_to_a_sqlite_store(tmp_path: Path, store_uri: str) -> None:
    from mlflow.tracking import MlflowClient

    out = tmp_path / "logs"
    argv = ["synth", "--out", str(out), "--rows", "2000", "--seed", "3"]
    argv += ["--tracking-uri", store_uri, "--experiment", "synth-sqlite"]
    assert main(argv) == 0
    check_synth_run(MlflowClient(tracking_uri=store_uri), out, "synth-sqlite")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]  # only the store asked for


def test_no_track_creates_no_store(tmp_path: Path) -> None:
    out = tmp_path / "logs"
    assert main(["synth", "--out", str(out), "--rows", "500", "--no-track"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]  # no mlflow.db, no mlruns/


# ----------------------------------------------------------------------------- a real server


def wait_until_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(
        f"mlflow server not up after {SERVER_START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}"
    )


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[str]:
    """A real `mlflow server` on 127.0.0.1 (sqlite store, proxied artifacts in tmp_path)."""
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                str(VENV_BIN / "mlflow"), "server",
                "--backend-store-uri", sqlite_uri(tmp_path / "server.db"),
                "--artifacts-destination", str(tmp_path / "server-artifacts"),
                "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            ],
            cwd=tmp_path,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the workers go down with it
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, proc, log)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# Part of the default suite on purpose: it is the one check against a real server (15-60 s).
def test_synth_tracked_to_a_real_mlflow_server(tmp_path: Path, mlflow_server: str) -> None:
    from mlflow.tracking import MlflowClient

    out = tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [str(VENV_BIN / "ctrctl"), "synth", "--out", str(out), "--rows", "2000", "--seed", "3",
         "--tracking-uri", mlflow_server],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    check_synth_run(MlflowClient(tracking_uri=mlflow_server), out)
    # The artifact went through the server into its artifact store, not beside the logs.
    assert list((tmp_path / "server-artifacts").rglob("synth.json"))
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
