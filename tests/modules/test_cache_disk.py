"""Cached tables on full, read-only and shrinking disks (N103, N104, N109): one clear error
naming the file, nothing left behind, never a SIGBUS. The disks are small tmpfs mounts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from ctrctl.errors import OutputLocationError
from ctrctl.modules.cached_embedding import CachedEmbeddingBag
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig


def _mount(folder: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    folder.mkdir()
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): "
                    "the full- and read-only-disk cases need one")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from _mount(tmp_path / "small", "2m")


@pytest.fixture()
def read_only_disk(tmp_path: Path) -> Iterator[Path]:
    yield from _mount(tmp_path / "ro", "1m", read_only=True)


def test_a_full_disk_is_one_error_before_training_and_leaves_no_file(small_disk: Path) -> None:
    # 100k rows x 16 floats = 6.4 MB of weights (and 0.4 MB of optimizer state): over 2 MB.
    with pytest.raises(OutputLocationError, match="no room for the cached table's file") as info:
        CachedEmbeddingBag([(100_000, 16)], optimizer=EmbeddingOptimizerConfig(lr=0.1),
                           cache_load_factor=0.05, cache_dir=small_disk, names=["C1"])
    assert "C1.weight.f32" in info.value.render()
    assert list(small_disk.iterdir()) == []


def test_a_read_only_cache_dir_is_one_error(read_only_disk: Path) -> None:
    with pytest.raises(OutputLocationError, match="Read-only file system"):
        CachedEmbeddingBag([(1000, 4)], cache_dir=read_only_disk / "cache")


def test_a_file_reserved_at_creation_takes_its_blocks(tmp_path: Path) -> None:
    bag = CachedEmbeddingBag([(50_000, 16)], cache_load_factor=0.05, cache_dir=tmp_path)
    store = bag.caches[0].store
    weight = store.paths[0]
    assert weight.stat().st_blocks * 512 >= 50_000 * 16 * 4  # not a sparse file
    bag.close()


def test_a_truncated_cache_file_is_an_error_naming_it_not_a_bus_error(tmp_path: Path) -> None:
    """N109: ``truncate -s 0`` of a cache file mid-training (a subprocess: a SIGBUS would
    kill the test run)."""
    script = textwrap.dedent(f"""
        import os, sys, torch
        from pathlib import Path
        from ctrctl.errors import OutputLocationError
        from ctrctl.modules.cached_embedding import CachedEmbeddingBag
        from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
        bag = CachedEmbeddingBag([(20_000, 8)], optimizer=EmbeddingOptimizerConfig(lr=0.1),
                                 cache_load_factor=0.01, cache_dir={str(tmp_path)!r},
                                 names=["C1"])
        generator = torch.Generator().manual_seed(0)
        def step():
            ids = torch.randint(0, 20_000, (512,), generator=generator)
            bag(ids, torch.arange(0, 513, 4)).sum().backward()
        for _ in range(5):
            step()
        os.truncate(bag.caches[0].store.paths[0], 0)
        try:
            for _ in range(50):
                step()
            bag.flush()
            bag.split_weights()
        except OutputLocationError as exc:
            print("error:", exc)
            sys.exit(1)
        print("no error")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "C1.weight.f32: the cached table's file is 0 bytes where" in done.stdout
    assert "truncated while in use" in done.stdout


def test_train_on_a_full_cache_disk_is_one_line(small_disk: Path, tmp_path: Path) -> None:
    """N103 through the command: rc 1 and one line, not "Bus error" and rc 135."""
    from ctrctl.testing.datasets import make_dataset

    ds = make_dataset(tmp_path / "ds", {"train": 200, "val": 50, "test": 50}, num_dense=2,
                      num_sparse=2, num_embeddings=[200_000, 20], seed=1)
    name = ds.manifest.sparse_names[0]
    done = subprocess.run(
        [sys.executable, "-m", "ctrctl", "train", "--dataset", str(ds.path), "--out",
         str(tmp_path / "run"), "--no-track", "model.embedding_dim=8",
         "model.dense_arch=[8]", "model.over_arch=[8,1]", "training.max_steps=3",
         "training.device=cpu", "training.num_workers=0",
         f"model.cached_tables={{{name}: 0.05}}", f"model.cache_dir={small_disk}"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"))
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    assert "no room for the cached table's file" in output and "Traceback" not in output
    assert list(small_disk.iterdir()) == []
