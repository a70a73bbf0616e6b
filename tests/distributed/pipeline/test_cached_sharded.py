"""Cached tables sharded over 2 gloo ranks: each shard's file starts as its block of the
table, trains to the bits of the same table resident, and the prefetch pipeline brings every
row in ahead of the forward."""

from __future__ import annotations

import pytest

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.testing.pipelines import cached_sharded_body

pytestmark = pytest.mark.distributed


MIXED = {"t0": "table_row_wise", "t1": "data_parallel", "t2": "table_wise"}


@pytest.mark.parametrize("plan,kind", [  # the mixed plan and SGD in the fast suite
    pytest.param("row_wise", "exact_rowwise_adagrad", marks=pytest.mark.slow),
    ("row_wise", "exact_sgd"),
    pytest.param("table_wise", "exact_rowwise_adagrad", marks=pytest.mark.slow),
    pytest.param("column_wise", "exact_sgd", marks=pytest.mark.slow),
    (MIXED, "exact_rowwise_adagrad")],
    ids=["row_wise-adagrad", "row_wise-sgd", "table_wise-adagrad", "column_wise-sgd",
         "mixed-adagrad"])
def test_sharded_cached_table_trains_as_resident(plan: object, kind: str) -> None:
    ranks = run_multiprocess(cached_sharded_body, 2, args=(plan, ["base", "prefetch"], 30,
                                                           kind), timeout_s=240)
    for rank, result in enumerate(ranks):
        assert result["base"]["bitwise"] and result["prefetch"]["bitwise"], (rank, result)
        # the cache (a quarter of the rows) kept missing: rows went to disk and came back
        assert sum(r["base"]["unique_misses"] for r in ranks) > 0
        # prefetch: no forward ever waited for a row
        assert result["prefetch"]["forward_misses"] == 0, (rank, result)
    assert sum(r["base"]["forward_misses"] for r in ranks) > 0
    assert sum(r["base"]["shards"] for r in ranks) >= 1
