"""The unsharded EmbeddingBagCollection pools a deduplicated batch's distinct bags once and
gives what the plain batch gives (forward bitwise; weights after a step to rounding)."""

from __future__ import annotations

import pytest
import torch

from ctrctl.modules import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingOptimizerConfig
from ctrctl.sparse import KeyedJaggedTensor
from ctrctl.sparse.dedup import deduplicate

CONFIGS = [
    EmbeddingBagConfig("t0", 30, 8, ("user", "item")),            # one table, two features
    EmbeddingBagConfig("t1", 20, 4, ("ctx",), pooling="mean"),
]


def _batch(seed: int, batch: int = 24) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(seed)
    bags = []
    for repeat in (True, False, True):       # user and ctx repeat over 4 users' impressions
        pool = [torch.randint(0, 20, (int(n),), generator=gen)
                for n in torch.randint(0, 4, (4 if repeat else batch,), generator=gen)]
        pick = torch.randint(0, 4, (batch,), generator=gen) if repeat else torch.arange(batch)
        bags += [pool[int(p)] for p in pick]
    return KeyedJaggedTensor(["user", "item", "ctx"], torch.cat(bags),
                             lengths=torch.tensor([b.numel() for b in bags]), stride=batch)


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_distinct_bags_pool_as_the_batch(backend: str) -> None:
    plain, deduped = (EmbeddingBagCollection(CONFIGS, EmbeddingOptimizerConfig(lr=0.1),
                                             backend=backend, seed=4) for _ in range(2))
    for step in range(3):
        kjt = _batch(step)
        d = deduplicate(kjt)
        assert sum(d.stride_per_key()) < 3 * kjt.stride()
        a, b = plain(kjt).values(), deduped(d).values()
        if step == 0:
            assert torch.equal(a, b)             # the same bags, the same kernel: bitwise
        torch.testing.assert_close(b, a)
        target = torch.randn(a.shape, generator=torch.Generator().manual_seed(step))
        (a * target).sum().backward()
        (b * target).sum().backward()
    for name in ("t0", "t1"):
        torch.testing.assert_close(deduped.embedding_bag_weights([name])[name],
                                   plain.embedding_bag_weights([name])[name])
