"""Serving placement by the planner's inference cost mode: quantized bytes, one request."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ctrctl.data.dataset import BatchLoader
from ctrctl.distributed.planner import (
    EmbeddingShardingPlanner,
    TableConstraints,
    TableSpec,
    serving_planner,
    serving_table,
    serving_topology,
)
from ctrctl.distributed.planner.inference import BLOCK_ALIGNMENT
from ctrctl.errors import PlanError
from ctrctl.inference.export import load_artifact, write_artifact
from ctrctl.inference.predictor import batch_inputs
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
from ctrctl.inference.shard import ServingPlan, block_bytes, place_tables
from ctrctl.modules.quant_embedding import CACHE_LINE, QUANT_DTYPES, QuantTableSpec

from .conftest import Trained

MIB = 2**20


@pytest.mark.parametrize("dtype", QUANT_DTYPES)
@pytest.mark.parametrize("dim", [8, 64, 100])
def test_planner_prices_rows_as_the_kernel_stores_them(dtype: str, dim: int) -> None:
    if dtype == "int2" and dim % 4:
        pytest.skip("int2 packs four values a byte")
    kernel = QuantTableSpec("t", 1234, dim, dtype)
    planned = serving_table("t", 1234, dim, dtype)
    assert planned.weight_bytes == kernel.nbytes
    assert planned.optimizer == "sgd" and planned.state_bytes(1234, dim) == 0
    assert BLOCK_ALIGNMENT == CACHE_LINE
    result = serving_planner(serving_topology(1), 512).plan([planned])
    assert float(result.rank_ddr[0]) == block_bytes(kernel)
    assert float(result.rank_cost[0, 1] + result.rank_cost[0, 3]) == 0.0  # no backward


def _training_tables(rows: list[int]) -> list[TableSpec]:
    only = TableConstraints(sharding_types=("table_wise",), compute_kernels=("fused",))
    return [TableSpec(f"t{i}", n, 64, optimizer="rowwise_adagrad", constraints=only)
            for i, n in enumerate(rows)]


def test_serving_plan_fits_where_the_training_plan_does_not() -> None:
    rows = [100_000, 90_000, 2_000, 1_000]
    cap = 8 * MIB  # int8: 6.8 MB for the largest table; fp32 + row-wise Adagrad: 26 MB
    training = _training_tables(rows)
    assert training[0].weight_bytes + training[0].state_bytes(rows[0], 64) > cap
    topology = serving_topology(2, cap)
    with pytest.raises(PlanError, match="no plan fits"):
        EmbeddingShardingPlanner(topology, batch_size=512).plan(training)

    tables = [QuantTableSpec(f"t{i}", n, 64, "int8") for i, n in enumerate(rows)]
    # t2 is the expensive one per request (100 ids a candidate): balancing lookups alone
    # puts it alone and t0 with t1, which no shard has room for.
    factors = {"t2": 100.0}
    plan = place_tables(tables, 2, cap, pooling_factors=factors)
    assert all(s["bytes"] <= cap for s in plan.shards)
    assert plan.tables["t0"]["shard"] != plan.tables["t1"]["shard"]
    assert sum(s["bytes"] for s in plan.shards) == sum(block_bytes(t) for t in tables)
    explained = plan.extra["placement"]
    assert explained["cost_mode"] == "inference"
    assert [r["ddr_capacity"] for r in explained["shards"]] == [cap, cap]
    assert all(r["bwd_compute"] == 0 and r["ddr_bytes"] <= cap for r in explained["shards"])
    assert explained["summary"]["num_tables"] == 4
    assert {d["table"] for d in explained["summary"]["top_tables_fullest_rank"]} & {"t0", "t1"}
    assert ServingPlan.from_dict(plan.to_dict()).extra == plan.extra

    # Without the budget the same tables are placed by cost alone.
    free = place_tables(tables, 2, None, pooling_factors=factors)
    assert [s["tables"] for s in free.shards if "t2" in s["tables"]] == [["t2"]]
    assert free.tables["t0"]["shard"] == free.tables["t1"]["shard"]


def test_no_room_is_a_serving_error() -> None:
    tables = [QuantTableSpec(f"t{i}", 100_000, 64, "int8") for i in range(3)]
    with pytest.raises(PlanError, match="need .* MiB but 2 shard") as caught:
        place_tables(tables, 2, 7 * MIB)
    assert "at least 3 shards" in str(caught.value)
    # Room in total, none in any placement: the planner's reason, in serving words.
    with pytest.raises(PlanError, match="fit on no placement over 2 shard"):
        place_tables(tables, 2, int(10 * MIB))


def test_sharded_export_predicts_as_the_unsharded_quantized_model(trained: Trained,
                                                                  tmp_path: Path) -> None:
    one = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8"))
    sizes = {r["table"]: -(-int(r["bytes"]) // CACHE_LINE) * CACHE_LINE
             for r in one.table_report}
    cap = max(sizes.values())  # the largest table fills a shard alone
    three = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8", num_shards=3,
                                                            device_memory_bytes=cap))
    largest = max(sizes, key=lambda t: sizes[t])
    assert all(s["bytes"] <= cap for s in three.plan.shards)
    assert [s["tables"] for s in three.plan.shards
            if largest in s["tables"]] == [[largest]]
    write_artifact(three, tmp_path / "export")
    saved = ServingPlan.load(tmp_path / "export" / "serving_plan.json")
    assert saved.shards == three.plan.shards
    assert saved.extra["placement"]["summary"]["world_size"] == 3
    serving = load_artifact(tmp_path / "export")
    batch = next(iter(BatchLoader.for_scoring(trained.dataset.path, "test", 150,
                                              num_workers=0).epoch(0)))
    expected = one.model(*batch_inputs(batch, one.model.input_features))
    got = serving.score(*batch_inputs(batch, serving.contract["order"]))
    torch.testing.assert_close(got, expected)


def test_measured_figures_price_the_serving_lookups() -> None:
    from ctrctl.distributed.planner import Topology

    measured = Topology.preset("cpu", 4, kernel_fwd_bw={"64": 1e9}, reserved_fraction=0.5)
    serving = serving_topology(2, 3 * MIB, base=measured)
    assert (serving.world_size, serving.ddr_available) == (2, 3 * MIB)
    assert serving.kernel_fwd_bw == {"64": 1e9}
    tables = [QuantTableSpec(f"t{i}", 10_000, 64, "int8") for i in range(3)]
    slow = place_tables(tables, 2, 3 * MIB, topology=measured)
    fast = place_tables(tables, 2, 3 * MIB)  # the cpu preset: 51 GiB/s
    lookup = [max(r["fwd_compute"] for r in p.extra["placement"]["shards"])
              for p in (slow, fast)]
    assert lookup[0] > 20 * lookup[1]  # 1 GB/s measured against the preset's 51 GiB/s
