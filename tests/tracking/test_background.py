"""Background tracking as a command meets it: the command exits without MLflow, its run
arrives through the detached replayer, and the choice of mode."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ctrctl.cli.common import tracking_mode
from ctrctl.errors import ConfigError
from ctrctl.tracking import MODE_ENV, PARENT_RUN_ENV
from ctrctl.tracking.replay import pending
from ctrctl.tracking.uri import spool_folder
from tests.tracking.helpers import runs_of

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    return {**env, "PYTHONPATH": str(ROOT), MODE_ENV: "background", **extra}


def wait_sent(spool: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while pending(spool) and time.monotonic() < deadline:
        time.sleep(0.2)
    log = spool / "replay.log"
    assert not pending(spool), log.read_text() if log.is_file() else "no replay log"


@pytest.mark.slow
def test_a_leaf_command_tracks_in_the_background(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "ctrctl", "synth", "--rows", "200", "--out", "out",
         "--tracking-uri", uri], cwd=tmp_path, env=_env(), capture_output=True, text=True,
        timeout=120, check=False)  # returns at the command's exit: the replayer holds no pipe
    assert done.returncode == 0, done.stderr
    assert f"run 'synth' will appear in {uri}, experiment 'ctrctl'" in done.stderr
    spool = spool_folder(uri, tmp_path)
    assert spool == tmp_path / "store" / ".ctrctl" / "spool" / "mlflow.db"
    wait_sent(spool)
    [run] = runs_of(uri, "ctrctl")
    assert run.info.status == "FINISHED" and run.info.run_name == "synth"
    assert run.data.params["rows"] == "200" and run.data.metrics["rows.train"] == 160


def test_the_command_process_does_not_import_mlflow(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys
        from ctrctl.tracking import make_tracker
        tracker = make_tracker(True, "sqlite:///{tmp_path}/mlflow.db", mode="background")
        tracker.spawn = False
        with tracker.run("step") as run:
            run.log_params({{"a": 1}})
            run.log_metrics({{"m": 1.0}}, step=3)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("mlflow", "sqlalchemy")))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert len(pending(spool_folder(f"sqlite:///{tmp_path}/mlflow.db", tmp_path))) == 1


def test_the_mode_leaf_commands_track_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MODE_ENV, raising=False)
    monkeypatch.delenv(PARENT_RUN_ENV, raising=False)
    assert tracking_mode(background=True) == "background"  # the default of leaf commands
    assert tracking_mode(background=False) == "sync"  # train, quantize, run, tune, monitor
    monkeypatch.setenv(MODE_ENV, "sync")
    assert tracking_mode(background=True) == "sync"
    monkeypatch.setenv(MODE_ENV, "background")
    monkeypatch.setenv(PARENT_RUN_ENV, "0123")  # a step of `ctrctl run`: its id is looked up
    assert tracking_mode(background=True) == "sync"
    monkeypatch.setenv(MODE_ENV, "later")
    with pytest.raises(ConfigError, match="later"):
        tracking_mode(background=True)
