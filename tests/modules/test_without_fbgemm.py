"""ctrctl imports and trains where fbgemm_gpu cannot be imported (a GPU box with torch only)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from ctrctl.modules import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingOptimizerConfig
from ctrctl.modules.native.embedding import native_available
from ctrctl.sparse import KeyedJaggedTensor

needs_native = pytest.mark.skipif(not native_available(), reason="the C kernel was not built")

SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    sys.modules["fbgemm_gpu"] = None          # any import of fbgemm_gpu now fails
    if BLOCK_NATIVE:                          # as where the C kernel was not built
        sys.modules["ctrctl.modules.native._embedding_kernel"] = None
    warnings.simplefilter("always")
    import torch
    torch.manual_seed(0)                      # tiny MLPs: an unlucky draw kills every ReLU
    from ctrctl.modules import (DLRM, EmbeddingBagCollection, EmbeddingBagConfig,
                                dlrm_loss)
    from ctrctl.sparse import KeyedJaggedTensor
    from ctrctl.sparse import ops
    assert not ops.use_fbgemm_ops()
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["a", "b"], torch.tensor([1, 2, 3, 4]), torch.tensor([1, 1, 2, 0]))
    assert kjt.permute([1, 0]).values().tolist() == [3, 4, 1, 2]
    ebc = EmbeddingBagCollection([EmbeddingBagConfig("t_a", 10, 4, ["a"]),
                                  EmbeddingBagConfig("t_b", 10, 4, ["b"])])
    assert ebc.backends() == [EXPECTED], ebc.backends()
    model = DLRM(ebc, 3, [8, 4], [8, 1])
    before = ebc.embedding_bag_weights()["t_a"].clone()
    dlrm_loss(model(torch.randn(2, 3), kjt), torch.tensor([0, 1])).backward()
    assert not torch.equal(before, ebc.embedding_bag_weights()["t_a"])
    print("ok")
    """
)


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=needs_native)])
def test_imports_and_trains_without_fbgemm(native: bool) -> None:
    """Without fbgemm_gpu: the native kernel where it was built, plain torch where not."""
    expected = "native" if native else "torch"
    script = f"BLOCK_NATIVE = {not native}\nEXPECTED = {expected!r}\n" + SCRIPT
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
    if not native:
        assert "plain-torch" in result.stderr  # the one-line warning says which kernels run


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_plain_torch_kernel_on_cuda_matches_cpu() -> None:
    configs = [EmbeddingBagConfig("t_a", 50, 8, ["a"]), EmbeddingBagConfig("t_b", 30, 8, ["b"])]
    cfg = EmbeddingOptimizerConfig(kind="exact_rowwise_adagrad", lr=0.1)
    cpu = EmbeddingBagCollection(configs, optimizer=cfg, backend="torch", seed=0)
    gpu = EmbeddingBagCollection(configs, optimizer=cfg, backend="torch", device="cuda", seed=0)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["a", "b"], torch.tensor([1, 1, 7, 3, 3, 0]), torch.tensor([2, 1, 0, 3])
    )
    for ebc, batch in ((cpu, kjt), (gpu, kjt.to("cuda"))):
        out = ebc(batch).values()
        (out * torch.arange(16, device=out.device)).sum().backward()
    for name, w in cpu.embedding_bag_weights().items():
        torch.testing.assert_close(gpu.embedding_bag_weights()[name].cpu(), w)
