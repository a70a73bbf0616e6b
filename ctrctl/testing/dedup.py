"""Rank body for the dedup exactness test: deduplicated lookups train as the plain ones.

Two sharded collections start from the same weights on every rank, one with ``dedup="off"``,
one with ``dedup="on"``; each trains with a linear head on the same batches (user features
repeated over a user's impressions, few distinct ids elsewhere) for ``steps`` steps. The body
compares each step's loss, and every table's weights and the head at the end.

Example:
    >>> run_multiprocess(dedup_exactness_body, 2, args=(DEDUP_CASES, 50))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ctrctl.distributed.checkpoint import gather_table_weights
from ctrctl.distributed.default_plan import forced_plan
from ctrctl.distributed.embeddingbag import ShardedEmbeddingBagCollection
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.sparse.jagged_tensor import KeyedJaggedTensor
from ctrctl.testing.sharding import (
    DENSE_IN,
    DENSE_LR,
    LR,
    _say,
    golden_tables,
    init_head,
    init_weights,
)


@dataclass(frozen=True)
class DedupCase:
    """A plan (one type for all tables, or table -> type) and the fused optimizer."""

    name: str
    plan: str | Mapping[str, str]
    optimizer: str = "exact_rowwise_adagrad"
    weighted: bool = False


DEDUP_CASES = (
    DedupCase("table_wise", "table_wise"),
    DedupCase("row_wise", "row_wise"),
    DedupCase("mixed", {"t0": "row_wise", "t1": "column_wise", "t2": "table_wise",
                        "t3": "data_parallel"}, "exact_adagrad"),
    DedupCase("mixed-weighted", {"t0": "table_row_wise", "t1": "table_column_wise",
                                 "t2": "row_wise", "t3": "table_wise"}, "exact_sgd",
              weighted=True),
)

#: features repeated per user (the rest draw from a few hot ids)
USER_FEATURES = ("f0", "f1")
USERS_PER_RANK = 3


def repeated_batch(tables: Sequence[EmbeddingBagConfig], batch: int, gen: torch.Generator,
                   weighted: bool) -> tuple[KeyedJaggedTensor, torch.Tensor, torch.Tensor]:
    """One rank's batch: (KJT, dense (B, 3), labels (B,)); each user's bags repeat over its
    ``batch / USERS_PER_RANK`` impressions, other features hold 0-3 of 4 hot ids."""
    user = torch.randint(0, USERS_PER_RANK, (batch,), generator=gen)
    keys, lengths, values, weights = [], [], [], []
    for table in tables:
        for name in table.feature_names:
            keys.append(name)
            if name in USER_FEATURES:
                per_user = [torch.randint(0, table.num_embeddings, (int(n),), generator=gen)
                            for n in torch.randint(1, 4, (USERS_PER_RANK,), generator=gen)]
                bags = [per_user[int(u)] for u in user]
            else:
                hot = torch.randint(0, table.num_embeddings, (4,), generator=gen)
                bags = [hot[torch.randint(0, 4, (int(n),), generator=gen)]
                        for n in torch.randint(0, 4, (batch,), generator=gen)]
            lengths += [b.numel() for b in bags]
            values += bags
            # a bag's weights follow its ids, so repeated bags stay equal
            weights += [0.5 + (b % 3).float() / 4 for b in bags]
    kjt = KeyedJaggedTensor(keys, torch.cat(values),
                            torch.cat(weights) if weighted else None,
                            lengths=torch.tensor(lengths), stride=batch)
    dense = torch.randn(batch, DENSE_IN, generator=gen)
    return kjt, dense, torch.randint(0, 2, (batch,), generator=gen).float()


def _train_side(sebc: ShardedEmbeddingBagCollection, head: torch.nn.Linear,
                kjt: KeyedJaggedTensor, dense: torch.Tensor, labels: torch.Tensor,
                world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One step: (mean loss over ranks, this rank's pooled output)."""
    pooled = sebc(kjt).values()
    logits = head(torch.cat([dense, pooled], dim=1)).squeeze(1)
    loss = F.binary_cross_entropy_with_logits(logits, labels)
    loss.backward()
    with torch.no_grad():
        for p in list(head.parameters()) + list(sebc.data_parallel_parameters()):
            grad = cast(torch.Tensor, p.grad)
            dist.all_reduce(grad)
            p.sub_(DENSE_LR * grad / world)
            p.grad = None
        mean = loss.detach().clone()
        dist.all_reduce(mean)
    return mean / world, pooled.detach()


