"""Quantized serving: sharded == unsharded bitwise, exported == eager bitwise, placement."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ctrctl.compat import fbgemm_available
from ctrctl.data.dataset import BatchLoader
from ctrctl.errors import ConfigError, PlanError
from ctrctl.inference.export import export_program
from ctrctl.inference.predictor import batch_inputs
from ctrctl.inference.quantize import QuantizeConfig, parse_per_table, quantize_checkpoint
from ctrctl.inference.shard import ServingPlan, place_tables
from ctrctl.models.scoring import load_model
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


@pytest.mark.parametrize("dense_dtype", ["fp32", "bf16", "int8"])
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


@pytest.mark.parametrize("dense_dtype", ["bf16", "int8"])
def test_reduced_dense_stays_close_to_fp32(trained: Trained, dense_dtype: str) -> None:
    q = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8", dense_dtype=dense_dtype))
    fp = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8"))
    inputs = batch_inputs(_batch(trained), q.model.input_features)  # type: ignore[arg-type]
    difference = float((q.model(*inputs) - fp.model(*inputs)).abs().max())
    assert 0 < difference < 0.02


def test_int8_linear_matches_its_definition() -> None:
    from ctrctl.inference.sharded_dlrm import Int8DynamicLinear

    linear = torch.nn.Linear(24, 10)
    layer = Int8DynamicLinear(linear)
    x = torch.randn(7, 24)
    s_x = x.abs().amax(1, keepdim=True) / 127
    s_w = linear.weight.abs().amax(1) / 127
    q_x = torch.round(x / s_x).clamp(-127, 127)
    q_w = torch.round(linear.weight / s_w[:, None]).clamp(-127, 127)
    expected = (q_x @ q_w.t()) * s_x * s_w + linear.bias
    torch.testing.assert_close(layer(x), expected.detach())
    # Against FP32: within the INT8 rounding of weights and inputs (~1% of the values).
    torch.testing.assert_close(layer(x), linear(x).detach(), atol=0.05, rtol=0.05)


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


def test_bf16_interaction_is_the_interaction_on_bf16_inputs() -> None:
    from ctrctl.inference.sharded_dlrm import bf16_dot_interaction
    from ctrctl.modules.interaction import DotInteraction

    interaction = DotInteraction(26, pad_to=8)
    dense = torch.randn(37, 16).bfloat16()
    sparse = torch.randn(37, 26, 16).bfloat16()
    mine = bf16_dot_interaction(interaction, dense, sparse)
    assert mine.dtype == torch.bfloat16 and mine.shape == (37, interaction.output_dim(16))
    assert torch.equal(mine, interaction(dense, sparse))


def test_fused_linear_equals_linear_and_relu() -> None:
    from ctrctl.inference.sharded_dlrm import FusedLinear, fused_linear_available

    if not fused_linear_available():
        pytest.skip("this torch has no oneDNN bfloat16 linear")
    linear = torch.nn.Linear(40, 24).bfloat16()
    x = torch.randn(37, 40).bfloat16()
    with torch.no_grad():
        torch.testing.assert_close(FusedLinear(linear, relu=True)(x), torch.relu(linear(x)))
        torch.testing.assert_close(FusedLinear(linear, relu=False)(x), linear(x))
        assert (FusedLinear(linear, relu=True)(x) >= 0).all()


def test_bf16_serving_runs_fused_layers_and_exports_them(trained: Trained, tmp_path: Path
                                                         ) -> None:
    from ctrctl.inference.export import load_artifact, write_artifact
    from ctrctl.inference.sharded_dlrm import FusedLinear, fused_linear_available

    if not fused_linear_available():
        pytest.skip("this torch has no oneDNN bfloat16 linear")
    q = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8", dense_dtype="bf16"))
    layers = [m for m in q.model.modules() if isinstance(m, torch.nn.Linear | FusedLinear)]
    assert layers and all(isinstance(m, FusedLinear) for m in layers)
    assert not any(isinstance(m, torch.nn.ReLU) for m in q.model.modules())  # absorbed
    # The same scores as the layers unfused, within bfloat16 rounding.
    unfused = quantize_checkpoint(trained.run, QuantizeConfig(dtype="int8", dense_dtype="bf16"))
    for part in (unfused.model.dense_arch, unfused.model.over_arch):
        for name, child in part.named_children():  # back to Linear + ReLU
            if isinstance(child, torch.nn.Sequential):
                plain: list[torch.nn.Module] = []
                for layer in child:
                    linear = torch.nn.Linear(layer.weight.shape[1], layer.weight.shape[0],
                                             dtype=torch.bfloat16)
                    linear.load_state_dict({"weight": layer.weight, "bias": layer.bias})
                    plain += [linear] + ([torch.nn.ReLU()] if layer.activation == "relu"
                                         else [])
                setattr(part, name, torch.nn.Sequential(*plain))
    inputs = batch_inputs(_batch(trained), q.model.input_features)  # type: ignore[arg-type]
    with torch.no_grad():
        torch.testing.assert_close(q.model(*inputs), unfused.model(*inputs))
    # The artifact's program calls oneDNN's op and scores as the eager model, bitwise.
    folder = write_artifact(q, tmp_path / "export", dataset=trained.dataset.path)
    program = torch.export.load(str(folder / "program.pt2"))
    assert any("_linear_pointwise" in str(n.target) for n in program.graph.nodes)
    assert torch.equal(load_artifact(folder).score(*inputs), q.model(*inputs))
