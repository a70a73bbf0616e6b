"""A data-parallel zch table (a replica trained by the dense optimizer): a reassigned row's
weights AND its dense-optimizer state are reset before its new owner uses it, so no Adam or
Adagrad moment of the evicted id survives (cf. pytorch/torchrec#3030)."""

from __future__ import annotations

from collections.abc import Callable, Collection

import pytest
import torch
from torch import nn

from ctrctl.distributed.sharding.base import LocalShard
from ctrctl.distributed.types import ShardMetadata
from ctrctl.modules import CollisionConfig, EmbeddingBagConfig, ManagedCollisionCollection

CAP, DIM = 6, 4


class Replica(nn.Module):
    """What a data-parallel sharding exposes: the whole table as a dense parameter, shown
    to checkpoints and the remappers as one replicated block (its ``.data``)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(CAP, DIM))

    def local_shards(self, tables: Collection[str] | None = None) -> list[LocalShard]:
        return [LocalShard("user", ShardMetadata(0, 0, 0, CAP, DIM), self.weight.data, {},
                           replicated=True)]


def fresh_state(optimizer: torch.optim.Optimizer, grad: torch.Tensor) -> dict[str, torch.Tensor]:
    """The per-element state a fresh optimizer holds after one step on ``grad`` (a row)."""
    group = optimizer.param_groups[0]
    if isinstance(optimizer, torch.optim.Adam):
        b1, b2 = group["betas"]
        return {"exp_avg": (1 - b1) * grad, "exp_avg_sq": (1 - b2) * grad * grad}
    if isinstance(optimizer, torch.optim.Adagrad):
        return {"sum": group["initial_accumulator_value"] + grad * grad}
    return {"momentum_buffer": grad}


OPTIMIZERS: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "adam": lambda p: torch.optim.Adam(p, lr=0.1),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, initial_accumulator_value=0.25),
    # SGD's momentum buffer starts as the first gradient itself
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_reassigned_rows_lose_the_evicted_ids_dense_optimizer_state(name: str) -> None:
    torch.manual_seed(0)
    table = Replica()
    mc = ManagedCollisionCollection({"user": CollisionConfig(CAP, eviction="lru")},
                                    [EmbeddingBagConfig("user", CAP, DIM, ["user"])])
    optimizer = OPTIMIZERS[name]([table.weight])
    mc.attach_optimizer(optimizer)
    remapper = mc.remappers["user"]

    def train(keys: list[int]) -> torch.Tensor:
        slots = remapper.remap(torch.tensor(keys))
        mc.reset_rows(table)
        loss = (table.weight[slots] * torch.arange(1.0, DIM + 1)).sum() ** 2
        optimizer.zero_grad()
        loss.backward()
        assert table.weight.grad is not None
        grad = table.weight.grad.clone()
        optimizer.step()
        return grad

    old = [10**15 + k for k in range(CAP - 1)]  # fill every slot, train a few steps
    for _ in range(3):
        train(old)
    stale = {k: v.clone() for k, v in optimizer.state[table.weight].items()
             if isinstance(v, torch.Tensor) and v.shape == table.weight.shape}
    assert stale and all(bool((v[1:] != 0).all()) for v in stale.values())
    with torch.no_grad():
        table.weight[1:3] = 0.0  # the #3030 symptom, planted on the rows about to change hands
    weights_before = table.weight.detach().clone()

    # Two newcomers with two of the old owners: the two least recently used (slots 1, 2 after
    # the tie on step) go to the newcomers.
    grad = train([7, 8, *old[2:]])
    moved = sorted(remapper.lookup(torch.tensor([7, 8])).tolist())
    assert moved == [1, 2]
    state = optimizer.state[table.weight]
    want = fresh_state(optimizer, grad[moved])
    for key, value in want.items():  # exactly a fresh optimizer's first step on these rows
        torch.testing.assert_close(state[key][moved], value)
    kept = [3, 4, 5]  # rows that kept their owner carry their accumulated state on
    for key, value in stale.items():
        assert not torch.equal(state[key][kept], fresh_state(optimizer, grad[kept])[key])
        assert not torch.equal(state[key][kept], value[kept])
    assert bool((table.weight[moved].abs().sum(1) > 0).all())  # no all-zero row survives
    assert not torch.equal(table.weight[moved], weights_before[moved])


def test_the_train_pipeline_attaches_its_dense_optimizer() -> None:
    from ctrctl.distributed.pipeline import make_pipeline
    from ctrctl.testing.collisions import zch_dlrm

    model = zch_dlrm(seed=0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    make_pipeline("base", model, optimizer, torch.device("cpu"))
    assert model.collisions is not None
    assert model.collisions.dense_optimizers == [optimizer]
