"""FBGEMM's UVM cache (``fused_uvm_caching``): CUDA only; on CPU a clear error names the CPU
tier instead. The CUDA test runs where a GPU and FBGEMM's CUDA build exist."""

from __future__ import annotations

import pytest
import torch

from ctrctl.errors import ConfigError
from ctrctl.modules.batched_embedding import BatchedEmbeddingBag
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.modules.embedding_modules import EmbeddingBagCollection
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.sparse.jagged_tensor import KeyedJaggedTensor


def test_uvm_cache_on_cpu_points_to_the_cpu_tier() -> None:
    pytest.importorskip("fbgemm_gpu")
    with pytest.raises(ConfigError, match="runs on CUDA") as info:
        BatchedEmbeddingBag([(100, 8)], cache_load_factor=0.2)
    assert "fused_cached" in info.value.render()


def _cuda_fbgemm() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import fbgemm_gpu  # noqa: F401

        return hasattr(torch.ops.fbgemm, "lru_cache_populate")
    except (ImportError, AttributeError, RuntimeError):
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_fbgemm(), reason="needs a GPU and FBGEMM's CUDA build")
def test_uvm_cached_table_trains_as_the_resident_one_and_prefetch_fills_the_cache() -> None:
    tables = [EmbeddingBagConfig("t0", 20_000, 16, ("f0",)),
              EmbeddingBagConfig("t1", 100, 16, ("f1",))]
    opt = EmbeddingOptimizerConfig(lr=0.05)
    cuda = torch.device("cuda")
    cached = EmbeddingBagCollection(tables, opt, device=cuda, seed=1,
                                    cached_tables={"t0": 0.05}, backend="fbgemm")
    resident = EmbeddingBagCollection(tables, opt, device=cuda, seed=1, backend="fbgemm")
    resident.load_embedding_bag_weights({k: v.clone() for k, v in
                                         cached.embedding_bag_weights().items()})
    gen = torch.Generator().manual_seed(0)
    for _ in range(10):
        ids = torch.randint(0, 20_000, (512,), generator=gen)
        kjt = KeyedJaggedTensor(["f0", "f1"], torch.cat([ids, ids % 100]).to(cuda),
                                lengths=torch.ones(1024, dtype=torch.long, device=cuda),
                                stride=512)
        cached.prefetch(kjt)
        for ebc in (cached, resident):
            ebc(kjt).values().pow(2).sum().backward()
    for name, weight in resident.embedding_bag_weights().items():
        torch.testing.assert_close(cached.embedding_bag_weights()[name], weight)
    counters = cached.cache_counters()
    assert list(counters) == ["t0"] and counters["t0"]["unique_misses"] > 0
