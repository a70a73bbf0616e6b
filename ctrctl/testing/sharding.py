"""Rank bodies for the sharding tests: sharded vs unsharded numerics, failures, resharding.

The golden check builds a small model (a sharded EmbeddingBagCollection and a linear head over
``cat(dense, pooled)``), runs one training step on each rank's slice of a global batch and
compares, against a plain-torch reference computed on the whole global batch:

* the predictions of each rank's samples,
* the loss (the mean over ranks of each rank's mean loss, what DDP's averaging optimises),
* every table's weights and the head's weights after one optimizer step.

The reference is independent of the code under test: full tables, ``F.embedding_bag``,
autograd, and the fused optimizers' update rules written out (FBGEMM's exact definitions).

Example:
    >>> run_multiprocess(golden_body, world_size=2, args=(golden_cases(2),))
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ctrctl.distributed.checkpoint import gather_table_weights
from ctrctl.distributed.default_plan import forced_plan
from ctrctl.distributed.embeddingbag import ShardedEmbeddingBagCollection
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.names import ShardingType
from ctrctl.sparse.jagged_tensor import KeyedJaggedTensor


def _say(prefix: str) -> Callable[[str], str]:
    """An assert_close message: ``prefix`` then torch's own description."""
    return lambda detail: f"{prefix}{detail}"

DENSE_IN = 3
LR = 0.1
DENSE_LR = 0.05


def golden_tables(weighted: bool = False) -> list[EmbeddingBagConfig]:
    """Four small tables: a shared one (two features), a mean-pooled one, one with 3 rows."""
    mean = "sum" if weighted else "mean"
    return [
        EmbeddingBagConfig("t0", 37, 8, ("f0",)),
        EmbeddingBagConfig("t1", 50, 16, ("f1",), pooling=cast(Any, mean)),
        EmbeddingBagConfig("t2", 11, 8, ("f2", "f3")),
        EmbeddingBagConfig("t3", 3, 4, ("f4",)),
    ]


@dataclass
class GoldenBatch:
    """One rank's slice: lengths (F, B), per-feature ids, weights, dense (B, 3), labels (B,)."""

    lengths: torch.Tensor
    values: list[torch.Tensor]
    weights: list[torch.Tensor] | None
    dense: torch.Tensor
    labels: torch.Tensor

    def kjt(self, keys: Sequence[str]) -> KeyedJaggedTensor:
        return KeyedJaggedTensor(
            list(keys), torch.cat(self.values),
            torch.cat(self.weights) if self.weights is not None else None,
            lengths=self.lengths.reshape(-1), stride=self.lengths.shape[1])


def make_batches(tables: Sequence[EmbeddingBagConfig], batch_per_rank: Sequence[int], seed: int,
                 weighted: bool = False) -> list[GoldenBatch]:
    """Random multi-hot bags (0-4 ids, repeats allowed) for each rank's samples."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for batch in batch_per_rank:
        lengths, values, weights = [], [], []
        for table in tables:
            for _ in table.feature_names:
                n = torch.randint(0, 5, (batch,), generator=gen)
                lengths.append(n)
                ids = torch.randint(0, table.num_embeddings, (int(n.sum()),), generator=gen)
                values.append(ids)
                weights.append(torch.rand(ids.numel(), generator=gen) + 0.5)
        batches.append(GoldenBatch(torch.stack(lengths), values, weights if weighted else None,
                             torch.randn(batch, DENSE_IN, generator=gen),
                             torch.randint(0, 2, (batch,), generator=gen).float()))
    return batches


def init_weights(tables: Sequence[EmbeddingBagConfig], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {t.name: torch.rand(t.num_embeddings, t.embedding_dim, generator=gen) - 0.5
            for t in tables}


def init_head(tables: Sequence[EmbeddingBagConfig], seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    width = DENSE_IN + sum(t.embedding_dim * len(t.feature_names) for t in tables)
    return torch.nn.Linear(width, 1)


# ---- the reference ------------------------------------------------------------------------------
def fused_update(kind: str, weight: torch.Tensor, grad: torch.Tensor, lr: float,
                 eps: float = 1e-8) -> torch.Tensor:
    """One step of FBGEMM's exact optimizers from zero state, rows with no gradient untouched."""
    if kind == "exact_sgd":
        return weight - lr * grad
    if kind == "exact_adagrad":
        return weight - lr * grad / (grad * grad).sqrt().add(eps)
    acc = (grad * grad).mean(dim=1, keepdim=True)                      # (rows, 1)
    return weight - lr * grad / (acc.sqrt() + eps)


