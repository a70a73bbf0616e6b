"""DistributedModelParallel: a real EmbeddingBagCollection model, DDP for the dense part,
two steps equal to the unsharded model on the global batch; plan errors are clear."""

from __future__ import annotations

import pytest

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.testing.sharding_dmp import dmp_body

MIXED = {"t0": "row_wise", "t1": "column_wise", "t2": "table_wise", "t3": "data_parallel"}
MIXED2 = {"t0": "table_row_wise", "t1": "table_column_wise", "t2": "data_parallel",
          "t3": "row_wise"}


@pytest.mark.distributed
@pytest.mark.parametrize("world_size,plan", [
    (2, MIXED), pytest.param(3, MIXED2, marks=pytest.mark.slow)])
def test_dmp_matches_unsharded_model(world_size: int, plan: dict[str, str]) -> None:
    # exact_sgd at the dense optimizer's lr: data-parallel tables (dense SGD) and fused
    # tables then follow the same rule as the reference's single EmbeddingBagCollection.
    lrs = run_multiprocess(dmp_body, world_size, args=(plan, "exact_sgd"), timeout_s=120)
    assert lrs == [0.5] * world_size   # the fused optimizer's lr is settable through DMP
