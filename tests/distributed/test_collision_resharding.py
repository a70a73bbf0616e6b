"""A zch model trained on 2 ranks, saved, and resumed on 1 and on 4 under other plans takes
the same steps as one process trained straight through; its remapper's 4 shards live on the
ranks holding their rows and reshard with them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.testing.collisions import checkpoint_exists, train_body

FIRST, THEN = [0, 1, 2, 3], [4, 5, 6]
SHARDS = 4  # user: capacity 12, slots 1-3, 4-6, 7-9, 10-11


@pytest.mark.distributed
@pytest.mark.slow
def test_zch_checkpoint_reshards_from_2_to_1_and_4(tmp_path: Path) -> None:
    straight = run_multiprocess(train_body, 1, args=(
        "table_wise", FIRST + THEN, None, None, "sgd", SHARDS))[0]
    saved = run_multiprocess(train_body, 2, args=(
        {"user": "row_wise", "item": "table_wise"}, FIRST, None, str(tmp_path / "ckpt"), "sgd",
        SHARDS))
    # Row-wise over 2 ranks (rows 0-5, 6-11): each rank holds the shards of its rows only.
    assert [r["local_shards"] for r in saved] == [[0, 1], [2, 3]]
    assert not any(".shards.2." in k for k in saved[0]["state_keys"])
    # The shards' owners remap every rank's keys: the same state and steps as one process.
    torch.testing.assert_close(saved[0]["losses"], straight["losses"][:len(FIRST)])
    for key, value in saved[1]["remapper"].items():
        assert torch.equal(value, saved[0]["remapper"][key]), key
    path = saved[0]["path"]
    assert checkpoint_exists(path)
    plans = {1: "row_wise", 4: {"user": "row_wise", "item": "column_wise"}}
    for world, plan in plans.items():
        resumed = run_multiprocess(train_body, world, args=(plan, THEN, path, None, "sgd",
                                                            SHARDS))
        torch.testing.assert_close(resumed[0]["losses"], straight["losses"][len(FIRST):])
        for key, value in straight["remapper"].items():
            assert torch.equal(resumed[-1]["remapper"][key], value), (world, key)
        for name, weight in straight["tables"].items():
            torch.testing.assert_close(resumed[0]["tables"][name], weight)
        if world == 4:  # rows 0-2, 3-5, 6-8, 9-11: the shards starting at 1, 4, 7, 10
            assert [r["local_shards"] for r in resumed] == [[0], [1], [2], [3]]
    counters = [straight["remapper"][f"remappers.user.shards.{s}.stats_counters"]
                for s in range(SHARDS)]
    assert sum(int(c[3]) for c in counters) > 0  # evictions happened


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_zch_data_parallel_table_on_2_ranks_steps_as_on_1(optimizer: str) -> None:
    """A data-parallel zch table (replicas trained by the dense optimizer): every rank's
    replica, and its Adam moments, are reset alike, and 2 ranks take the steps of 1."""
    plan = {"user": "data_parallel", "item": "row_wise"}
    one = run_multiprocess(train_body, 1, args=(plan, FIRST, None, None, optimizer))[0]
    two = run_multiprocess(train_body, 2, args=(plan, FIRST, None, None, optimizer))
    torch.testing.assert_close(two[0]["losses"], one["losses"])
    torch.testing.assert_close(two[1]["tables"]["user"], one["tables"]["user"])
    assert one["remapper"]["remappers.user.shards.0.stats_counters"][3] > 0  # rows were reassigned