def run_dedup_case(case: DedupCase, rank: int, world: int, steps: int, batch: int = 12
                   ) -> dict[str, Any]:
    """Train both ways; assert_close on every loss and the final weights. Returns what was
    bitwise equal: the first forward, every loss, the final tables."""
    tables = golden_tables(case.weighted)
    plan = forced_plan(tables, world, case.plan)
    weights = init_weights(tables, 1)
    sides = []
    for mode in ("off", "on"):
        sebc = ShardedEmbeddingBagCollection(
            tables, plan.tables, EmbeddingOptimizerConfig(kind=cast(Any, case.optimizer), lr=LR),
            local_world_size=plan.local_world_size, dedup=mode)
        sebc.load_table_weights(weights)
        with torch.no_grad():
            for shard in sebc.local_shards():
                if shard.replicated:
                    shard.weight.copy_(weights[shard.table])
        sides.append((sebc, init_head(tables, 2)))
    gen = torch.Generator().manual_seed(100 + rank)
    first_bitwise, losses_bitwise = True, True
    shares = []
    for step in range(steps):
        kjt, dense, labels = repeated_batch(tables, batch, gen, case.weighted)
        (loss_off, out_off), (loss_on, out_on) = (
            _train_side(sebc, head, kjt, dense, labels, world) for sebc, head in sides)
        shares.append(cast(float, sides[1][0].last_distinct_share))
        where = f"case {case.name}, rank {rank}, step {step}"
        torch.testing.assert_close(out_on, out_off, msg=_say(f"{where}: pooled: "))
        torch.testing.assert_close(loss_on, loss_off, msg=_say(f"{where}: loss: "))
        if step == 0:
            first_bitwise = bool(torch.equal(out_on, out_off))
        losses_bitwise = losses_bitwise and bool(torch.equal(loss_on, loss_off))
    after_off, after_on = (gather_table_weights(sebc) for sebc, _ in sides)
    tables_bitwise = True
    for name, expected in after_off.items():
        torch.testing.assert_close(after_on[name], expected,
                                   msg=_say(f"case {case.name}: table {name}: "))
        tables_bitwise = tables_bitwise and bool(torch.equal(after_on[name], expected))
    torch.testing.assert_close(sides[1][1].weight, sides[0][1].weight)
    return {"name": case.name, "first_forward_bitwise": first_bitwise,
            "losses_bitwise": losses_bitwise, "tables_bitwise": tables_bitwise,
            "mean_distinct_share": sum(shares) / len(shares)}


def dedup_exactness_body(rank: int, world: int, cases: Sequence[DedupCase], steps: int
                         ) -> list[dict[str, Any]]:
    """Every case in one process group; raises AssertionError naming the first difference."""
    return [run_dedup_case(case, rank, world, steps) for case in cases]


def dedup_modes_body(rank: int, world: int) -> list[list[bool]]:
    """Which groups got the deduplicated batch under auto (below / above the threshold), on,
    off, and for a batch the caller deduplicated; each output checked against ``off``'s."""
    from ctrctl.sparse.dedup import deduplicate

    tables = golden_tables()
    plan = forced_plan(tables, world, {"t0": "row_wise", "t1": "table_wise",
                                       "t2": "table_wise", "t3": "data_parallel"})
    sebc = ShardedEmbeddingBagCollection(tables, plan.tables, EmbeddingOptimizerConfig(lr=LR))
    sebc.load_table_weights(init_weights(tables, 1))
    gen = torch.Generator().manual_seed(7 + rank)
    kjt, _, _ = repeated_batch(tables, 12, gen, weighted=False)
    flags = []
    with torch.no_grad():
        sebc.set_dedup("off")
        expected = sebc(kjt).values()
        for mode, threshold, batch in [("auto", 0.05, kjt), ("auto", 0.95, kjt), ("on", 0.0, kjt),
                                       ("off", 0.0, deduplicate(kjt))]:
            sebc.set_dedup(mode, threshold)
            dist_input = sebc.input_dist(batch)
            flags.append(list(dist_input.deduplicated))
            got = sebc.compute_and_output_dist(dist_input).values()
            torch.testing.assert_close(got, expected, msg=_say(f"{mode}/{threshold}: "))
    return flags
