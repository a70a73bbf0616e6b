"""Registry models: models:/NAME@ALIAS served from a local MLflow sqlite registry, the canary
split by request id, and an alias moved under load (no request fails, responses switch)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ctrctl.inference.pyfunc import log_pyfunc_model
from ctrctl.serving.models import canary_bucket

from .conftest import Exported, start_server


def _registry(tmp_path: Path, export: Path, versions: int) -> str:
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("serve", artifact_location=(tmp_path / "artifacts")
                                          .as_uri())
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    client.create_registered_model("ctr")
    for _ in range(versions):
        with mlflow.start_run(experiment_id=experiment):
            info = log_pyfunc_model(export)
        client.create_model_version("ctr", info.model_uri, model_id=info.model_id)
    client.set_registered_model_alias("ctr", "champion", "1")
    return uri


@pytest.mark.slow
def test_alias_moved_under_load_fails_no_request_and_switches_version(
        exported: Exported, tmp_path: Path) -> None:
    import mlflow

    uri = _registry(tmp_path, exported.export, versions=2)
    server = start_server("models:/ctr@champion", "--tracking-uri", uri, "--cache-dir",
                          str(tmp_path / "cache"), "--poll-s", "0.5", "--canary",
                          "models:/ctr/2", "--canary-percent", "30")
    rows = exported.records(20)
    try:
        # The canary scores the requests whose id hashes below 30%, the same ones each time.
        for i in range(30):
            status, body, _ = server.post("/v1/score", {"rows": rows[:2]},
                                          headers={"X-Request-Id": f"c{i}"})
            assert status == 200
            assert body["model"]["version"] == ("2" if canary_bucket(f"c{i}") < 30 else "1")
        primary_ids = [f"p{i}" for i in range(5000) if canary_bucket(f"p{i}") >= 30]

        seen: list[tuple[int, str]] = []
        failures: list[Any] = []
        stop = threading.Event()

        def load(worker: int) -> None:
            n = worker
            while not stop.is_set():
                status, body, _ = server.post("/v1/score", {"rows": rows},
                                              headers={"X-Request-Id": primary_ids[n]})
                n += 3
                if status != 200:
                    failures.append((status, body))
                else:
                    seen.append((worker, body["model"]["version"]))

        threads = [threading.Thread(target=load, args=(w,)) for w in range(3)]
        for thread in threads:
            thread.start()
        time.sleep(1.5)
        mlflow.tracking.MlflowClient(tracking_uri=uri).set_registered_model_alias(
            "ctr", "champion", "2")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(v == "2" for _, v in seen[-3:]):
            time.sleep(0.2)
        time.sleep(1.0)
        stop.set()
        for thread in threads:
            thread.join()
        assert not failures, failures[:3]
        for worker in range(3):
            versions = [v for w, v in seen if w == worker]
            switch = versions.index("2")
            assert switch > 0 and set(versions[:switch]) == {"1"}
            assert set(versions[switch:]) == {"2"}, versions
        _, metrics = server.get("/metrics")
        assert 'model_version="1",status="200"' in metrics
        assert 'model_version="2",status="200"' in metrics
        assert (tmp_path / "cache").exists()
    finally:
        code, output = server.stop()
    assert code == 0, output
