"""The batch loader: exact contents, shuffling, resume, rank slices, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ctrctl.data.dataset import BatchLoader
from ctrctl.errors import ConfigError, DatasetError
from ctrctl.sparse.validation import validate_keyed_jagged
from ctrctl.testing.datasets import SyntheticDataset, make_dataset


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> SyntheticDataset:
    # Several files and row groups, one multi-hot feature: every path of the reader.
    return make_dataset(
        tmp_path_factory.mktemp("ds") / "ds", {"train": 2300, "val": 500, "test": 301},
        num_dense=3, num_sparse=4, num_embeddings=[50, 60, 70, 80], multi_hot=["C2"],
        row_group_size=256, rows_per_file=1000, seed=1,
    )


def _split_table(ds: SyntheticDataset, split: str) -> pa.Table:
    files = [ds.path / f for f in ds.manifest.split(split).files]
    return pa.concat_tables([pq.read_table(f) for f in files])


def _rows(batches: list) -> dict[str, np.ndarray]:  # type: ignore[type-arg]
    """Concatenate batches back into columns (multi-hot as a list of arrays per row)."""
    out: dict[str, list] = {"label": [], "dense": []}  # type: ignore[type-arg]
    for b in batches:
        out["label"].append(b.labels.numpy())
        out["dense"].append(b.dense.numpy())
        for key, jt in b.sparse.to_dict().items():
            lengths = jt.lengths().numpy()
            values = jt.values().numpy()
            out.setdefault(key, []).extend(np.split(values, np.cumsum(lengths)[:-1]))
    return {
        "label": np.concatenate(out["label"]),
        "dense": np.concatenate(out["dense"]),
        **{k: v for k, v in out.items() if k not in ("label", "dense")},
    }


def test_scoring_mode_returns_every_row_in_file_order(ds: SyntheticDataset) -> None:
    loader = BatchLoader.for_scoring(ds.path, "train", batch_size=300, num_workers=2)
    batches = list(loader.epoch())
    assert [b.batch_size for b in batches] == [300] * 7 + [200]
    got = _rows(batches)
    table = _split_table(ds, "train")
    np.testing.assert_array_equal(got["label"], table.column("label").to_numpy())
    dense = np.stack([table.column(n).to_numpy() for n in ("I1", "I2", "I3")], axis=1)
    np.testing.assert_array_equal(got["dense"], dense)
    for key in ("C1", "C3", "C4"):
        np.testing.assert_array_equal(np.concatenate(got[key]), table.column(key).to_numpy())
    expected_c2 = table.column("C2").to_pylist()
    assert [list(v) for v in got["C2"]] == expected_c2


def test_batch_layout(ds: SyntheticDataset) -> None:
    batch = next(iter(BatchLoader(ds.path, "train", 128, num_workers=0)))
    assert batch.dense.shape == (128, 3) and batch.dense.dtype == torch.float32
    assert batch.labels.shape == (128,) and batch.labels.dtype == torch.float32
    kjt = batch.sparse
    assert kjt.keys() == ["C1", "C2", "C3", "C4"] and kjt.stride() == 128
    lengths = kjt.lengths().view(4, 128)
    assert bool((lengths[[0, 2, 3]] == 1).all())
    assert kjt.values().dtype == torch.int64
    validate_keyed_jagged(kjt, {"C1": 50, "C2": 60, "C3": 70, "C4": 80})
    moved = batch.to("cpu")
    torch.testing.assert_close(moved.dense, batch.dense)


def test_shuffled_epoch_is_a_permutation_seeded_per_epoch(ds: SyntheticDataset) -> None:
    loader = BatchLoader(ds.path, "train", 256, shuffle=True, seed=3, shuffle_buffer=600)
    first = _rows(list(loader.epoch(0)))
    table = _split_table(ds, "train")
    np.testing.assert_array_equal(np.sort(first["dense"][:, 0]),
                                  np.sort(table.column("I1").to_numpy()))
    assert not np.array_equal(first["dense"][:, 0], table.column("I1").to_numpy())
    again = _rows(list(BatchLoader(ds.path, "train", 256, seed=3, shuffle_buffer=600,
                                   num_workers=0).epoch(0)))
    np.testing.assert_array_equal(first["dense"], again["dense"])
    np.testing.assert_array_equal(np.concatenate(first["C2"]), np.concatenate(again["C2"]))
    second = _rows(list(loader.epoch(1)))
    assert not np.array_equal(first["dense"], second["dense"])
    # Rows travel whole: each row's label, dense and ids stay together.
    by_dense = {float(d): i for i, d in enumerate(table.column("I1").to_numpy())}
    idx = np.array([by_dense[float(d)] for d in first["dense"][:, 0]])
    np.testing.assert_array_equal(first["label"], table.column("label").to_numpy()[idx])
    np.testing.assert_array_equal(np.concatenate(first["C4"]),
                                  table.column("C4").to_numpy()[idx])
    c2 = table.column("C2").to_pylist()
    assert [list(v) for v in first["C2"]] == [c2[i] for i in idx]


@pytest.mark.parametrize("start", [1, 4, 8])
def test_resume_yields_the_rest_of_the_epoch_exactly(ds: SyntheticDataset, start: int) -> None:
    loader = BatchLoader(ds.path, "train", 256, seed=5, shuffle_buffer=500, num_workers=2)
    full = list(loader.epoch(2))
    rest = list(BatchLoader(ds.path, "train", 256, seed=5, shuffle_buffer=500,
                            num_workers=0).epoch(2, start_batch=start))
    assert len(rest) == len(full) - start
    for a, b in zip(full[start:], rest, strict=True):
        torch.testing.assert_close(a.dense, b.dense)
        torch.testing.assert_close(a.labels, b.labels)
        torch.testing.assert_close(a.sparse.values(), b.sparse.values())
        torch.testing.assert_close(a.sparse.lengths(), b.sparse.lengths())


def test_drop_last_and_counts(ds: SyntheticDataset) -> None:
    keep = BatchLoader(ds.path, "train", 1000, drop_last=False)
    drop = BatchLoader(ds.path, "train", 1000, drop_last=True)
    assert (keep.num_batches, drop.num_batches) == (3, 2)
    assert [b.batch_size for b in drop.epoch(0)] == [1000, 1000]
    assert [b.batch_size for b in keep.epoch(0)] == [1000, 1000, 300]


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_read_disjoint_equal_slices(ds: SyntheticDataset, world_size: int) -> None:
    loaders = [BatchLoader(ds.path, "train", 60 * world_size, rank=r, world_size=world_size,
                           seed=1, shuffle_buffer=400) for r in range(world_size)]
    counts = {ld.num_batches for ld in loaders}
    assert len(counts) == 1, "every rank must take the same number of steps"
    seen = [_rows(list(ld.epoch(0)))["dense"][:, 0] for ld in loaders]
    assert all(len(s) == 2300 // world_size for s in seen)
    union = np.concatenate(seen)
    assert len(np.unique(union)) == len(union), "ranks overlap"
    first = next(loaders[0].epoch(0))
    assert first.batch_size == 60  # the global batch divided by the world size



@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("start", [0, 3])
def test_global_order_ranks_slice_the_one_process_batches(
    ds: SyntheticDataset, world_size: int, start: int
) -> None:
    # 2300 rows in global batches of 300: 7 full ones and a last of 200 that 3 ranks split
    # unevenly (66, 67, 67).
    one = list(BatchLoader(ds.path, "train", 300, seed=3, shuffle_buffer=400,
                           num_workers=0).epoch(1, start_batch=start))
    loaders = [BatchLoader(ds.path, "train", 300, rank=r, world_size=world_size, seed=3,
                           shuffle_buffer=400, global_order=True) for r in range(world_size)]
    assert {ld.num_batches for ld in loaders} == {8}, "every rank must take the same steps"
    per_rank = [list(ld.epoch(1, start_batch=start)) for ld in loaders]
    assert all(len(batches) == len(one) == 8 - start for batches in per_rank)
    for k, whole in enumerate(one):
        n = whole.batch_size
        parts = [batches[k] for batches in per_rank]
        assert [p.batch_size for p in parts] == [
            (r + 1) * n // world_size - r * n // world_size for r in range(world_size)]
        want = _rows([whole])
        got = [_rows([p]) for p in parts]
        np.testing.assert_array_equal(np.concatenate([g["label"] for g in got]), want["label"])
        np.testing.assert_array_equal(np.concatenate([g["dense"] for g in got]), want["dense"])
        for key in ("C1", "C2", "C3", "C4"):
            joined = [v for g in got for v in g[key]]
            assert len(joined) == len(want[key])
            for a, b in zip(joined, want[key], strict=True):
                np.testing.assert_array_equal(a, b)


def test_scoring_slices_cover_every_row_once(ds: SyntheticDataset) -> None:
    parts = [_rows(list(BatchLoader.for_scoring(ds.path, "test", 50, rank=r,
                                                 world_size=3).epoch()))["dense"]
             for r in range(3)]
    table = _split_table(ds, "test")
    np.testing.assert_array_equal(np.concatenate(parts)[:, 0], table.column("I1").to_numpy())


def test_early_exit_stops_the_reader(ds: SyntheticDataset) -> None:
    loader = BatchLoader(ds.path, "train", 64, num_workers=2, prefetch=2)
    for i, _ in enumerate(loader.epoch(0)):
        if i == 2:
            break
    # A second pass after an abandoned one still works.
    assert sum(1 for _ in loader.epoch(0)) == loader.num_batches


def test_max_rows(ds: SyntheticDataset) -> None:
    loader = BatchLoader.for_scoring(ds.path, "val", 128, max_rows=300)
    assert sum(b.batch_size for b in loader.epoch()) == 300


def test_errors(ds: SyntheticDataset, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not split over 3 ranks"):
        BatchLoader(ds.path, "train", 100, world_size=3)
    with pytest.raises(DatasetError, match="no split"):
        BatchLoader(ds.path, "holdout", 100)
    with pytest.raises(DatasetError, match="no manifest"):
        BatchLoader(tmp_path, "train", 100)
    broken = make_dataset(tmp_path / "b", 200, num_dense=2, num_sparse=2, seed=2)
    f = broken.path / broken.manifest.split("train").files[0]
    pq.write_table(pq.read_table(f).drop_columns(["C2"]), f)
    with pytest.raises(DatasetError, match="'C2' is missing"):
        BatchLoader(broken.path, "train", 100)
