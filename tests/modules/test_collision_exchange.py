"""The placed ranks' key exchange: each key sent to its shard's rank alone (all-to-all) gives
the slots, evictions, reset rows, statistics and checkpoint of gathering every rank's keys
everywhere (all-gather), with uneven key counts per rank and ranks without keys."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.modules.collision_exchange import RoutedKeys
from ctrctl.testing.collisions import exchange_body

STEPS = 6


def both_exchanges(rank: int, world_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    return (exchange_body(rank, world_size, "all_to_all", STEPS),
            exchange_body(rank, world_size, "all_gather", STEPS))


def route_body(rank: int, world_size: int) -> dict[str, Any]:
    """Rank r sends r + 2 keys of feature 0 (key k to rank k mod W) and none of feature 1
    (rank 0 sends 3); each receiver answers key + 1000 * its rank."""
    first = torch.arange(rank + 2, dtype=torch.int64) + 10 * rank
    second = (torch.arange(3, dtype=torch.int64) + 500 if rank == 0
              else torch.empty(0, dtype=torch.int64))
    now = None if rank == 1 else float(rank)
    routed = RoutedKeys.exchange([first, second], [first % world_size, second % world_size],
                                 now, dist.group.WORLD)
    back = routed.reply([k + 1000 * rank for k in routed.keys])
    return {"keys": routed.keys, "now": routed.now, "back": back}


@pytest.mark.distributed
def test_each_rank_gets_the_keys_sent_to_it_and_its_own_answers_back() -> None:
    world = 3
    results = run_multiprocess(route_body, world)
    for rank, got in enumerate(results):
        # Feature 0: from each sender in rank order, its keys k with k mod 3 == rank.
        want = [k for r in range(world) for k in range(10 * r, 10 * r + r + 2)
                if k % world == rank]
        assert got["keys"][0].tolist() == want
        assert got["keys"][1].tolist() == [k for k in (500, 501, 502) if k % world == rank]
        assert got["now"] == 2.0  # the latest; rank 1 had none
        first = torch.arange(rank + 2) + 10 * rank
        assert torch.equal(got["back"][0], first + 1000 * (first % world))
        assert got["back"][1].numel() == (3 if rank == 0 else 0)


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_all_to_all_exchange_takes_the_all_gather_decisions(world: int) -> None:
    results = run_multiprocess(both_exchanges, world)
    for rank, (routed, gathered) in enumerate(results):
        assert routed["local"] == gathered["local"]
        assert len(routed["local"]["user"]) < 6  # placed: the shards are spread
        for step, (a, b) in enumerate(zip(routed["slots"], gathered["slots"], strict=True)):
            assert torch.equal(a, b), (rank, step)
        for name, weight in gathered["tables"].items():
            assert torch.equal(routed["tables"][name], weight), (rank, name)
        assert routed["stats"] == gathered["stats"]
        assert routed["remapper"].keys() == gathered["remapper"].keys()
        for key, value in gathered["remapper"].items():
            assert torch.equal(routed["remapper"][key], value), (rank, key)
    stats = results[0][0]["stats"]
    # The case is not vacuous: rows were admitted and taken back (lru and ttl) and rows of
    # the tables reset; the eval step found admitted keys.
    assert stats["user"]["evictions"] > 0 and stats["ad"]["evictions"] > 0
    assert stats["user"]["admissions"] > 0
    assert any(int(s.count_nonzero()) for s in results[0][0]["slots"][-1:])
