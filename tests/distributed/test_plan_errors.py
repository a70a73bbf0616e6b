"""A plan that does not fit the model or the world fails with a clear PlanError when sharding,
and a one-rank DMP trains exactly as the unsharded model (no spawn: an in-process group)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from ctrctl.distributed.checkpoint import gather_table_weights, load_full_weights
from ctrctl.distributed.default_plan import forced_plan
from ctrctl.distributed.model_parallel import DistributedModelParallel, shard
from ctrctl.distributed.processes import free_port
from ctrctl.distributed.types import ShardingPlan, ShardMetadata
from ctrctl.errors import CheckpointError, PlanError
from ctrctl.modules.embedding_modules import EmbeddingBagCollection
from ctrctl.testing.sharding import golden_tables, make_batches
from ctrctl.testing.sharding_dmp import TinyModel, make_model, reference_steps, sharded_steps


@pytest.fixture
def one_rank() -> Iterator[None]:
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def _with_shards(plan: ShardingPlan, table: str, *shards: ShardMetadata) -> ShardingPlan:
    tables = dict(plan.tables)
    tables[table] = dataclasses.replace(tables[table], shards=tuple(shards))
    return dataclasses.replace(plan, tables=tables)


def test_bad_plans_are_named(one_rank: None) -> None:
    tables = golden_tables()
    good = forced_plan(tables, 1, "table_wise")
    missing = dataclasses.replace(good, tables={k: v for k, v in good.tables.items()
                                                if k != "t1"})
    cases = {
        "tables missing from the plan: t1": missing,
        "lies outside the table": _with_shards(good, "t0", ShardMetadata(0, 0, 0, 38, 8)),
        "outside the world of 1 ranks": _with_shards(good, "t0", ShardMetadata(1, 0, 0, 37, 8)),
        "overlap": dataclasses.replace(
            _with_shards(good, "t0", ShardMetadata(0, 0, 0, 20, 8),
                         ShardMetadata(0, 10, 0, 27, 8)),
            tables={**good.tables, "t0": dataclasses.replace(
                good.tables["t0"], sharding_type="row_wise",
                shards=(ShardMetadata(0, 0, 0, 20, 8), ShardMetadata(0, 10, 0, 27, 8)))}),
    }
    for expected, plan in cases.items():
        ebc = EmbeddingBagCollection(tables, seed=0)
        with pytest.raises(PlanError, match=expected):
            shard(ebc, plan)
    with pytest.raises(PlanError, match="world size 2 but 1 ranks"):
        shard(EmbeddingBagCollection(tables, seed=0), forced_plan(tables, 2, "row_wise"))


def test_one_rank_dmp_matches_unsharded(one_rank: None) -> None:
    model, keys = make_model("exact_rowwise_adagrad", seed=4)
    ref, _ = make_model("exact_rowwise_adagrad", seed=4)
    dmp = DistributedModelParallel(model)              # the default plan
    assert {ps.sharding_type for ps in dmp.plan.tables.values()} == {"table_wise"}
    assert isinstance(dmp.unwrapped, TinyModel)
    steps = [make_batches(golden_tables(), (7,), seed) for seed in (1, 2)]
    mine = sharded_steps(dmp, keys, 0, steps)
    theirs = reference_steps(ref, keys, steps)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b)
    after = gather_table_weights(dmp)
    for name, expected in ref.ebc.embedding_bag_weights().items():
        torch.testing.assert_close(after[name], expected, msg=lambda m, n=name: f"{n}: {m}")


def test_full_weights_import_and_export(one_rank: None) -> None:
    tables = golden_tables()
    sharded = shard(EmbeddingBagCollection(tables, seed=0),
                    forced_plan(tables, 1, {"t0": "row_wise", "t1": "column_wise",
                                            "t2": "data_parallel", "t3": "table_wise"}))
    full = {t.name: torch.randn(t.num_embeddings, t.embedding_dim) for t in tables}
    load_full_weights(sharded, full)
    exported = gather_table_weights(sharded)
    for name, weight in full.items():
        torch.testing.assert_close(exported[name], weight)
    with pytest.raises(CheckpointError, match="does not fit"):
        load_full_weights(sharded, {**full, "t0": torch.zeros(3, 8)})
    with pytest.raises(CheckpointError, match="no weights for tables"):
        load_full_weights(sharded, {k: v for k, v in full.items() if k != "t1"})
