"""The quantize and register steps: a model version whose tags lead back to the data, and
``mlflow models serve`` of ``models:/NAME@candidate`` answering with the same scores."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from ctrctl.cli.app import main
from ctrctl.runner import RunResult, run_pipeline, tree_sha256
from ctrctl.tracking import Tracker, make_tracker
from tests.runner.helpers import DEMO, ROOT, TINY, tiny_inputs

pytest.importorskip("ctrctl.inference.export")
#: About 25-40 s on 2 cores: two runs, each exporting (torch.export) and logging a pyfunc
#: model, and one `mlflow models serve`.
pytestmark = pytest.mark.slow

NAME = "tiny-ctr"


@dataclass(frozen=True)
class Registered:
    """One run of the tiny demo that registered version 1 of ``NAME``."""

    uri: str
    tracker: Tracker
    result: RunResult
    root: Path


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Registered:
    root = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    tracker = make_tracker(tracking_uri=uri, experiment="registry")
    result = run_pipeline(DEMO, (*TINY, f"register.model_name={NAME}"), workdir=root / "a",
                          tracker=tracker, tracking_uri=uri)
    return Registered(uri, tracker, result, root)


def _shuffle_train_labels(raw: Path) -> None:
    lines = (raw / "train.tsv").read_text().splitlines()
    labels = [line.split("\t", 1)[0] for line in lines]
    random.Random(0).shuffle(labels)
    (raw / "train.tsv").write_text("".join(
        f"{label}\t{line.split(chr(9), 1)[1]}\n"
        for label, line in zip(labels, lines, strict=True)))


def test_registered_version_leads_back_to_the_digest(registered: Registered) -> None:
    from mlflow.tracking import MlflowClient

    from ctrctl.runner.lineage import split_files

    good, uri = registered.result, registered.uri
    assert good.outcome("quantize").status == "ran" and good.gates_passed
    assert good.model_uri == f"models:/{NAME}/1"
    client = MlflowClient(tracking_uri=uri)
    version = client.get_model_version(NAME, "1")
    dataset = good.workdir / "dataset"
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
    assert str(client.get_model_version_by_alias(NAME, "candidate").version) == "1"
    import mlflow

    mlflow.set_tracking_uri(uri)
    served = mlflow.pyfunc.load_model(f"models:/{NAME}@candidate")
    assert served.metadata.run_id == version.run_id


def _raw_rows(tsv: Path, rows: int) -> list[list[str]]:
    with tsv.open() as handle:
        return [next(handle).rstrip("\n").split("\t") for _ in range(rows)]


def _frame(export: Path, rows: list[list[str]]) -> object:
    """Raw Criteo rows as the pyfunc's input frame: dense as floats, categoricals as strings,
    empty values as missing (None), columns in the artifact's input contract."""
    import pandas as pd

    contract = json.loads((export / "manifest.json").read_text())["input"]
    dense = [d["name"] for d in contract["dense"]]
    sparse = [f["name"] for f in contract["sparse"]]
    columns = ["label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]]
    records = []
    for row in rows:
        values = dict(zip(columns, row, strict=True))
        records.append({**{n: float(values[n]) if values[n] else None for n in dense},
                        **{n: values[n] or None for n in sparse}})
    return pd.DataFrame(records, columns=[*dense, *sparse], dtype=object)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Server:
    url: str
    process: subprocess.Popen[str]


@pytest.fixture
def served(registered: Registered, tmp_path: Path) -> Iterator[Server]:
    """``mlflow models serve -m models:/NAME@candidate --env-manager local`` on 127.0.0.1,
    stopped (its whole process group) whether the test passes or fails."""
    assert registered.result.gates_passed
    port = _free_port()
    bin_dir = str(Path(sys.executable).parent)  # mlflow starts uvicorn from PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": registered.uri,
           "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(
        [str(Path(bin_dir) / "mlflow"), "models", "serve", "-m", f"models:/{NAME}@candidate",
         "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port)],
        env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        yield Server(f"http://127.0.0.1:{port}", process)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        log.close()


def _invoke(server: Server, body: bytes, log: Path, seconds: float = 240) -> list[float]:
    deadline = time.monotonic() + seconds
    while True:
        request = urllib.request.Request(f"{server.url}/invocations", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return list(json.loads(response.read())["predictions"])
        except urllib.error.HTTPError:
            raise
        except OSError:
            assert server.process.poll() is None, f"the server exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no answer in {seconds} s:\n{log.read_text()}"
            time.sleep(1)


def test_models_serve_of_the_candidate_answers_with_the_registered_scores(
        registered: Registered, served: Server, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    workdir = registered.result.workdir
    export = workdir / "export"
    rows = _raw_rows(workdir / "raw" / "test.tsv", 50)
    frame = _frame(export, rows)
    body = json.dumps({"dataframe_split": frame.to_dict(orient="split")}).encode()  # type: ignore[attr-defined]
    answer = torch.tensor(_invoke(served, body, tmp_path / "serve.log"), dtype=torch.float64)

    mlflow.set_tracking_uri(registered.uri)
    pyfunc = mlflow.pyfunc.load_model(f"models:/{NAME}@candidate")
    loaded = torch.from_numpy(pyfunc.predict(frame).astype("float64"))

    raw = tmp_path / "rows.tsv"
    raw.write_text("".join("\t".join(row) + "\n" for row in rows))
    monkeypatch.chdir(ROOT)
    assert main(["predict", "--model", str(export), "--input", str(raw),
                 "--out", str(tmp_path / "scores.parquet"), "--no-track"]) == 0
    import pyarrow.parquet as pq

    predicted = torch.from_numpy(pq.read_table(tmp_path / "scores.parquet")
                                 .column("score").to_numpy().astype("float64"))
    assert answer.shape == (50,)
    assert 0.0 < float(answer.min()) and float(answer.max()) < 1.0
    assert float(answer.std()) > 0  # the rows score differently: not a constant
    torch.testing.assert_close(answer, loaded)
    torch.testing.assert_close(answer, predicted)


def test_a_failed_gate_registers_a_version_and_keeps_the_alias(
        registered: Registered, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    raw = tmp_path / "raw"
    overrides = tiny_inputs(raw, rows=8000)
    _shuffle_train_labels(raw)
    bad = run_pipeline(DEMO, (*overrides, f"register.model_name={NAME}",
                              "eval.gates={auc: 0.6}"), workdir=tmp_path / "b",
                       tracker=registered.tracker, tracking_uri=registered.uri)
    assert not bad.gates_passed and bad.exit_code == 3
    assert bad.model_uri == f"models:/{NAME}/2"
    client = MlflowClient(tracking_uri=registered.uri)
    assert client.get_model_version(NAME, "2").tags["ctrctl.gates.passed"] == "false"
    assert str(client.get_model_version_by_alias(NAME, "candidate").version) == "1"
