"""``ctrctl preprocess`` end to end in a subprocess: output, MLflow run, errors, kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from ctrctl.data.manifest import DatasetManifest

ROOT = Path(__file__).resolve().parents[2]
CRITEO = ROOT / "schemas" / "criteo.yaml"


def ctrctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ctrctl", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=300)


def big_input(path: Path, sample: Path, copies: int) -> Path:
    text = sample.read_text()
    with path.open("w") as handle:
        for _ in range(copies):
            handle.write(text)
    return path


def test_cli_end_to_end_with_mlflow(tmp_path: Path, criteo_8k: Path) -> None:
    lines = (criteo_8k / "dev.csv").read_text().splitlines()
    fields = lines[5].split("\t")
    fields[3] = "x"  # I3 is not a number
    lines[5] = "\t".join(fields)
    dev = tmp_path / "dev.tsv"
    dev.write_text("\n".join(lines) + "\n")
    args = ["preprocess", "--schema", str(CRITEO), "--input", f"train={criteo_8k / 'train.csv'}",
            "--input", f"val={dev}", "--input", f"test={criteo_8k / 'test.csv'}",
            "--out", str(tmp_path / "ds")]
    failed = ctrctl(*args, "--no-track", cwd=tmp_path)
    assert failed.returncode == 1
    assert f"{dev}:6:4: column 'I3'" in failed.stderr and "Traceback" not in failed.stderr
    assert not (tmp_path / "ds").exists()

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = ctrctl(*args, "--on-bad-rows", "skip", "--tracking-uri", uri, "--experiment", "prep",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "7,200" in result.stderr and "bad_dense 1" in result.stderr  # the summary
    manifest = DatasetManifest.load(tmp_path / "ds")
    assert manifest.splits["train"].rows == 7200 and manifest.splits["val"].rows == 408
    assert manifest.bad_rows["bad_dense"] == 1

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("prep")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == "preprocess" and run.info.status == "FINISHED"
    assert run.data.params["schema"] == "criteo"
    assert run.data.params["schema_hash"] == manifest.schema_hash
    assert run.data.metrics["rows.train"] == 7200 and run.data.metrics["rows.test"] == 391
    assert run.data.metrics["bad_rows.bad_dense"] == 1 and run.data.metrics["rows_per_s"] > 0
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"manifest.json", "schema.json"} <= artifacts

    again = ctrctl(*args, "--no-track", cwd=tmp_path)
    assert again.returncode == 1 and "already exists" in again.stderr


def _start(tmp_path: Path, src: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ctrctl", "preprocess", "--schema", str(CRITEO), "--input",
         str(src), "--out", str(out), "--no-track", "--split-ratio", "0.8,0.1,0.1"],
        cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def _wait_for_temp(tmp_path: Path, proc: subprocess.Popen[str]) -> Path:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        temps = list(tmp_path.glob(".ds.tmp-*"))
        if temps:
            return temps[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("no temporary folder appeared")


@pytest.mark.parametrize(
    "sig",
    [signal.SIGKILL, signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
)
def test_killed_run_leaves_no_output(tmp_path: Path, criteo_8k: Path, sig: int) -> None:
    # 720,000 rows: the native path takes about a second on them, so the signal lands
    # mid-run (at 288,000 rows a fast run could finish before it).
    src = big_input(tmp_path / "big.tsv", criteo_8k / "train.csv", 100)
    out = tmp_path / "ds"
    proc = _start(tmp_path, src, out)
    temp = _wait_for_temp(tmp_path, proc)
    time.sleep(0.1)
    assert proc.poll() is None, "the run finished before the signal: make the input larger"
    os.kill(proc.pid, sig)
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert not out.exists()
    if sig != signal.SIGKILL:
        assert not temp.exists()  # the run cleaned up after itself
    # The next run removes a killed run's folder and writes a complete dataset.
    done = ctrctl("preprocess", "--schema", str(CRITEO), "--input", str(src), "--out",
                  str(out), "--no-track", "--val-fraction", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not temp.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.tsv", "ds"]
    manifest = DatasetManifest.load(out)
    assert manifest.splits["train"].rows == 720_000
    assert pl.scan_parquet(out / "train" / "*.parquet").select(pl.len()).collect().item() == 720_000
