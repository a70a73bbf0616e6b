"""Quantized embedding bags: FBGEMM's inference kernel against the plain-torch reference."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from ctrctl.compat import fbgemm_available
from ctrctl.errors import ConfigError
from ctrctl.modules.quant_embedding import (
    QUANT_DTYPES,
    SPARSE_TYPE_INT,
    QuantEmbeddingBagCollection,
    QuantTableSpec,
    dequantize_rows,
    quantization_error_bound,
    quantize_rows,
    row_bytes,
    to_kernel_layout,
)

needs_fbgemm = pytest.mark.skipif(not fbgemm_available(), reason="needs fbgemm_gpu")


def _tables(dim: int = 16) -> list[QuantTableSpec]:
    return [QuantTableSpec("a", 100, dim, "int8"), QuantTableSpec("b", 50, dim, "int4"),
            QuantTableSpec("c", 30, dim, "int2"), QuantTableSpec("d", 20, dim, "fp16"),
            QuantTableSpec("e", 40, dim, "fp8")]


def _weights(tables: list[QuantTableSpec]) -> dict[str, torch.Tensor]:
    # Rows of different spreads and centres, as trained tables have.
    return {t.name: torch.randn(t.num_embeddings, t.embedding_dim)
            * torch.rand(t.num_embeddings, 1) * 0.1 + torch.randn(t.num_embeddings, 1) * 0.01
            for t in tables}


def _batch(tables: list[QuantTableSpec], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.randint(0, 5, (len(tables) * batch,))
    ids = torch.cat([torch.randint(0, t.num_embeddings, (int(lengths[i * batch:(i + 1) * batch]
                                                             .sum()),))
                     for i, t in enumerate(tables)])
    return ids, torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])


@needs_fbgemm
def test_fbgemm_kernel_equals_reference() -> None:
    tables = _tables()
    weights = _weights(tables)
    fast = QuantEmbeddingBagCollection.from_float(tables, weights, backend="fbgemm")
    slow = QuantEmbeddingBagCollection.from_float(tables, weights, backend="torch")
    assert fast.backend == "fbgemm" and slow.backend == "torch"
    assert torch.equal(fast.weights, slow.weights)  # same bytes from either quantizer
    ids, offsets = _batch(tables, 9)
    torch.testing.assert_close(fast(ids, offsets), slow(ids, offsets))


@needs_fbgemm
def test_bf16_pooling_is_the_fp32_sums_rounded() -> None:
    tables = _tables()
    weights = _weights(tables)
    fast = QuantEmbeddingBagCollection.from_float(tables, weights, backend="fbgemm")
    slow = QuantEmbeddingBagCollection.from_float(tables, weights, backend="torch")
    ids, offsets = _batch(tables, 9)
    fp32 = slow(ids, offsets)
    for module in (fast, slow):
        module.set_output_dtype("bf16")
        pooled = module(ids, offsets)
        assert pooled.dtype == torch.bfloat16
        torch.testing.assert_close(pooled, fp32.to(torch.bfloat16))
    with pytest.raises(ConfigError, match="pooled output type"):
        fast.set_output_dtype("fp16")


@needs_fbgemm
def test_absolute_offsets_select_a_slice_of_the_batch() -> None:
    # The serving model hands each shard a slice of the whole batch's offsets.
    tables = _tables()[:2]
    module = QuantEmbeddingBagCollection.from_float(tables, _weights(tables))
    ids, offsets = _batch(tables + tables, 4)  # 4 features of batch 4: the last two are ours
    sliced = module(ids, offsets[8:])
    alone = module(ids[int(offsets[8]):], offsets[8:] - offsets[8])
    assert torch.equal(sliced, alone)
    assert not torch.equal(sliced, module(ids, offsets[:9]))


@needs_fbgemm
def test_layout_qparams_move_from_the_end_to_the_start() -> None:
    from fbgemm_gpu.split_embedding_configs import SparseType

    w = torch.randn(6, 8)
    op_rows = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(w, 8)  # [q|s|b]
    scale_bias = op_rows[:, -4:].view(torch.float16).float()
    torch.testing.assert_close(scale_bias[:, 1], w.min(dim=1).values.half().float())
    module = QuantEmbeddingBagCollection.from_float([QuantTableSpec("t", 6, 8, "int8")],
                                                    {"t": w})
    [rows] = module.table_rows()
    assert torch.equal(rows, to_kernel_layout(op_rows, "int8"))
    assert torch.equal(rows[:, :4], op_rows[:, -4:])  # scale, bias first in the kernel's rows
    assert torch.equal(rows[:, 4:], op_rows[:, :-4])
    # The kernel's own views agree with ours, offsets and type codes included.
    tbe = module._fbgemm_module()
    tbe.initialize_weights()
    assert tbe.weights_offsets.tolist() == module.weights_offsets.tolist()
    assert tbe.weights_host.numel() == module.weights.numel()
    for name, code in SPARSE_TYPE_INT.items():
        assert SparseType(name).as_int() == code


@needs_fbgemm
def test_fp8_reference_decodes_fbgemm_hfp8() -> None:
    w = torch.randn(20, 16) * torch.logspace(-4, 2, 20)[:, None]
    rows = quantize_rows(w, "fp8", backend="fbgemm")
    theirs = torch.ops.fbgemm.HFP8QuantizedToFloat(rows.view(torch.uint8), 4, 7)
    torch.testing.assert_close(dequantize_rows(rows, "fp8", 16), theirs)


@pytest.mark.parametrize("dtype", QUANT_DTYPES)
def test_dequantized_rows_within_half_a_step(dtype: str) -> None:
    spec = QuantTableSpec("t", 200, 32, dtype)
    w = _weights([spec])["t"]
    module = QuantEmbeddingBagCollection.from_float([spec], {"t": w})
    back = module.dequantized_weights()["t"]
    error, bound = (back - w).abs(), quantization_error_bound(w, dtype)
    assert bool((error <= bound).all()), float((error / bound).max())
    if dtype in ("int8", "int4", "int2"):  # the bound is not so loose that anything passes
        bits = {"int8": 8, "int4": 4, "int2": 2}[dtype]
        step = (w.max(1).values - w.min(1).values) / ((1 << bits) - 1)
        assert float((error / step[:, None]).max()) > 0.4


def test_dequantized_rows_cannot_pass_when_wrong() -> None:
    # A row off by one level is outside the bound.
    spec = QuantTableSpec("t", 10, 16, "int8")
    w = _weights([spec])["t"]
    module = QuantEmbeddingBagCollection.from_float([spec], {"t": w})
    module.table_rows()[0][3, 4] += 1 if int(module.table_rows()[0][3, 4]) < 255 else -1
    error = (module.dequantized_weights()["t"] - w).abs()
    assert not bool((error <= quantization_error_bound(w, "int8")).all())


def test_bytes_at_dim_64() -> None:
    fp32 = 64 * 4
    assert row_bytes(64, "int8") == 68 and row_bytes(64, "int8") / fp32 <= 0.27
    assert row_bytes(64, "int4") == 36 and row_bytes(64, "int4") / fp32 <= 0.15
    tables = [QuantTableSpec(f"t{i}", 1000, 64, "int8") for i in range(3)]
    module = QuantEmbeddingBagCollection(tables, backend="torch")
    assert sum(module.nbytes().values()) == 3 * 1000 * 68
    assert module.weights.numel() <= 3 * 1000 * 68 + 3 * 128  # cache-line padding per table


def test_bad_dtype_or_dim_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown quantized type"):
        QuantTableSpec("t", 10, 16, "int3")
    with pytest.raises(ConfigError, match="multiple of 4"):
        QuantTableSpec("t", 10, 6, "int2")


def test_runs_without_fbgemm() -> None:
    script = textwrap.dedent("""
        import sys, warnings
        sys.modules["fbgemm_gpu"] = None
        warnings.simplefilter("ignore")
        import torch
        from ctrctl.modules.quant_embedding import QuantEmbeddingBagCollection, QuantTableSpec
        t = [QuantTableSpec("a", 10, 8, "int8"), QuantTableSpec("b", 10, 8, "int4")]
        m = QuantEmbeddingBagCollection.from_float(t, {"a": torch.randn(10, 8),
                                                       "b": torch.randn(10, 8)})
        assert m.backend == "torch"
        out = m(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2, 3, 3]))
        assert out.shape == (2, 16)
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"
