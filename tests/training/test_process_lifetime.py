"""The ranks die with their launcher (N120, N121): ``kill -9`` of the launcher's process
group, of torchrun's agent or of the launcher alone leaves no rank training on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ctrctl.testing.datasets import SyntheticDataset, make_dataset

LONG = [
    "model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
    "training.batch_size=16", "training.epochs=1000", "training.val_every=0",
    "training.checkpoint_every=0", "training.log_every=1", "training.num_workers=0",
    "training.device=cpu",
]


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> SyntheticDataset:
    return make_dataset(tmp_path_factory.mktemp("ds") / "ds",
                        {"train": 2000, "val": 100, "test": 100}, num_dense=2, num_sparse=2,
                        num_embeddings=[40, 50], row_group_size=256, seed=5)


def _processes(marker: str) -> dict[str, list[int]]:
    """Pids of this test's torchrun agent and ranks (their command lines hold ``marker``)."""
    found: dict[str, list[int]] = {"agent": [], "rank": []}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker not in cmdline or state == "Z":
            continue
        if "torch.distributed.run" in cmdline:
            found["agent"].append(int(entry))
        elif "ctrctl.training.worker" in cmdline:
            found["rank"].append(int(entry))
    return found


def _wait_for(condition: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("victim", ["process group", "torchrun agent", "launcher"])
def test_no_rank_outlives_its_launcher(ds: SyntheticDataset, tmp_path: Path,
                                       victim: str) -> None:
    out = tmp_path / f"run-{victim.replace(' ', '-')}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    log = (tmp_path / "launcher.log").open("w")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ctrctl", "train", "--dataset", str(ds.path), "--out", str(out),
         *LONG, "--nproc-per-node", "2", "--no-track"],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Training has begun on both ranks once rank 0 logs steps.
        assert _wait_for(lambda: len(_processes(str(out))["rank"]) == 2
                         and "step" in (tmp_path / "launcher.log").read_text(), 240), (
            (tmp_path / "launcher.log").read_text()[-3000:])
        ranks = _processes(str(out))["rank"]
        if victim == "process group":
            os.killpg(launcher.pid, signal.SIGKILL)
        elif victim == "torchrun agent":
            (agent,) = _processes(str(out))["agent"]
            os.kill(agent, signal.SIGKILL)
        else:
            os.kill(launcher.pid, signal.SIGKILL)
        assert _wait_for(lambda: not any(_alive(pid) for pid in ranks), 5), (
            f"ranks {[p for p in ranks if _alive(p)]} outlived the {victim} by 5 s")
        assert _wait_for(lambda: _processes(str(out)) == {"agent": [], "rank": []}, 5)
    finally:
        for pid in [launcher.pid, *sum(_processes(str(out)).values(), [])]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        launcher.wait(timeout=30)
        log.close()


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, killed and not yet reaped, counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_rank_orphaned_before_it_asks_ends_itself(tmp_path: Path) -> None:
    """The race: the agent dies while the rank still imports; the rank's late request
    would never fire, so it looks again and ends itself."""
    marker = tmp_path / "rank.txt"
    rank = textwrap.dedent(f"""
        import time
        time.sleep(1.0)                      # the agent is gone by now
        from ctrctl.distributed.launch import die_with_launcher
        die_with_launcher()
        open({str(marker)!r}, "w").write("survived")
    """)
    agent = textwrap.dedent(f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", {rank!r}], start_new_session=True)
    """)  # and exits at once, leaving the rank behind
    env = dict(os.environ, CTRCTL_LAUNCHER_PID=str(os.getpid()))
    subprocess.run([sys.executable, "-c", agent], env=env, check=True, timeout=60)
    time.sleep(4.0)
    assert not marker.exists(), "an orphaned rank went on"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_rank_whose_agent_lives_goes_on(tmp_path: Path) -> None:
    marker = tmp_path / "rank.txt"
    rank = textwrap.dedent(f"""
        from ctrctl.distributed.launch import die_with_launcher
        die_with_launcher()
        open({str(marker)!r}, "w").write("went on")
    """)
    agent = textwrap.dedent(f"""
        import subprocess, sys
        subprocess.run([sys.executable, "-c", {rank!r}], check=True)
    """)
    env = dict(os.environ, CTRCTL_LAUNCHER_PID=str(os.getpid()))
    subprocess.run([sys.executable, "-c", agent], env=env, check=True, timeout=60)
    assert marker.read_text() == "went on"
