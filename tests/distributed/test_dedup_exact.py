"""Deduplicated lookups train exactly as the plain path: gloo, world size 2, 50 steps, for
table-wise, row-wise and mixed plans (sharded.dedup = on against off)."""

from __future__ import annotations

import pytest

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.errors import PlanError
from ctrctl.testing.dedup import DEDUP_CASES, dedup_exactness_body, dedup_modes_body


@pytest.mark.distributed
def test_dedup_equals_plain_over_50_steps() -> None:
    results = run_multiprocess(dedup_exactness_body, 2, args=(DEDUP_CASES, 50), timeout_s=240)
    for per_rank in results:
        assert [r["name"] for r in per_rank] == [c.name for c in DEDUP_CASES]
        for r in per_rank:
            # Every case repeats bags (about half distinct), so the dedup path was taken.
            assert r["mean_distinct_share"] < 0.7
            # The first forward pools the same bags with the same kernels: bitwise.
            assert r["first_forward_bitwise"], r["name"]


@pytest.mark.distributed
def test_dedup_modes_pick_the_groups() -> None:
    flags = run_multiprocess(dedup_modes_body, 2, timeout_s=120)
    # groups run data_parallel, table_wise, row_wise; data_parallel never deduplicates
    for per_rank in flags:
        below, above, on, given = per_rank
        assert below == [False, False, False]   # share ~0.5 is not below 0.05
        assert above == [False, True, True]     # but it is below 0.95
        assert on == [False, True, True]
        assert given == [False, True, True]     # a deduplicated KJT is used as given


def test_unknown_mode_is_one_clear_error() -> None:
    from ctrctl.distributed.embeddingbag import ShardedEmbeddingBagCollection

    sebc = ShardedEmbeddingBagCollection.__new__(ShardedEmbeddingBagCollection)
    with pytest.raises(PlanError, match="unknown dedup mode 'sometimes'"):
        sebc.set_dedup("sometimes")
