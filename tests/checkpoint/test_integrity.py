"""Fault injection: every damaged checkpoint file is refused on load, naming the file."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ctrctl import checkpoint as ckpt
from ctrctl.errors import CheckpointError
from ctrctl.testing.checkpoints import full_tables


def _save(folder: Path) -> Path:
    shards = [ckpt.TableShard(name, 0, 0, w.clone(), {"momentum": rs.clone()})
              for name, (w, rs, _) in full_tables().items()]
    optim = torch.optim.Adagrad([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    return ckpt.save_checkpoint(
        folder, 3, shards, {"mlp.weight": torch.arange(6.0).view(2, 3)}, optim.state_dict(),
        {"epoch": 0, "batch": 3}, {"epoch": 0, "manifest_hash": "m", "config": {}, "plan": None})


def _load_all(path: Path) -> None:
    meta = ckpt.read_metadata(path)
    ckpt.load_table_shards(path, [(t, 0, 0, *meta.table_shape(t)) for t in meta.tables])
    ckpt.load_dense(path)
    ckpt.load_trainer_state(path)
    ckpt.load_rng_state(path)


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _flip(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[-3] ^= 0x01  # a data byte of the last tensor: the header still parses
    file.write_bytes(bytes(data))


def _bad_header(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[:8] = b"\xff" * 8
    file.write_bytes(bytes(data))


def _pickle(file: Path) -> None:
    file.write_bytes(pickle.dumps({"weight": [1.0, 2.0]}))


def _wrong_shape(file: Path) -> None:
    save_file({"weight": torch.zeros(2, 2)}, str(file))


FAULTS: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate, "flipped byte": _flip, "bad header": _bad_header,
    "pickle in place of safetensors": _pickle, "wrong shape": _wrong_shape,
    "missing shard": lambda f: f.unlink(),
}


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = _save(tmp_path / "checkpoints")
    _load_all(path)  # undamaged, it loads
    return path


def _table_file(path: Path) -> Path:
    return sorted((path / "tables").rglob("*.safetensors"))[0]


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_damaged_table_file_is_refused_naming_it(saved: Path, fault: str) -> None:
    target = _table_file(saved)
    FAULTS[fault](target)
    with pytest.raises(CheckpointError) as info:
        _load_all(saved)
    assert str(target) in info.value.render()


@pytest.mark.parametrize("name", ["dense.safetensors", "dense_optimizer.pt",
                                  "trainer_state.json", "rng/0.safetensors"])
@pytest.mark.parametrize("fault", ["truncated", "flipped byte", "pickle in place of safetensors"])
def test_every_other_file_is_verified(saved: Path, name: str, fault: str) -> None:
    target = saved / name
    FAULTS[fault](target)
    with pytest.raises(CheckpointError) as info:
        _load_all(saved)
    assert str(target) in info.value.render()


def test_metadata_records_every_file(saved: Path) -> None:
    files = json.loads((saved / "metadata.json").read_text())["files"]
    on_disk = {str(p.relative_to(saved)) for p in saved.rglob("*")
               if p.is_file() and p.name != "metadata.json"}
    assert set(files) == on_disk


@pytest.mark.parametrize("fault", ["bad header", "pickle in place of safetensors", "wrong shape"])
def test_unverified_old_checkpoints_still_fail_cleanly(saved: Path, fault: str) -> None:
    meta = saved / "metadata.json"
    data = json.loads(meta.read_text())
    del data["files"]  # as written before checksums were recorded
    meta.write_text(json.dumps(data))
    target = _table_file(saved)
    FAULTS[fault](target)
    with pytest.raises(CheckpointError) as info:
        _load_all(saved)
    assert str(target) in info.value.render()


@pytest.mark.slow
def test_cli_says_one_line(tmp_path: Path) -> None:
    from ctrctl.testing.datasets import make_dataset

    make_dataset(tmp_path / "ds", rows=256, num_sparse=3, seed=0)
    ctrctl = str(Path(sys.executable).parent / "ctrctl")
    small = ["model.embedding_dim=8", "model.dense_arch=[16,8]", "training.batch_size=64",
             "training.max_steps=2"]
    done = subprocess.run([ctrctl, "train", "--dataset", "ds", "--out", "run", "--no-track",
                           *small], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    target = _table_file(ckpt.resolve_checkpoint(tmp_path / "run"))
    _flip(target)
    done = subprocess.run([ctrctl, "eval", "--checkpoint", "run", "--out", "ev", "--no-track"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    assert str(target.relative_to(tmp_path)) in errors[0] and "sha256" in errors[0]
    assert "Traceback" not in done.stderr and not (tmp_path / "ev").exists()
