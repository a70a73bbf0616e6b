"""A remapper split into fixed shards against pure-Python references: one reference remapper
per shard, keys routed by a pure-Python splitmix64."""

from __future__ import annotations

import random

import pytest
import torch

from ctrctl.errors import ConfigError
from ctrctl.modules.collision_shards import (
    ShardedRemapper,
    shard_of,
    shard_owners,
    shard_ranges,
)
from ctrctl.modules.collisions import DEFAULT_ROW, CollisionConfig
from tests.modules.test_collisions import Reference

MASK = 2**64 - 1


def signed(x: int) -> int:
    x &= MASK
    return x - 2**64 if x >= 2**63 else x


def shard_reference(key: int, shards: int) -> int:
    """splitmix64's finaliser on a signed 64-bit key, arithmetic shifts, then modulo."""
    z = signed((key ^ (key >> 30)) * 0xBF58476D1CE4E5B9)
    z = signed((z ^ (z >> 27)) * 0x94D049BB133111EB)
    return (z ^ (z >> 31)) % shards


def test_shard_of_matches_the_reference_and_spreads_keys() -> None:
    rng = random.Random(0)
    keys = [rng.randrange(-2**63, 2**63) for _ in range(2000)] + list(range(-5, 5))
    got = shard_of(torch.tensor(keys), 7).tolist()
    assert got == [shard_reference(k, 7) for k in keys]
    counts = [got.count(s) for s in range(7)]
    assert min(counts) > 0.7 * len(keys) / 7  # near-uniform


def test_ranges_cut_the_non_default_slots() -> None:
    assert shard_ranges(13, 3) == [(1, 5), (5, 9), (9, 13)]
    assert shard_ranges(12, 4) == [(1, 4), (4, 7), (7, 10), (10, 12)]
    with pytest.raises(ConfigError, match="shards"):
        CollisionConfig(capacity=4, shards=4)


@pytest.mark.parametrize("eviction", ["lfu", "lru", "ttl"])
def test_sharded_remapper_matches_one_reference_per_shard(eviction: str) -> None:
    """10,000 random keys over the three evictions (3,400 each), 3 shards evicting alone."""
    config = CollisionConfig(capacity=22, eviction=eviction,  # type: ignore[arg-type]
                             ttl_days=1.0 if eviction == "ttl" else None,
                             admit_min_count=2, shards=3)
    remapper = ShardedRemapper(config)
    references = [Reference(remapper.shard_config(s)) for s in range(3)]
    ranges = remapper.ranges
    rng = random.Random(1)
    pool = [rng.randrange(-2**63, 2**63) for _ in range(90)]
    now, requests = 0.0, 0
    while requests < 3_400:
        now += rng.choice([0.0, 0.25, 0.5])
        keys = [pool[min(int(rng.expovariate(0.05)), len(pool) - 1)]
                for _ in range(rng.choice([1, 4, 9, 16]))]
        requests += len(keys)
        got = remapper.remap(torch.tensor(keys), now=now).tolist()
        routed = [shard_reference(k, 3) for k in keys]
        local = [references[s].remap([k for k, r in zip(keys, routed, strict=True) if r == s],
                                     now) for s in range(3)]
        want = []
        for r in routed:
            slot = local[r].pop(0)
            want.append(DEFAULT_ROW if slot == DEFAULT_ROW else ranges[r][0] + slot - 1)
        assert got == want
    stats = remapper.stats()
    assert stats["evictions"] == sum(r.evictions for r in references) > 0
    assert stats["admissions"] == sum(r.admissions for r in references)
    frozen = remapper.frozen()
    assert torch.equal(frozen(torch.tensor(pool)),
                       remapper.remap(torch.tensor(pool), update=False))


def test_placed_shards_answer_for_their_keys_only() -> None:
    config = CollisionConfig(capacity=13, eviction="lru", shards=3)
    whole, rank0, rank1 = (ShardedRemapper(config) for _ in range(3))
    owners = shard_owners(whole.ranges, [(0, 0, 7), (1, 7, 6)])  # row-wise over 2 ranks
    assert owners == [0, 0, 1]  # the shard starting at row 9 lives on rank 1
    rank0.place(owners, rank=0)
    rank1.place(owners, rank=1)
    assert (rank0.local(), rank1.local()) == ([0, 1], [2])
    assert all(".shards.2." not in k for k in (f".{k}" for k in rank0.state_dict()))
    rng = random.Random(2)
    for _ in range(50):
        keys = torch.tensor([rng.randrange(0, 40) for _ in range(12)])
        want = whole.remap(keys)
        assert torch.equal(rank0.remap(keys) + rank1.remap(keys), want)
    # Column-wise / data-parallel: every rank holds every row, shards go round the holders.
    assert shard_owners(whole.ranges, [(r, 0, 13) for r in range(2)]) == [0, 1, 0]
    # Table-wise: the table's rank holds every shard.
    assert shard_owners(whole.ranges, [(3, 0, 13)]) == [3, 3, 3]


def test_a_state_saved_before_shards_loads_as_one_shard() -> None:
    from ctrctl.modules import EmbeddingBagConfig, ManagedCollisionCollection
    from ctrctl.modules.collisions import CollisionRemapper

    config = CollisionConfig(capacity=9, eviction="lru")
    old = CollisionRemapper(config)  # what a checkpoint of an unsharded remapper held
    old.remap(torch.tensor([5, 6, 7, 5]))
    old.remap(torch.tensor([8]))
    state = {f"remappers.user.{k}": v for k, v in old.state_dict().items()}
    state["reset_seed"] = torch.tensor(3)
    mc = ManagedCollisionCollection({"user": config}, [EmbeddingBagConfig("user", 9, 4, ["user"])])
    mc.load_full_state_dict(state)
    keys = torch.tensor([5, 6, 7, 8, 9])
    assert torch.equal(mc.remappers["user"].remap(keys, update=False),
                       old.remap(keys, update=False))
    assert int(mc.train_steps) == 2 and int(mc.reset_seed) == 3
