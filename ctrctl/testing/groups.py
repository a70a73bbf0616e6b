"""Rank bodies about process groups (for tests).

Example:
    >>> run_multiprocess(twrw_group_timeouts_body, 2, local_world_size=1, timeout_s=42)
"""

from __future__ import annotations

import torch.distributed as dist

from ctrctl.distributed import comm
from ctrctl.distributed.default_plan import forced_plan
from ctrctl.distributed.sharding.twrw import TwrwSharding
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.testing.sharding import golden_tables

__all__ = ["twrw_group_timeouts_body"]


def twrw_group_timeouts_body(rank: int, world_size: int, local_world_size: int
                             ) -> dict[str, float]:
    """Seconds of the world's timeout and of the host/cross-host groups table-row-wise makes."""
    tables = golden_tables()
    plan = forced_plan(tables, world_size, "table_row_wise", local_world_size=local_world_size)
    sharding = TwrwSharding(tables, [plan.tables[t.name] for t in tables],
                            EmbeddingOptimizerConfig(kind="exact_sgd", lr=0.1),
                            local_world_size=local_world_size)
    assert sharding.cross_group is not None, "several hosts make cross-host groups"
    return {"world": comm.group_timeout(dist.group.WORLD).total_seconds(),
            "host": comm.group_timeout(sharding.host_group).total_seconds(),
            "cross": comm.group_timeout(sharding.cross_group).total_seconds()}
