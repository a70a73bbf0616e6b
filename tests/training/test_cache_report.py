"""Cache metrics of cached tables, as the end of training logs them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from ctrctl.data.manifest import DatasetManifest, DenseFeature, SparseFeature, SplitInfo
from ctrctl.models.build import dlrm_from_manifest
from ctrctl.modules import DLRM
from ctrctl.modules.cached_embedding import CachedEmbeddingBag
from ctrctl.sparse import KeyedJaggedTensor
from ctrctl.training.cache_report import cache_metrics, format_cache_report

ROWS = {"C1": 4000, "C2": 900, "C3": 30}
LOAD = {"C1": 0.05, "C2": 0.2}  # C3 stays resident
BATCH = 64
COUNTERS = ["calls", "requested_ids", "unique_ids", "unique_misses", "conflict_misses",
            "rows_written_back", "bytes_read", "bytes_written"]


def _manifest() -> DatasetManifest:
    return DatasetManifest(
        label="label", dense=(DenseFeature("I0"),),
        sparse=tuple(SparseFeature(n, "hash", r) for n, r in ROWS.items()),
        splits={"train": SplitInfo(rows=10, label_rate=0.5)},
    )


def _model(tmp_path: Path, cached: dict[str, float] | None) -> DLRM:
    return dlrm_from_manifest(_manifest(), 4, [4], [4, 1], backend="torch", seed=2,
                              cached_tables=cached, cache_dir=str(tmp_path))


def _batches(steps: int) -> list[tuple[torch.Tensor, KeyedJaggedTensor]]:
    rng = np.random.default_rng(5)
    out = []
    for _ in range(steps):
        lengths = rng.integers(0, 3, size=len(ROWS) * BATCH)
        values = []
        for f, rows in enumerate(ROWS.values()):
            n = int(lengths[f * BATCH : (f + 1) * BATCH].sum())
            ranks = (rng.zipf(1.1, n) - 1) % rows
            values.append((ranks * 7919 + 3) % rows)
        kjt = KeyedJaggedTensor.from_lengths_sync(list(ROWS), torch.from_numpy(np.concatenate(values)),
                                                  torch.from_numpy(lengths))
        out.append((torch.randn(BATCH, 1), kjt))
    return out


def _train(model: DLRM, batches: list[tuple[torch.Tensor, KeyedJaggedTensor]],
           inline_steps: int) -> None:
    """Steps before ``inline_steps`` look up inline; later ones are prefetched a step ahead."""
    ebc = model.sparse_arch
    for i, (dense, kjt) in enumerate(batches):
        logits = model(dense, kjt)
        if i + 1 >= inline_steps and i + 1 < len(batches):
            ebc.prefetch(batches[i + 1][1])
        logits.square().sum().backward()


def _bag_and_index(model: DLRM, table: str) -> tuple[CachedEmbeddingBag, int]:
    ebc = model.sparse_arch
    group, index = ebc._table_slot[table]
    bag = ebc.bags[group]
    assert isinstance(bag, CachedEmbeddingBag)
    return bag, index


def test_metrics_are_the_caches_own_counters(tmp_path: Path) -> None:
    model = _model(tmp_path, LOAD)
    batches = _batches(12)
    _train(model, batches, inline_steps=2)
    model.sparse_arch.flush()  # as a checkpoint does: dirty rows go to the files
    metrics = cache_metrics(model)
    assert {k.split(".")[1] for k in metrics if k != "cache.prefetch_wait_seconds"} == set(LOAD)
    for table in LOAD:
        bag, t = _bag_and_index(model, table)
        cache = bag.caches[t]
        for key in COUNTERS:
            assert metrics[f"cache.{table}.{key}"] == getattr(cache.counters, key), key
        assert metrics[f"cache.{table}.dram_bytes"] == cache.dram_bytes()
        assert metrics[f"cache.{table}.forward_misses"] == bag.forward_misses[t]
        # Independently of the cache: what the batches asked for.
        f = list(ROWS).index(table)
        ids = [kjt.values()[kjt.offsets()[f * BATCH] : kjt.offsets()[(f + 1) * BATCH]]
               for _, kjt in batches]
        assert metrics[f"cache.{table}.calls"] == len(batches)
        assert metrics[f"cache.{table}.requested_ids"] == sum(i.numel() for i in ids)
        unique = [torch.unique(i).numel() for i in ids]
        assert metrics[f"cache.{table}.unique_ids"] == sum(unique)
        # Two inline steps: the first finds the cache empty (all its ids miss), then the
        # second misses what the first did not bring; every later batch is prefetched.
        first_two = torch.unique(torch.cat(ids[:2])).numel()
        assert metrics[f"cache.{table}.forward_misses"] == first_two
        assert metrics[f"cache.{table}.unique_misses"] > first_two  # the cache is too small
        assert metrics[f"cache.{table}.hit_rate"] == pytest.approx(
            1 - metrics[f"cache.{table}.unique_misses"] / metrics[f"cache.{table}.unique_ids"])
        assert 0 < metrics[f"cache.{table}.hit_rate"] < 1
        assert metrics[f"cache.{table}.rows_written_back"] > 0
        assert metrics[f"cache.{table}.bytes_written"] == (
            metrics[f"cache.{table}.rows_written_back"] * cache.store.row_bytes)
        assert metrics[f"cache.{table}.prefetch_seconds"] > 0
        assert metrics[f"cache.{table}.inline_lookup_seconds"] > 0
    assert metrics["cache.prefetch_wait_seconds"] == bag.prefetch_wait_seconds >= 0


def test_wrapped_model_reports_the_same(tmp_path: Path) -> None:
    class Wrapper(nn.Module):  # as DDP and DMP hold the model
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

    model = _model(tmp_path, {"C2": 0.2})
    _train(model, _batches(4), inline_steps=4)
    direct = cache_metrics(model)
    assert cache_metrics(Wrapper(Wrapper(model))) == direct
    assert cache_metrics(model.sparse_arch) == direct
    assert direct["cache.C2.calls"] == 4
    assert direct["cache.C2.forward_misses"] == direct["cache.C2.unique_misses"] > 0
    assert direct["cache.C2.prefetch_seconds"] == 0.0
    assert "cache.C1.calls" not in direct


def test_no_cached_table_gives_no_metrics(tmp_path: Path) -> None:
    model = _model(tmp_path, None)
    _train(model, _batches(2), inline_steps=0)
    assert cache_metrics(model) == {}
    assert format_cache_report({}) == ""


def test_a_table_not_looked_up_yet_has_no_hit_rate(tmp_path: Path) -> None:
    metrics = cache_metrics(_model(tmp_path, LOAD))
    assert metrics["cache.C1.calls"] == 0 and "cache.C1.hit_rate" not in metrics
    assert "C1" in format_cache_report(metrics).splitlines()[1]


def test_report_has_a_line_per_table(tmp_path: Path) -> None:
    model = _model(tmp_path, LOAD)
    _train(model, _batches(6), inline_steps=1)
    metrics = cache_metrics(model)
    lines = format_cache_report(metrics).splitlines()
    assert lines[0].split()[:3] == ["table", "hit", "rate"]
    assert [line.split()[0] for line in lines[1:3]] == ["C1", "C2"]
    for line, table in zip(lines[1:3], ["C1", "C2"], strict=True):
        assert line.split()[1] == f"{metrics[f'cache.{table}.hit_rate']:.3f}"
        assert line.split()[2] == f"{metrics[f'cache.{table}.calls']:,.0f}"
    assert lines[3].startswith("waited for prefetches:")
    assert len(lines) == 4


def test_train_runs_with_a_cached_table(tmp_path: Path) -> None:
    from ctrctl import checkpoint as ckpt
    from ctrctl.config import load_config
    from ctrctl.testing.datasets import make_dataset
    from ctrctl.training.loop import train

    ds = make_dataset(tmp_path / "ds", {"train": 400, "val": 100, "test": 100}, num_dense=2,
                      num_sparse=2, num_embeddings=[500, 20], row_group_size=128, seed=1)
    overrides = [
        "model.embedding_dim=4", "model.dense_arch=[8,4]", "model.over_arch=[8,1]",
        "training.batch_size=50", "training.epochs=1", "training.num_workers=1",
        "training.device=cpu", "model.cached_tables={C1: 0.1}",
        f"model.cache_dir={tmp_path / 'cache'}",
    ]
    cfg = load_config(None, overrides)
    assert cfg.model.cached_tables == {"C1": 0.1}
    result = train(ds.path, tmp_path / "run", cfg)
    assert (tmp_path / "cache").is_dir()  # the cached kernel made its files there
    assert result.step == 8
    meta = ckpt.read_metadata(result.checkpoint)
    assert meta.table_shape("C1") == (500, 4)  # the whole cached table is in the checkpoint
    # the loop reports the cache: in the result, metrics.json and (rank 0) MLflow
    import json

    assert result.cache["cache.C1.calls"] >= result.step  # training and validation lookups
    assert 0.0 <= result.cache["cache.C1.hit_rate"] <= 1.0
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["cache"] == result.cache
    # auto picks the prefetch pipeline: no forward misses, validation included, as long as
    # no checkpoint empties the cache mid-run (the best-step saves of early stopping do)
    steady = train(ds.path, tmp_path / "steady", load_config(None, [
        *overrides, "training.early_stopping.enabled=false"]))
    assert steady.cache["cache.C1.forward_misses"] == 0
    assert steady.cache["cache.C1.unique_misses"] > 0
