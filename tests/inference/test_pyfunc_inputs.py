"""Raw Avazu rows through the MLflow pyfunc: the signature lists raw columns (``hour``, not
``hour_of_day``/``weekday``), a raw row served by a real ``mlflow models serve`` scores as
``ctrctl predict --input``, and what the contract refuses is a 400 naming it (fault probes
N90, N91, N94, N97, N98, N100)."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch

from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.inference.export import write_artifact
from ctrctl.inference.predictor import predict_raw
from ctrctl.inference.pyfunc import log_pyfunc_model
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
from ctrctl.testing.threads import torch_threads
from ctrctl.training.loop import train
from tests.conftest import shared_data

from .conftest import OVERRIDES

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain",
           "site_category", "app_id", "app_domain", "app_category", "device_id", "device_ip",
           "device_model", "device_type", "device_conn_type", "C14", "C15", "C16", "C17",
           "C18", "C19", "C20", "C21"]


@dataclass(frozen=True)
class Logged:
    export: Path
    model_uri: str
    tracking_uri: str
    test_csv: Path


@pytest.fixture(scope="module")
def avazu(tmp_path_factory: pytest.TempPathFactory) -> Logged:
    data = shared_data("avazu-9k")
    root = tmp_path_factory.mktemp("avazu")
    dataset = root / "dataset"
    preprocess(ROOT / "schemas" / "avazu.yaml", [f"train={data / 'train.csv'}",
                                                 f"test={data / 'test.csv'}"], dataset)
    with torch_threads(1):
        run = train(dataset, root / "run", load_config(None, [*OVERRIDES, "training.epochs=1"]))
        quantized = quantize_checkpoint(run.checkpoint, QuantizeConfig(dtype="int8"))
    export = write_artifact(quantized, root / "export", dataset=dataset)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    info = log_pyfunc_model(export, tracking_uri=uri)
    import mlflow

    mlflow.end_run()
    return Logged(export, info.model_uri, uri, data / "test.csv")


def _raw_rows(path: Path, n: int) -> list[list[str]]:
    with open(path, newline="") as handle:
        return [row for _, row in zip(range(n), csv.reader(handle), strict=False)]


@pytest.fixture(scope="module")
def server(avazu: Logged) -> Iterator[str]:
    """``mlflow models serve`` of the logged model on a free port, with a 100-row limit."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    bin_dir = str(Path(sys.executable).parent)  # mlflow starts uvicorn from PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": avazu.tracking_uri,
           "CTRCTL_PYFUNC_MAX_ROWS": "100",
           "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    process = subprocess.Popen(
        [str(Path(bin_dir) / "mlflow"), "models", "serve", "-m", avazu.model_uri,
         "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=5):
                    break
            except OSError:
                time.sleep(1)
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 15)
        process.wait(timeout=60)


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"{url}/invocations", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _split(rows: list[list[Any]], columns: list[str] = COLUMNS) -> dict[str, Any]:
    return {"dataframe_split": {"columns": columns, "data": rows}}


@pytest.mark.slow
def test_the_signature_lists_raw_columns(avazu: Logged) -> None:
    import mlflow

    model = mlflow.models.get_model_info(avazu.model_uri)
    names = [c["name"] for c in model.signature.inputs.to_dict()]
    assert names == COLUMNS[2:]  # hour, not hour_of_day / weekday; id and click not read
    manifest = json.loads((avazu.export / "manifest.json").read_text())
    assert manifest["input"]["columns"] == COLUMNS[2:]
    assert {"serving_encoder.py", "serving_timestamps.py"} <= set(manifest["files"])


@pytest.mark.slow
def test_a_served_raw_avazu_row_scores_as_ctrctl_predict(avazu: Logged, server: str,
                                                        tmp_path: Path) -> None:
    predict_raw(avazu.export, avazu.test_csv, tmp_path / "scores.parquet")
    expected = pq.read_table(tmp_path / "scores.parquet").column("score").to_numpy()
    rows = _raw_rows(avazu.test_csv, 60)
    status, answer = _post(server, _split(rows))
    assert status == 200, answer
    torch.testing.assert_close(torch.tensor(answer["predictions"], dtype=torch.float32),
                               torch.from_numpy(expected[:60].copy()))
    # The raw hour drives the derived features: another hour scores otherwise.
    moved = [[*row[:2], "14102623", *row[3:]] for row in rows[:5]]
    assert _post(server, _split(moved))[1]["predictions"] != answer["predictions"][:5]


@pytest.mark.slow
@pytest.mark.parametrize(("body", "needle"), [
    # N90: a misspelled column; N91: lower-cased names.
    (_split([["1", "14102100", "1005"]], ["id", "hour", "C99"]), "none named 'C99'"),
    (_split([["1005"]], ["c1"]), "did you mean 'C1'"),
    # N94: not hex, a list where a scalar belongs: the column and row, no stack trace.
    (_split([["1fbe01fe"], ["zzzz"]], ["site_id"]), "column 'site_id', row 1: expected a hex"),
    (_split([[["a", "b"]]], ["site_id"]), "column 'site_id', row 0"),
    # N97: a ragged row; N98: the tensor form.
    (_split([["14102100", "1005"], ["14102100"]], ["hour", "C1"]), "mismatched lengths"),
    ({"inputs": [[1, 2, 3]]}, "named raw columns"),
    # N100: more rows than the limit.
    (_split([["1005"]] * 101, ["C1"]), "at most 100"),
])
def test_bad_requests_are_400s_naming_the_problem(server: str, body: dict[str, Any],
                                                  needle: str) -> None:
    status, answer = _post(server, body)
    assert status == 400, answer
    assert needle in answer["message"]
    assert "Traceback" not in json.dumps(answer)
    status, answer = _post(server, _split([["14102100", "1005"]], ["hour", "C1"]))
    assert status == 200 and len(answer["predictions"]) == 1  # and it keeps serving


@pytest.mark.slow
def test_the_pyfunc_refuses_unknown_columns_in_process(avazu: Logged) -> None:
    import mlflow
    from mlflow.exceptions import MlflowException

    model = mlflow.pyfunc.load_model(avazu.model_uri)
    frame = pd.DataFrame({"hour": ["14102100"], "C1": ["1005"]})
    assert model.predict(frame).shape == (1,)
    with pytest.raises(MlflowException, match="none named 'I99'"):
        model.predict(frame.assign(I99=["3"]))
    assert model.predict(frame).shape == (1,)  # the refusal does not stick