def reference_step(
    tables: Sequence[EmbeddingBagConfig], weights: dict[str, torch.Tensor], head: torch.nn.Linear,
    batches: Sequence[GoldenBatch], kind: str, dp_tables: Sequence[str],
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], torch.nn.Linear]:
    """The unsharded model on the global batch: (logits, loss, weights after, head after)."""
    full = {n: w.clone().requires_grad_() for n, w in weights.items()}
    ref_head = copy.deepcopy(head)
    logits_per_rank, losses = [], []
    for batch in batches:
        pooled = []
        f = 0
        for table in tables:
            for _ in table.feature_names:
                offsets = torch.cat([torch.zeros(1, dtype=torch.long),
                                     batch.lengths[f].cumsum(0)])[:-1]
                pooled.append(F.embedding_bag(
                    batch.values[f], full[table.name], offsets, mode=table.pooling,
                    per_sample_weights=batch.weights[f] if batch.weights else None))
                f += 1
        logits = ref_head(torch.cat([batch.dense] + pooled, dim=1)).squeeze(1)
        logits_per_rank.append(logits)
        losses.append(F.binary_cross_entropy_with_logits(logits, batch.labels))
    loss = torch.stack(losses).mean()
    loss.backward()
    after = {}
    with torch.no_grad():
        for name, w in full.items():
            grad = cast(torch.Tensor, w.grad)
            if name in dp_tables:
                after[name] = w - DENSE_LR * grad
            else:
                after[name] = fused_update(kind, w, grad, LR)
        for p in ref_head.parameters():
            p.sub_(DENSE_LR * cast(torch.Tensor, p.grad))
    return torch.cat(logits_per_rank).detach(), loss.detach(), after, ref_head


# ---- the cases --------------------------------------------------------------------------------
@dataclass(frozen=True)
class GoldenCase:
    """One sharded-vs-unsharded comparison."""

    name: str
    plan: str | dict[str, str]
    optimizer: str = "exact_rowwise_adagrad"
    weighted: bool = False
    batch_per_rank: tuple[int, ...] = field(default_factory=tuple)
    local_world_size: int | None = None
    backend: str = "auto"


ALL_TYPES = [t.value for t in ShardingType]
#: Types whose shards split a row's columns: a per-row accumulator differs per block, so
#: rowwise Adagrad is compared with elementwise Adagrad and SGD there (see sharding/cw.py).
COLUMN_SPLIT = (ShardingType.COLUMN_WISE.value, ShardingType.TABLE_COLUMN_WISE.value)


