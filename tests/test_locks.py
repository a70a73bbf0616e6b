"""One writer per output: a second command on the same --out fails at once naming the holder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from safetensors.numpy import load_file

from ctrctl.errors import OutputLockedError
from ctrctl.io import lock_path, output_lock

CTRCTL = str(Path(sys.executable).parent / "ctrctl")
ROOT = Path(__file__).resolve().parents[1]


def test_second_holder_fails_naming_the_first(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with output_lock(out, "train"):
        holder = json.loads(lock_path(out).read_text())
        assert holder["pid"] == os.getpid() and holder["command"] == "train"
        with pytest.raises(OutputLockedError, match=f"pid {os.getpid()}"):
            with output_lock(out, "preprocess"):
                pass
    assert not lock_path(out).exists()
    with output_lock(out, "again"):  # released: free again
        pass


def test_a_stale_lock_of_a_killed_process_is_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = ("import sys, os; from ctrctl.io import output_lock\n"
            "with output_lock(sys.argv[1], 'victim'):\n    os._exit(9)\n")
    done = subprocess.run([sys.executable, "-c", code, str(out)], timeout=60)
    assert done.returncode == 9 and lock_path(out).exists()  # left behind by the kill
    with output_lock(out, "survivor"):
        assert json.loads(lock_path(out).read_text())["command"] == "survivor"


def test_nodes_sharing_an_output_lock_apart(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with output_lock(out, "train", name="node0"), output_lock(out, "train", name="node1"):
        pass


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.Popen([CTRCTL, *args, "--no-track"], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _race(args: list[str], out: Path, cwd: Path) -> None:
    """Start ``args`` twice on ``out``, the second once the first holds the lock."""
    first = _start(args, cwd)
    deadline = time.monotonic() + 120
    while not lock_path(out).exists():
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    second = _start(args, cwd)
    _, err = second.communicate(timeout=120)
    assert time.monotonic() - started < 30
    assert second.returncode == 1, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"pid {first.pid}" in errors[0], err
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ctrctl.data.synthetic import synthesize

    folder = tmp_path_factory.mktemp("race")
    synthesize(folder / "logs", rows=400_000, format="criteo", seed=3)
    return folder


@pytest.mark.slow
def test_two_preprocess_on_one_out(logs: Path) -> None:
    # --overwrite: only the lock can stop the second command.
    args = ["preprocess", "--schema", str(ROOT / "schemas" / "criteo_vocab.yaml"),
            "--input", "train=logs/train.tsv", "--input", "val=logs/val.tsv", "--overwrite"]
    _race([*args, "--out", "raced"], logs / "raced", logs)
    done = subprocess.run([CTRCTL, *args, "--out", "solo", "--no-track"], cwd=logs,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    for split in ("train", "val"):
        raced = sorted((logs / "raced" / split).glob("*.parquet"))
        solo = sorted((logs / "solo" / split).glob("*.parquet"))
        assert [p.name for p in raced] == [p.name for p in solo] and raced
        for a, b in zip(raced, solo, strict=True):
            assert pq.read_table(a).equals(pq.read_table(b))


@pytest.mark.slow
def test_two_trains_on_one_out(logs: Path) -> None:
    if not (logs / "raced").exists():
        subprocess.run([CTRCTL, "preprocess", "--schema",
                        str(ROOT / "schemas" / "criteo_vocab.yaml"), "--input",
                        "train=logs/train.tsv", "--input", "val=logs/val.tsv", "--out", "raced",
                        "--no-track"], cwd=logs, check=True, capture_output=True, timeout=600)
    args = ["train", "--dataset", "raced", "training.batch_size=512", "training.max_steps=20", "training.val_max_rows=2000",
            "--overwrite"]
    _race([*args, "--out", "run-raced"], logs / "run-raced", logs)
    done = subprocess.run([CTRCTL, *args, "--out", "run-solo", "--no-track"], cwd=logs,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    raced = sorted((logs / "run-raced" / "checkpoints").glob("*/*.safetensors"))
    solo = sorted((logs / "run-solo" / "checkpoints").glob("*/*.safetensors"))
    assert [p.relative_to(logs / "run-raced") for p in raced] == [
        p.relative_to(logs / "run-solo") for p in solo] and raced
    for a, b in zip(raced, solo, strict=True):
        left, right = load_file(str(a)), load_file(str(b))
        assert left.keys() == right.keys()
        for key in left:
            assert (left[key] == right[key]).all(), (a, key)
