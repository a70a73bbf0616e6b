"""Golden numerics: every sharding type, sharded on 2, 3 and 4 gloo ranks, equals the unsharded
model on the same global batch (predictions, loss, weights after one step)."""

from __future__ import annotations

import pytest

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.testing.sharding import ALL_TYPES, golden_body, golden_cases


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 3, pytest.param(4, marks=pytest.mark.slow)])
def test_sharded_equals_unsharded(world_size: int) -> None:
    cases = golden_cases(world_size)
    passed = run_multiprocess(golden_body, world_size, args=(cases,), timeout_s=120)
    names = [c.name for c in cases]
    assert all(p == names for p in passed)
    # every type is covered, alone and in mixed plans
    for kind in ALL_TYPES:
        assert any(n.startswith(f"{kind}/") for n in names)
    assert any(n.startswith("mixed") for n in names)
