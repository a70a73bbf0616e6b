"""Slow runner tests: a killed train step resumes, a real MLflow server, the Criteo sample."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ctrctl.cli.app import main
from ctrctl.runner import run_pipeline
from tests.runner.helpers import DEMO, ROOT, TINY

pytestmark = pytest.mark.slow

#: Enough steps that the run is still training when its first checkpoint appears.
LONGER = (*TINY, "synth.rows=16000", "training.checkpoint_every=5")


def test_a_killed_train_step_resumes_and_ends_as_an_uninterrupted_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "ctrctl", "run", str(DEMO), *LONGER, "--workdir", str(killed),
           "--no-track"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoints = killed / "train" / "checkpoints"
    deadline = time.monotonic() + 300
    try:
        while not (checkpoints.is_dir() and any(p.name.startswith("step-")
                                                 for p in checkpoints.iterdir())):
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    state = json.loads((killed / ".ctrctl" / "state" / "train.json").read_text())
    assert state["status"] == "running"  # killed in the middle of train

    with caplog.at_level(logging.INFO, logger="ctrctl"):
        resumed = run_pipeline(DEMO, LONGER, workdir=killed)
    assert "train: resuming from the last checkpoint" in caplog.text
    assert resumed.outcome("preprocess").status == "skipped"
    assert resumed.outcome("train").status == "ran"
    whole = run_pipeline(DEMO, LONGER, workdir=tmp_path / "whole")
    for key in ("auc", "logloss", "calibration"):
        assert resumed.outcome("eval").summary[key] == whole.outcome("eval").summary[key], key


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_against_a_real_mlflow_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1",
         "--port", str(port), "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "artifacts"), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "no server"
            time.sleep(0.5)
        monkeypatch.chdir(ROOT)
        assert main(["run", str(DEMO), *TINY, "--workdir", str(tmp_path / "work"),
                     "--tracking-uri", url, "--experiment", "served"]) == 0
        client = MlflowClient(tracking_uri=url)
        runs = client.search_runs([client.get_experiment_by_name("served").experiment_id])
        parent = next(r for r in runs if r.data.tags.get("ctrctl.step") == "run")
        steps = {r.data.tags["ctrctl.step"] for r in runs
                 if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
        assert {"synth", "preprocess", "plan", "train", "eval"} <= steps
        train = next(r for r in runs if r.data.tags.get("ctrctl.step") == "train")
        assert {i.dataset.name for i in train.inputs.dataset_inputs} == {"demo/train",
                                                                        "demo/val"}
        version = client.get_model_version_by_alias("ctrctl-demo", "candidate")
        assert version.run_id == next(r.info.run_id for r in runs
                                      if r.data.tags.get("ctrctl.step") == "quantize")
        assert version.tags["ctrctl.pipeline_run_id"] == parent.info.run_id
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


CRITEO = ROOT / "pipelines" / "criteo_dlrm.yaml"


def _criteo_inputs(folder: Path, train: Path) -> str:
    return (f"data.inputs=[train={train},val={folder / 'dev.csv'},"
            f"test={folder / 'test.csv'}]")


def test_criteo_pipeline_on_the_sample_passes_its_gate_and_fails_on_shuffled_labels(
        tmp_path: Path, criteo_8k: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    good = run_pipeline(CRITEO, [_criteo_inputs(criteo_8k, criteo_8k / "train.csv")],
                        workdir=tmp_path / "good")
    assert good.gates_passed, good.outcome("eval").summary
    lines = (criteo_8k / "train.csv").read_text().splitlines()
    labels = [line.split("\t", 1)[0] for line in lines]
    random.Random(0).shuffle(labels)
    shuffled = tmp_path / "shuffled.tsv"
    shuffled.write_text("".join(f"{label}\t{line.split(chr(9), 1)[1]}\n"
                                for label, line in zip(labels, lines, strict=True)))
    bad = run_pipeline(CRITEO, [_criteo_inputs(criteo_8k, shuffled)], workdir=tmp_path / "bad")
    assert not bad.gates_passed and bad.exit_code == 3
