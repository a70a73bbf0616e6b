"""The exact pipelines train as ``base`` does, at world size 2 on gloo, for every sharding
type and a mixed plan; ``semi-sync`` equals a hand-written lagged loop; uneven ranks stop
together."""

from __future__ import annotations

import pytest

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.testing.pipelines import exactness_body, semi_sync_body, uneven_body

MIXED = {"t0": "row_wise", "t1": "column_wise", "t2": "table_wise", "t3": "data_parallel"}
MIXED_NO_DP = {"t0": "row_wise", "t1": "table_column_wise", "t2": "table_wise",
               "t3": "table_row_wise"}
STEPS = 50

pytestmark = pytest.mark.distributed


# table_wise and the mixed plan (row-, column- and table-wise and data parallel at once) run
# in the fast suite, each other type alone in the slow one (the semi-sync test's mixed plan
# has the two-level types).
@pytest.mark.parametrize("plan", [
    "table_wise", *(pytest.param(kind, marks=pytest.mark.slow) for kind in (
        "row_wise", "column_wise", "table_column_wise", "table_row_wise", "data_parallel")),
    MIXED], ids=lambda p: p if isinstance(p, str) else "mixed")
def test_sparse_dist_and_prefetch_equal_base_bitwise(plan: object) -> None:
    results = run_multiprocess(exactness_body, 2, args=(plan, ["sparse-dist", "prefetch"],
                                                        STEPS), timeout_s=240)
    # Bitwise: the same kernels see the same ids and weights in the same order.
    assert results == [{"sparse-dist": True, "prefetch": True}] * 2


@pytest.mark.parametrize("plan", [pytest.param("table_wise", marks=pytest.mark.slow), MIXED_NO_DP],
                         ids=lambda p: p if isinstance(p, str) else "mixed")
def test_semi_sync_equals_lagged_reference_bitwise(plan: object) -> None:
    assert run_multiprocess(semi_sync_body, 2, args=(plan, 30, 5), timeout_s=240) == [True] * 2


@pytest.mark.parametrize("name", ["base", pytest.param("sparse-dist", marks=pytest.mark.slow),
                                  pytest.param("semi-sync", marks=pytest.mark.slow), "prefetch"])
def test_uneven_ranks_stop_together(name: str) -> None:
    # rank 0 has 5 batches, rank 1 has 8: both train 5 steps and return (no hang).
    assert run_multiprocess(uneven_body, 2, args=(name, [5, 8]), timeout_s=120) == [5, 5]
