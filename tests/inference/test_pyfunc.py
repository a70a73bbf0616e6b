"""The artifact as an MLflow pyfunc model: load_model().predict(frame) and `mlflow models serve`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from ctrctl.config import load_config
from ctrctl.inference.export import load_artifact, quantize_to_artifact
from ctrctl.inference.quantize import QuantizeConfig
from ctrctl.testing.threads import torch_threads
from ctrctl.tracking import MlflowTracker
from ctrctl.training.loop import train

from .conftest import OVERRIDES, Trained


def _frame(trained: Trained, rows: int = 20) -> pd.DataFrame:
    # Raw values of a dataset without a schema are ids and transformed dense values.
    test = pd.read_parquet(next((trained.dataset.path / "test").glob("*.parquet")))
    return test.drop(columns=["label"]).head(rows).reset_index(drop=True)


@pytest.fixture(scope="module")
def logged(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    tracker = MlflowTracker(tracking_uri=uri, experiment="test")
    with torch_threads(1):
        run = train(trained.dataset.path, root / "run", load_config(None, OVERRIDES),
                    tracker=tracker)
    quantize_to_artifact(run.checkpoint, root / "export", QuantizeConfig(dtype="int8"),
                         tracker=tracker)
    return {"uri": uri, "export": root / "export", "root": root}


@pytest.mark.slow
def test_pyfunc_predicts_a_frame_and_links_the_training_run(logged: dict[str, object],
                                                             trained: Trained) -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=str(logged["uri"]))
    runs = {r.data.tags["ctrctl.step"]: r for r in client.search_runs(
        [client.get_experiment_by_name("test").experiment_id])}
    quantize_run = runs["quantize"]
    assert quantize_run.data.tags["ctrctl.training_run_id"] == runs["train"].info.run_id
    assert quantize_run.data.metrics["bytes.ratio"] < 0.3 * 2  # dim 8: 12 of 32 bytes
    assert quantize_run.data.metrics["placement.request_seconds"] > 0
    mlflow.set_tracking_uri(str(logged["uri"]))
    [model] = mlflow.search_logged_models(experiment_ids=[
        client.get_experiment_by_name("test").experiment_id], output_format="list")
    pyfunc = mlflow.pyfunc.load_model(model.model_uri)
    frame = _frame(trained)
    scores = pyfunc.predict(frame)
    direct = load_artifact(Path(str(logged["export"]))).predict_records(
        frame.to_dict("records"))
    assert list(scores) == direct.tolist() and len(direct) == 20
    assert logged.setdefault("model_uri", model.model_uri)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_mlflow_models_serve_answers_invocations(logged: dict[str, object],
                                                  trained: Trained) -> None:
    import mlflow

    mlflow.set_tracking_uri(str(logged["uri"]))
    client = mlflow.tracking.MlflowClient(tracking_uri=str(logged["uri"]))
    [model] = mlflow.search_logged_models(experiment_ids=[
        client.get_experiment_by_name("test").experiment_id], output_format="list")
    port = _free_port()
    bin_dir = str(Path(sys.executable).parent)  # mlflow starts uvicorn from PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": str(logged["uri"]),
           "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m", model.model_uri,
         "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    frame = _frame(trained)
    body = json.dumps({"dataframe_split": frame.to_dict(orient="split")}).encode()
    try:
        deadline, answer = time.monotonic() + 240, None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/invocations",
                                                 data=body,
                                                 headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=30) as response:
                    answer = json.loads(response.read())
                break
            except OSError:
                time.sleep(1)
        assert answer is not None, server.stdout.read() if server.poll() is not None else ""
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 15)
        server.wait(timeout=60)
    direct = load_artifact(Path(str(logged["export"]))).predict_records(
        frame.to_dict("records"))
    assert answer["predictions"] == direct.tolist()
