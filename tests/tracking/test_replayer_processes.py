"""Replayer processes: one killed mid-journal leaves it for the next, and two at once send
each journal once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctrctl.tracking.journal import JournalTracker
from ctrctl.tracking.replay import flush, pending
from tests.tracking.helpers import runs_of

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _replayer(spool: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "ctrctl.tracking.replay", str(spool)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_a_killed_replayer_leaves_the_journal_and_the_next_completes_it(
        tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = JournalTracker(uri, "killed", spawn=False)
    with tracker.run("train-like") as run:
        for step in range(400):
            run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    [journal] = tracker.journals
    state = journal.with_name(journal.name.removesuffix(".jsonl") + ".state")
    replayer = _replayer(tracker.spool)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and replayer.poll() is None:
        if state.is_file() and json.loads(state.read_text())["lines"] > 20:
            break
        time.sleep(0.02)
    assert replayer.poll() is None, "the replayer finished before it could be killed"
    os.kill(replayer.pid, signal.SIGKILL)
    replayer.wait()
    assert journal.exists() and pending(tracker.spool) == [journal]

    assert flush(tracker.spool).sent == [journal.name]
    [replayed] = runs_of(uri, "killed")
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri=uri).get_metric_history(replayed.info.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(400))  # each step once
    assert replayed.info.status == "FINISHED"


def test_two_replayers_at_once_send_each_journal_once(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    flush_store = JournalTracker(uri, "warm", spawn=False)  # the store exists before the race
    with flush_store.run("warm"):
        pass
    flush(flush_store.spool)
    tracker = JournalTracker(uri, "two", spawn=False)
    for index in range(4):
        with tracker.run(f"step{index}") as run:
            for step in range(30):
                run.log_metrics({"loss": float(step)}, step=step)
    replayers = [_replayer(tracker.spool) for _ in range(2)]
    for replayer in replayers:
        assert replayer.wait(timeout=240) == 0
    assert pending(tracker.spool) == []
    runs = runs_of(uri, "two")
    assert sorted(r.info.run_name for r in runs) == [f"step{i}" for i in range(4)]
