"""bf16 autocast of DLRM's dense part on CPU: on where the CPU has bf16 units, off elsewhere."""

from __future__ import annotations

import pytest
import torch

from ctrctl import compat
from ctrctl.modules import DLRM, EmbeddingBagCollection, EmbeddingBagConfig, dlrm, dlrm_loss
from ctrctl.sparse import KeyedJaggedTensor


def make_model(autocast: bool) -> DLRM:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        [EmbeddingBagConfig(f"t_{i}", 50, 8, [f"C{i}"]) for i in range(3)], seed=0)
    return DLRM(ebc, 4, [16, 8], [16, 1], dense_autocast=autocast)


def make_batch() -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["C0", "C1", "C2"], torch.randint(0, 50, (3 * 16,), generator=gen),
        torch.ones(3 * 16, dtype=torch.long))
    return torch.rand(16, 4, generator=gen), kjt, torch.randint(0, 2, (16,)).float()


def over_arch_input_dtype(model: DLRM) -> list[torch.dtype]:
    seen: list[torch.dtype] = []
    model.over_arch.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    return seen


@pytest.mark.parametrize("supported", [True, False])
def test_dense_part_runs_in_bf16_only_where_supported(
    supported: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dlrm, "bf16_autocast_supported", lambda device: supported)
    model = make_model(autocast=True)
    seen = over_arch_input_dtype(model)
    dense, kjt, labels = make_batch()
    before = model.sparse_arch.embedding_bag_weights()["t_0"].clone()
    logits = model(dense, kjt)
    assert seen == [torch.bfloat16 if supported else torch.float32]
    assert logits.dtype == torch.float32
    dlrm_loss(logits, labels).backward()
    weights = model.sparse_arch.embedding_bag_weights()["t_0"]
    assert weights.dtype == torch.float32  # embeddings stay fp32 and are updated
    assert not torch.equal(before, weights)
    for p in model.dense_parameters():  # fp32 master weights, fp32 gradients
        assert p.dtype == torch.float32
        assert p.grad is not None and p.grad.dtype == torch.float32


def test_bf16_logits_are_close_to_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dlrm, "bf16_autocast_supported", lambda device: True)
    dense, kjt, _ = make_batch()
    fp32 = make_model(autocast=False)(dense, kjt)
    bf16 = make_model(autocast=True)(dense, kjt)
    # Relaxed on purpose: bf16 keeps 8 bits of mantissa (relative rounding 2^-8 = 0.4%).
    torch.testing.assert_close(bf16, fp32, atol=2e-2, rtol=2e-2)
    assert not torch.equal(bf16, fp32)  # bf16 did run


@pytest.mark.parametrize(("flags", "expected"), [
    ({"avx512f", "amx_bf16", "amx_tile"}, True),
    ({"avx512f", "avx512_bf16"}, True),
    ({"avx2", "avx512f"}, False),
])
def test_bf16_support_from_cpu_flags(flags: set[str], expected: bool,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "_cpu_flags", lambda: frozenset(flags))
    assert compat.bf16_autocast_supported("cpu") is expected
    assert compat.bf16_autocast_supported(torch.device("cuda", 0)) is True
    assert compat.bf16_autocast_supported("meta") is False
