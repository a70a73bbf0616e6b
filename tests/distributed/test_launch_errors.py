"""A rank that fails under torchrun is one line naming the rank and its own cause."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ctrctl.distributed.launch import ERROR_DIR_ENV, report_worker_error, worker_failure
from ctrctl.testing.datasets import make_dataset

CTRCTL = str(Path(sys.executable).parent / "ctrctl")


def test_the_first_cause_is_named_before_its_consequences(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for rank, message, kind in [(0, "peer closed the connection", "DistributedError"),
                                (1, "C3: id 9 outside its table", "DatasetError"),
                                (2, "peer closed the connection", "DistributedError")]:
        monkeypatch.setenv(ERROR_DIR_ENV, str(tmp_path))
        monkeypatch.setenv("RANK", str(rank))
        report_worker_error(message, kind)
    error = worker_failure(tmp_path, 1, tmp_path / "ranks.log")
    assert error.where == "rank 1" and error.message.startswith("C3: id 9 outside its table")
    assert "2 other ranks failed after it" in error.message
    assert str(tmp_path / "ranks.log") in error.render()


def test_without_records_the_crash_is_said(tmp_path: Path) -> None:
    error = worker_failure(tmp_path, -11, None)
    assert "without a ctrctl error" in error.message and "--verbose" in error.render()


def test_outside_a_launch_nothing_is_written(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ERROR_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    report_worker_error("x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.distributed
def test_a_failing_worker_is_one_line(tmp_path: Path) -> None:
    make_dataset(tmp_path / "ds", rows=256, num_sparse=3, seed=0)
    # The manifest is fine (preflight passes); a data file is not: each worker fails on it.
    part = sorted((tmp_path / "ds" / "train").glob("*.parquet"))[0]
    part.write_bytes(b"not parquet at all")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [CTRCTL, "train", "--dataset", "ds", "--out", "run", "--nproc-per-node", "2",
         "--no-track", "model.embedding_dim=8", "model.dense_arch=[16,8]",
         "training.batch_size=64", "training.max_steps=2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1, done.stderr
    assert len(errors) == 1 and "rank " in errors[0], done.stderr
    assert "not a readable Parquet file" in errors[0] and part.name in errors[0]
    assert "Traceback" not in done.stderr and "ChildFailedError" not in done.stderr
    log = errors[0].split("the log of every rank: ")[1].split(",")[0]
    assert Path(log).is_file() and "rank" in Path(log).read_text()
    assert not (tmp_path / "run" / "checkpoints").exists()
