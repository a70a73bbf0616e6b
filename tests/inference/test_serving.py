"""Quantized serving: sharded == unsharded bitwise, exported == eager bitwise, placement."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ctrctl.compat import fbgemm_available
from ctrctl.data.dataset import BatchLoader
from ctrctl.errors import ConfigError, PlanError
from ctrctl.inference.export import export_program
from ctrctl.inference.predictor import batch_inputs, load_model
from ctrctl.inference.quantize import QuantizeConfig, parse_per_table, quantize_checkpoint
from ctrctl.inference.shard import ServingPlan, place_tables
from ctrctl.modules.quant_embedding import QuantTableSpec

from .conftest import Trained


def _batch(trained: Trained, size: int = 200) -> object:
    return next(iter(BatchLoader.for_scoring(trained.dataset.path, "test", size,
                                             num_workers=0).epoch(0)))


def test_sharded_scores_equal_unsharded_bitwise(trained: Trained) -> None:
    per_table = parse_per_table(["C1=int4", "C2=fp16", "C5=int2"])
    one = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8", per_table=per_table))
    three = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8", per_table=per_table,
                                                           num_shards=3))
    assert [len(s["tables"]) for s in three.plan.shards] != [5, 0, 0]
    assert three.model.input_features != one.model.input_features  # really reordered
    batch = _batch(trained)
    a = one.model(*batch_inputs(batch, one.model.input_features))  # type: ignore[arg-type]
    b = three.model(*batch_inputs(batch, three.model.input_features))  # type: ignore[arg-type]
    assert torch.equal(a, b)
    # ... and they are the trained model's scores, up to the quantization error.
    fp32, _, _ = load_model(trained.run)
    with torch.no_grad():
        reference = torch.sigmoid(fp32(batch.dense, batch.sparse))  # type: ignore[attr-defined]
    assert 0 < float((a - reference).abs().max()) < 0.02


def test_table_report_counts_bytes(trained: Trained) -> None:
    q = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8"))
    row = {r["table"]: r for r in q.table_report}["C5"]
    assert (row["rows"], row["dim"], row["dtype"]) == (200, 8, "int8")
    assert row["fp32_bytes"] == 200 * 8 * 4 and row["bytes"] == 200 * (8 + 4)


@pytest.mark.parametrize("dense_dtype", ["fp32", "bf16"])
def test_exported_program_equals_eager_bitwise(trained: Trained, dense_dtype: str,
                                               tmp_path: Path) -> None:
    q = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int4", num_shards=2,
                                                        dense_dtype=dense_dtype))
    program = export_program(q.model)
    targets = [str(n.target) for n in program.graph.nodes]
    assert not any("auto_functionalized" in t for t in targets)
    if fbgemm_available():
        assert sum("int_nbit_split_embedding_codegen_lookup_function" in t
                   for t in targets) == 2  # one kernel call per shard
    batch = _batch(trained, 37)  # another batch size than the example's
    inputs = batch_inputs(batch, q.model.input_features)  # type: ignore[arg-type]
    eager = q.model(*inputs)
    assert torch.equal(program.module()(*inputs), eager)
    torch.export.save(program, str(tmp_path / "p.pt2"))
    loaded = torch.export.load(str(tmp_path / "p.pt2"))
    assert torch.equal(loaded.module()(*inputs), eager)


def test_int8_dense_runs_eager_and_refuses_export(trained: Trained) -> None:
    q = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8", dense_dtype="int8"))
    fp = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8"))
    batch = _batch(trained)
    inputs = batch_inputs(batch, q.model.input_features)  # type: ignore[arg-type]
    assert float((q.model(*inputs) - fp.model(*inputs)).abs().max()) < 0.02
    with pytest.raises(ConfigError, match="INT8 dense part cannot be exported"):
        export_program(q.model)


def test_placement_respects_the_memory_budget() -> None:
    tables = [QuantTableSpec(f"t{i}", rows, 64, "int8")
              for i, rows in enumerate([9000, 5000, 4000, 3000, 1000, 500])]
    budget = 12100 * 68  # the rows fit in 2 x 12000 rows, with room for block padding
    plan = place_tables(tables, 2, budget)
    assert all(s["bytes"] <= budget for s in plan.shards)
    assert sorted(t for s in plan.shards for t in s["tables"]) == sorted(t.name for t in tables)
    for s in plan.shards:  # the model's order inside a shard
        assert s["tables"] == sorted(s["tables"], key=lambda n: int(n[1:]))
    again = ServingPlan.from_dict(plan.to_dict())
    assert again.shards == plan.shards
    with pytest.raises(PlanError, match="fits on no shard"):
        place_tables(tables, 2, 9000 * 68)
    with pytest.raises(PlanError, match="empty"):
        place_tables(tables[:1], 2)


def test_bad_per_table_is_a_clear_error(trained: Trained) -> None:
    with pytest.raises(ConfigError, match="not NAME=DTYPE"):
        parse_per_table(["C1"])
    with pytest.raises(ConfigError, match="unknown table type"):
        QuantizeConfig(per_table={"C1": "int3"})
    with pytest.raises(ConfigError, match="does not have"):
        quantize_checkpoint(trained.run, QuantizeConfig(per_table={"nope": "int4"}))
