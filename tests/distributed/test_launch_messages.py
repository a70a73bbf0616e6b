"""What the launcher says when a rank dies without a word or a node never joins."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ctrctl.distributed.launch import (
    JOIN_TIMEOUT_ENV,
    launch,
    rank_death,
    torchrun_command,
    worker_failure,
)
from ctrctl.distributed.processes import free_port
from ctrctl.errors import DistributedError

#: torchrun's failure summary as it writes it (torch 2.13) when rank 1 got ``kill -9``.
SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
kill.py FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-04_08:13:09
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 7799)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 7799
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-04_08:13:09
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 7800)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 7800
======================================================
"""


def test_the_root_cause_rank_and_its_signal_are_read_from_torchrun() -> None:
    death = rank_death(SUMMARY)
    assert death is not None and (death.rank, death.exitcode) == (1, -9)
    assert "rank 1 was killed by SIGKILL (signal 9)" in death.describe()
    assert rank_death("no summary here") is None


def test_a_silent_death_is_named_before_the_peers_it_took_down(tmp_path: Path) -> None:
    log = tmp_path / "ranks.log"
    log.write_text(SUMMARY)
    (tmp_path / "rank-0.json").write_text(json.dumps(
        {"rank": 0, "message": "peer closed the connection", "kind": "DistributedError"}))
    error = worker_failure(tmp_path, 1, log)
    assert error.where == "rank 1" and "killed by SIGKILL" in error.message
    assert "1 other rank failed after it" in error.message
    assert "crash or an internal error" not in error.message


def test_several_nodes_wait_a_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JOIN_TIMEOUT_ENV, "42")
    cmd = torchrun_command(["x.py"], 1, nnodes=2, rdzv_endpoint="127.0.0.1:1")
    assert "--rdzv-conf=join_timeout=42" in cmd


@pytest.mark.distributed
def test_a_killed_rank_is_named_with_its_signal(tmp_path: Path) -> None:
    script = tmp_path / "kill.py"
    script.write_text("import os, signal, time\n"
                      "if os.environ['RANK'] == '1':\n"
                      "    os.kill(os.getpid(), signal.SIGKILL)\n"
                      "time.sleep(30)\n")
    with pytest.raises(DistributedError) as caught:
        launch([str(script)], nproc_per_node=2)
    assert caught.value.where == "rank 1"
    assert "killed by SIGKILL (signal 9)" in caught.value.message


@pytest.mark.distributed
def test_a_node_that_never_joins_is_announced_and_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    monkeypatch.setenv(JOIN_TIMEOUT_ENV, "3")
    endpoint = f"127.0.0.1:{free_port()}"
    log = logging.getLogger("ctrctl")  # the CLI may have stopped it propagating to root
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="ctrctl"), \
                pytest.raises(DistributedError) as caught:
            launch([str(script)], nproc_per_node=1, nnodes=2, node_rank=0,
                   rdzv_endpoint=endpoint)
    finally:
        log.removeHandler(caplog.handler)
    assert f"waiting at {endpoint}" in caplog.text and "at most 3 s" in caplog.text
    assert caught.value.message.startswith("node 1 never joined")
    assert endpoint in caught.value.message and "within 3 s" in caught.value.message
