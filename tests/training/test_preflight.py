"""ctrctl train checks its plan and its output before it starts any work or worker."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ctrctl.testing.datasets import make_dataset
from tests.cli.test_app import CTRCTL, run

SMALL = ["model.embedding_dim=8", "model.dense_arch=[16,8]", "training.batch_size=64",
         "training.max_steps=2", "training.val_max_rows=64"]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("preflight")
    make_dataset(folder / "ds", rows=256, num_sparse=3, seed=0)
    done = run([CTRCTL, "plan", "--dataset", "ds", "--world-size", "2", "--embedding-dim", "8",
                "--out", "plan.json", "--no-track"], folder)
    assert done.returncode == 0, done.stderr
    plan = json.loads((folder / "plan.json").read_text())
    table = next(iter(plan["tables"].values()))
    table["shards"].append(dict(table["shards"][0]))  # the same block twice: overlapping
    (folder / "overlap.json").write_text(json.dumps(plan))
    return folder


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_a_plan_with_one_process_is_checked_and_said_unused(work: Path) -> None:
    done = run([CTRCTL, "train", "--dataset", "ds", "--out", "one", "--plan", "plan.json",
                *SMALL, "--no-track"], work)
    assert done.returncode == 0, done.stderr
    assert "one process trains the tables unsharded" in done.stderr


@pytest.mark.parametrize("nproc", [1, 2])
def test_an_overlapping_plan_fails_before_any_worker(work: Path, nproc: int) -> None:
    start = time.monotonic()
    done = run([CTRCTL, "train", "--dataset", "ds", "--out", f"bad{nproc}", "--plan",
                "overlap.json", "--nproc-per-node", str(nproc), *SMALL, "--no-track"], work)
    errors = _errors(done.stderr)
    assert done.returncode == 1 and len(errors) == 1 and "overlap.json" in errors[0], done.stderr
    assert "Traceback" not in done.stderr and "torchrun" not in done.stderr.lower()
    assert not (work / f"bad{nproc}").exists()
    assert time.monotonic() - start < 60


@pytest.mark.slow
def test_an_existing_output_fails_before_the_workers_start(work: Path) -> None:
    done = run([CTRCTL, "train", "--dataset", "ds", "--out", "twice", *SMALL, "--no-track"], work)
    assert done.returncode == 0, done.stderr
    again = run([CTRCTL, "train", "--dataset", "ds", "--out", "twice", "--plan", "plan.json",
                 "--nproc-per-node", "2", *SMALL, "--no-track"], work)
    errors = _errors(again.stderr)
    assert again.returncode == 1 and len(errors) == 1, again.stderr
    assert "already holds checkpoints" in errors[0] and "rank" not in again.stderr
