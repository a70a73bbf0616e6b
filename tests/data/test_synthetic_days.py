"""Synthetic day logs, and a zch dataset from them through preprocess, loader and model."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import torch

from ctrctl.data.dataset import BatchLoader
from ctrctl.data.preprocess import preprocess
from ctrctl.data.schema import Schema
from ctrctl.data.synthetic_days import days_schema, synthesize_days
from ctrctl.models.build import dlrm_from_manifest
from ctrctl.modules import dlrm_loss


def test_days_bring_new_ids_and_old_ones_fade(tmp_path: Path) -> None:
    a = synthesize_days(tmp_path / "a", days=4, rows_per_day=3000, new_ids_per_day=300,
                        popularity_drift=0.7, initial_ids=500, seed=1)
    b = synthesize_days(tmp_path / "b", days=4, rows_per_day=3000, new_ids_per_day=300,
                        popularity_drift=0.7, initial_ids=500, seed=1)
    assert a.files[4].read_bytes() == b.files[4].read_bytes()  # same arguments, same bytes
    days = {d: pl.read_csv(a.files[d], schema_overrides={"user": pl.String}) for d in a.files}
    assert all(frame["day"].unique().to_list() == [d] for d, frame in days.items())
    first = set(days[1]["user"].to_list())
    later = days[4]["user"].to_list()
    new_share = sum(u not in first for u in later) / len(later)
    assert new_share > 0.5  # day 4's traffic is mostly ids born after day 1
    assert a.distinct == {"user": 500 + 3 * 300, "item": 250 + 3 * 75}
    assert 0.6 < a.best_auc[4] < 0.95


def test_a_zch_dataset_trains_through_the_library(tmp_path: Path) -> None:
    logs = synthesize_days(tmp_path / "logs", days=3, rows_per_day=1000, new_ids_per_day=200,
                           initial_ids=400, seed=0)
    zch = {"collision": {"kind": "zch", "capacity": 64, "eviction": "lru"}}
    schema = Schema.from_dict(days_schema(zch, {"hash_size": 100}))
    inputs = [f"train={logs.files[1]}", f"train={logs.files[2]}", f"test={logs.files[3]}"]
    manifest = preprocess(schema, inputs, tmp_path / "ds", val_fraction=0.0)
    model = dlrm_from_manifest(manifest, 8, [], [8, 1], seed=0)
    assert model.collisions is not None and model.collisions.features() == ["user"]
    model.train()
    for batch in BatchLoader(tmp_path / "ds", "train", 256, shuffle=False, num_workers=1):
        dlrm_loss(model(batch.dense, batch.sparse), batch.labels).backward()
    stats = model.collisions.stats()["user"]
    assert stats["occupancy"] == 1.0 and stats["evictions"] > 0
    assert stats["lookups"] == 2000
    weights = model.sparse_arch.embedding_bag_weights()["user"]
    assert bool((weights.abs().sum(1) > 0).all())  # no all-zero row after all the evictions
    model.eval()
    batch = next(iter(BatchLoader(tmp_path / "ds", "test", 512, shuffle=False, cover_all=True,
                                  num_workers=1)))
    with torch.no_grad():
        assert torch.isfinite(model(batch.dense, batch.sparse)).all()
    assert model.collisions.stats()["user"]["lookups"] == 2000  # eval changes nothing
