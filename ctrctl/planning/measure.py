"""Measure the embedding part of a training step under a plan, on local gloo processes.

The body runs in each rank (``ctrctl.distributed.processes.run_multiprocess``): it builds a
:class:`~ctrctl.distributed.embeddingbag.ShardedEmbeddingBagCollection` for the plan and
times forward, backward with the fused update, and the data-parallel gradient all-reduce,
with fixed-length random bags. Calibration uses it on tiny tables to measure each sharding
type's fixed cost per step; ``scripts/check_plan_estimates.py`` uses it to check estimates.

Example:
    >>> times = run_multiprocess(measure_step_body, 2, args=(tables, plan.to_dict(), 1024, 10))
"""

from __future__ import annotations

import time
from typing import Any

from ctrctl.distributed.types import ShardingPlan


def table_payload(tables: list[Any]) -> list[dict[str, Any]]:
    """Planner :class:`TableSpec` s as plain dicts for the spawned ranks."""
    return [{"name": t.name, "rows": t.num_embeddings, "dim": t.embedding_dim,
             "pooling": t.pooling_factor} for t in tables]


def measure_step_body(rank: int, world_size: int, tables: list[dict[str, Any]],
                  plan_dict: dict[str, Any], batch: int, steps: int) -> float:
    """In each rank: the fastest of ``steps`` embedding steps (forward, backward + fused update,
    data-parallel gradient all-reduce), the slower rank's time per step."""
    import torch
    import torch.distributed as dist

    from ctrctl.distributed.embeddingbag import ShardedEmbeddingBagCollection
    from ctrctl.modules.embedding_configs import EmbeddingBagConfig
    from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
    from ctrctl.sparse.jagged_tensor import KeyedJaggedTensor

    configs = [EmbeddingBagConfig(t["name"], t["rows"], t["dim"], [t["name"]]) for t in tables]
    plan = ShardingPlan.from_dict(plan_dict)
    sebc = ShardedEmbeddingBagCollection(configs, plan.tables,
                                         EmbeddingOptimizerConfig(kind="exact_rowwise_adagrad"))
    dp_params = list(sebc.data_parallel_parameters())
    generator = torch.Generator().manual_seed(rank)

    def batch_kjt() -> KeyedJaggedTensor:
        lengths, values = [], []
        for t in tables:
            pooling = int(round(t["pooling"]))
            lengths.append(torch.full((batch,), pooling, dtype=torch.int64))
            values.append(torch.randint(0, t["rows"], (batch * pooling,), generator=generator))
        return KeyedJaggedTensor.from_lengths_sync(
            [t["name"] for t in tables], torch.cat(values), torch.cat(lengths))

    inputs = [batch_kjt() for _ in range(4)]
    times = []
    for step in range(steps + 3):
        kjt = inputs[step % len(inputs)]
        dist.barrier()
        start = time.perf_counter()
        pooled = sebc(kjt).values()
        pooled.backward(torch.ones_like(pooled))
        for p in dp_params:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                with torch.no_grad():
                    p.sub_(0.01 * p.grad)
                p.grad = None
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if step >= 3:
            times.append(float(elapsed))
    # Other work on the machine only ever adds time: the fastest step is the cleanest.
    return min(times)


def measure_many_body(rank: int, world_size: int,
                      items: list[tuple[list[dict[str, Any]], dict[str, Any], int, int]]
                      ) -> list[float]:
    """:func:`measure_step_body` for several (tables, plan, batch, steps) in one process
    group (spawning ranks once)."""
    return [measure_step_body(rank, world_size, *item) for item in items]