def golden_cases(world_size: int) -> list[GoldenCase]:
    """Every type with rowwise Adagrad (elementwise for column splits) and SGD, mixed plans,
    weighted bags and unequal batches."""
    cases = []
    for kind in ALL_TYPES:
        first = "exact_adagrad" if kind in COLUMN_SPLIT else "exact_rowwise_adagrad"
        cases.append(GoldenCase(f"{kind}/{first}", kind, first))
        cases.append(GoldenCase(f"{kind}/exact_sgd", kind, "exact_sgd"))
    mixed = {"t0": "row_wise", "t1": "column_wise", "t2": "table_wise", "t3": "data_parallel"}
    cases.append(GoldenCase("mixed/exact_adagrad", mixed, "exact_adagrad"))
    mixed2 = {"t0": "table_row_wise", "t1": "table_column_wise", "t2": "row_wise",
              "t3": "table_wise"}
    cases.append(GoldenCase("mixed2/weighted", mixed2, "exact_adagrad", weighted=True))
    cases.append(GoldenCase("row_wise/weighted", "row_wise", weighted=True))
    uneven = tuple(3 + 2 * r for r in range(world_size))
    cases.append(GoldenCase("mixed/unequal-batches", mixed, "exact_adagrad",
                            batch_per_rank=uneven))
    cases.append(GoldenCase("row_wise/unequal-batches", "row_wise",
                            batch_per_rank=uneven))
    mixed3 = {"t0": "row_wise", "t1": "table_wise", "t2": "table_row_wise",
              "t3": "data_parallel"}
    cases.append(GoldenCase("mixed3/plain-torch-kernel", mixed3, "exact_rowwise_adagrad",
                            backend="torch"))
    if world_size % 2 == 0 and world_size > 2:
        # t0 (host 0) and t1 (host 1) row-wise within their host; t2, t3 column blocks
        two_hosts = {"t0": "table_row_wise", "t1": "table_row_wise", "t2": "table_column_wise",
                     "t3": "table_column_wise"}
        cases.append(GoldenCase("two-hosts/table_row_wise+table_column_wise", two_hosts,
                                "exact_adagrad", local_world_size=world_size // 2))
    return cases


def run_golden_case(case: GoldenCase, rank: int, world_size: int, seed: int = 0) -> None:
    """Raise AssertionError (naming the case) when sharded and unsharded numerics differ."""
    tables = golden_tables(case.weighted)
    plan = forced_plan(tables, world_size, case.plan, case.local_world_size)
    dp_tables = [n for n, ps in plan.tables.items()
                 if ps.sharding_type == ShardingType.DATA_PARALLEL.value]
    batch_per_rank = case.batch_per_rank or (6,) * world_size
    batches = make_batches(tables, batch_per_rank, seed, case.weighted)
    weights = init_weights(tables, seed + 1)
    head = init_head(tables, seed + 2)
    ref_logits, ref_loss, ref_weights, ref_head = reference_step(
        tables, weights, head, batches, case.optimizer, dp_tables)

    sebc = ShardedEmbeddingBagCollection(
        tables, plan.tables, EmbeddingOptimizerConfig(kind=cast(Any, case.optimizer), lr=LR),
        backend=case.backend, local_world_size=plan.local_world_size)
    sebc.load_table_weights(weights)
    with torch.no_grad():
        for shard in sebc.local_shards():
            if shard.replicated:              # data-parallel replicas are plain parameters
                shard.weight.copy_(weights[shard.table])
    my_head = torch.nn.Linear(head.in_features, 1)
    my_head.load_state_dict(head.state_dict())
    mine = batches[rank]
    keys = [f for t in tables for f in t.feature_names]
    pooled = sebc(mine.kjt(keys))
    logits = my_head(torch.cat([mine.dense, pooled.values()], dim=1)).squeeze(1)
    loss = F.binary_cross_entropy_with_logits(logits, mine.labels)
    loss.backward()
    dense_params = list(my_head.parameters()) + list(sebc.data_parallel_parameters())
    with torch.no_grad():
        for p in dense_params:   # DDP's averaging, written out
            grad = cast(torch.Tensor, p.grad)
            dist.all_reduce(grad)
            p.sub_(DENSE_LR * grad / world_size)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= world_size
    start = sum(batch_per_rank[:rank])
    where = f"case {case.name} on rank {rank} of {world_size}"
    torch.testing.assert_close(logits.detach(), ref_logits[start:start + len(logits)],
                               msg=_say(f"{where}: predictions differ: "))
    torch.testing.assert_close(mean_loss, ref_loss, msg=_say(f"{where}: loss: "))
    after = gather_table_weights(sebc)
    for name, expected in ref_weights.items():
        torch.testing.assert_close(after[name], expected,
                                   msg=_say(f"{where}: table {name} after step: "))
    torch.testing.assert_close(my_head.weight, ref_head.weight,
                               msg=_say(f"{where}: head after step: "))


def golden_body(rank: int, world_size: int, cases: Sequence[GoldenCase]) -> list[str]:
    """Run every case in one process group; return the names of those that passed."""
    passed = []
    for case in cases:
        run_golden_case(case, rank, world_size)
        passed.append(case.name)
    return passed
