"""Rank bodies for the train pipelines: each pipeline against ``base`` on the same model.

* :func:`exactness_body`: on every rank, train a small DLRM under DMP with ``base`` and
  with each named pipeline from the same initial weights on the same batches; the losses,
  the full tables and the dense weights must be equal (bitwise, or ``assert_close`` where
  the pipeline is allowed to differ). Returns what matched bitwise.
* :func:`semi_sync_body`: ``semi-sync`` against a hand-written lagged loop (the lookup of
  batch i+1 done right after forward(i), before backward(i)), bitwise.
* :func:`uneven_body`: ranks with different numbers of batches all stop after the
  shortest, with no hang.

Example:
    >>> run_multiprocess(exactness_body, 2, args=("table_wise", ["sparse-dist"], 50))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, cast

import torch
from torch import nn

from ctrctl.data.batch import Batch
from ctrctl.distributed import comm
from ctrctl.distributed.checkpoint import gather_table_weights
from ctrctl.distributed.default_plan import forced_plan
from ctrctl.distributed.model_parallel import DistributedModelParallel
from ctrctl.distributed.pipeline import make_pipeline
from ctrctl.distributed.pipeline.sparse_dist import sharded_collections
from ctrctl.modules.cached_embedding import hashed_init_weight
from ctrctl.modules.dlrm import DLRM
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.modules.embedding_modules import EmbeddingBagCollection
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.sparse.jagged_tensor import KeyedJaggedTensor
from ctrctl.sparse.keyed_tensor import KeyedTensor

DIM = 8
DENSE_IN = 3
LOCAL_BATCH = 16


def pipeline_tables() -> list[EmbeddingBagConfig]:
    """Four tables of dim 8: one shared by two features, one mean-pooled, one of 3 rows."""
    return [
        EmbeddingBagConfig("t0", 37, DIM, ("f0",)),
        EmbeddingBagConfig("t1", 50, DIM, ("f1",), pooling="mean"),
        EmbeddingBagConfig("t2", 11, DIM, ("f2", "f3")),
        EmbeddingBagConfig("t3", 3, DIM, ("f4",)),
    ]


def make_dlrm(kind: str = "exact_rowwise_adagrad", seed: int = 7,
              cached_tables: Mapping[str, float] | None = None,
              tables: Sequence[EmbeddingBagConfig] | None = None,
              backend: str = "auto") -> DLRM:
    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(list(tables or pipeline_tables()),
                                 EmbeddingOptimizerConfig(kind=cast(Any, kind), lr=0.05),
                                 seed=seed, cached_tables=cached_tables, backend=backend)
    return DLRM(ebc, DENSE_IN, [16, DIM], [16, 1])


def make_batch(step: int, rank: int, batch: int = LOCAL_BATCH,
               tables: Sequence[EmbeddingBagConfig] | None = None) -> Batch:
    """Rank ``rank``'s batch of step ``step``: random bags of 0-4 ids, repeats allowed."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    keys, lengths, values = [], [], []
    for table in tables or pipeline_tables():
        for f in table.feature_names:
            n = torch.randint(0, 5, (batch,), generator=gen)
            keys.append(f)
            lengths.append(n)
            values.append(torch.randint(0, table.num_embeddings, (int(n.sum()),), generator=gen))
    kjt = KeyedJaggedTensor(keys, torch.cat(values), None, lengths=torch.cat(lengths),
                            stride=batch)
    return Batch(torch.randn(batch, DENSE_IN, generator=gen), kjt,
                 torch.randint(0, 2, (batch,), generator=gen).float())


def _wrap(model: nn.Module, plan_types: str | Mapping[str, str], world_size: int,
          dense_group: bool, tables: Sequence[EmbeddingBagConfig] | None = None
          ) -> DistributedModelParallel:
    tables = list(tables or pipeline_tables())
    plan = forced_plan(tables, world_size, plan_types if isinstance(plan_types, str)
                       else dict(plan_types))
    group = comm.new_group(list(range(world_size))) if dense_group else None
    return DistributedModelParallel(model, plan, dense_process_group=group)


def train_with(name: str, model: nn.Module, batches: Sequence[Batch],
               primed: int | None = None, **kwargs: Any) -> torch.Tensor:
    """Train with pipeline ``name`` over the batches; the per-step losses. ``primed``: how
    many embedding forwards must have taken work the pipeline started ahead."""
    optimizer = torch.optim.SGD([p for p in _dense_parameters(model)], lr=0.05)
    pipeline = make_pipeline(name, model, optimizer, torch.device("cpu"), **kwargs)
    items = iter(list(enumerate(batches)))
    losses, tags = [], []
    while True:
        try:
            out = pipeline.progress(items)
        except StopIteration:
            break
        losses.append(out.loss)
        tags.append(out.tag)
    pipeline.close()
    assert tags == list(range(len(tags))), tags
    if primed is not None:
        assert pipeline.primed_calls() == primed, (name, pipeline.primed_calls(), primed)
    return torch.stack(losses) if losses else torch.zeros(0)


def _dense_parameters(model: nn.Module) -> list[nn.Parameter]:
    if isinstance(model, DistributedModelParallel):
        return list(model.dense_parameters())
    fused = {id(p) for m in model.modules() if isinstance(m, EmbeddingBagCollection)
             for p in m.parameters()}
    return [p for p in model.parameters() if id(p) not in fused]


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    tables = gather_table_weights(model)
    inner = model.unwrapped if isinstance(model, DistributedModelParallel) else model
    dense = {f"dense.{k}": v.detach().clone() for k, v in inner.state_dict().items()
             if not k.startswith("sparse_arch")}
    return {**{f"table.{k}": v for k, v in tables.items()}, **dense}


def compare(name: str, got: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
            where: str) -> bool:
    """assert_close every entry; True when all are bitwise equal."""
    assert got.keys() == want.keys(), (where, sorted(got), sorted(want))
    bitwise = True
    for key in want:
        torch.testing.assert_close(got[key], want[key],
                                   msg=partial(_message, f"{where} {name} {key}"))
        bitwise = bitwise and torch.equal(got[key], want[key])
    return bitwise


def _message(prefix: str, message: str) -> str:
    return f"{prefix}: {message}"


def _given(pooled: KeyedTensor, features: KeyedJaggedTensor) -> KeyedTensor:
    return pooled


def exactness_body(rank: int, world_size: int, plan_types: str | Mapping[str, str],
                   names: Sequence[str], steps: int, kind: str = "exact_rowwise_adagrad",
                   ) -> dict[str, bool]:
    """Each pipeline in ``names`` against ``base``; name -> matched bitwise."""
    where = f"plan {plan_types} rank {rank}/{world_size}"
    batches = [make_batch(s, rank) for s in range(steps)]
    runs = {}
    for name in ["base", *names]:
        model = _wrap(make_dlrm(kind), plan_types, world_size, dense_group=False)
        # sparse-dist and prefetch finish every batch's input dist started a step ahead
        ahead = 0 if name == "base" else steps
        losses = train_with(name, model, batches, primed=ahead)
        assert losses.numel() == steps, (where, name, losses.numel())
        runs[name] = {"loss": losses, **_snapshot(model)}
    return {name: compare(name, runs[name], runs["base"], where) for name in names}


def semi_sync_body(rank: int, world_size: int, plan_types: str | Mapping[str, str],
                   steps: int, start_step: int) -> bool:
    """semi-sync against the lagged reference loop; True when bitwise equal."""
    where = f"semi-sync plan {plan_types} rank {rank}/{world_size}"
    batches = [make_batch(s, rank) for s in range(steps)]
    model = _wrap(make_dlrm(), plan_types, world_size, dense_group=True)
    losses = train_with("semi-sync", model, batches, primed=steps - start_step,
                        start_step=start_step)
    got = {"loss": losses, **_snapshot(model)}

    ref = _wrap(make_dlrm(), plan_types, world_size, dense_group=True)
    sebc = sharded_collections(ref)[0]
    optimizer = torch.optim.SGD(list(ref.dense_parameters()), lr=0.05)
    ahead = None
    ref_losses = []
    for i, batch in enumerate(batches):
        pooled = ahead if ahead is not None else sebc(batch.sparse)
        sebc.forward = partial(_given, pooled)  # type: ignore[method-assign]
        loss = nn.functional.binary_cross_entropy_with_logits(
            ref(batch.dense, batch.sparse).float(), batch.labels)
        del sebc.forward
        # The lag: batch i+1 pools the tables before batch i's update.
        ahead = sebc(batches[i + 1].sparse) if i + 1 < steps and i + 1 >= start_step else None
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        ref_losses.append(loss.detach())
    want = {"loss": torch.stack(ref_losses), **_snapshot(ref)}
    return compare("semi-sync", got, want, where)


def cached_tables_4x() -> list[EmbeddingBagConfig]:
    """t0 (400 rows, two features) is the table to cache: its cache holds a quarter of it."""
    return [EmbeddingBagConfig("t0", 400, DIM, ("f0", "f1")),
            EmbeddingBagConfig("t1", 60, DIM, ("f2",), pooling="mean"),
            EmbeddingBagConfig("t2", 11, DIM, ("f3",))]


def cached_sharded_body(rank: int, world_size: int, plan_types: str | Mapping[str, str],
                        names: Sequence[str], steps: int, kind: str) -> dict[str, Any]:
    """t0 cached (load factor 0.25) and sharded by the plan, trained with each pipeline,
    against the same model with t0 resident (plain-torch kernel, the same initial bits).

    Returns:
        pipeline -> {"bitwise": bool, "forward_misses": this rank's, "unique_misses": ...}.
    """
    where = f"cached t0, plan {plan_types}, rank {rank}/{world_size}"
    tables = cached_tables_4x()
    batches = [make_batch(s, rank, tables=tables) for s in range(steps)]

    def cached_model() -> DLRM:
        return make_dlrm(kind, cached_tables={"t0": 0.25}, tables=tables, backend="torch")

    template = cached_model()
    spec = template.sparse_arch.cached_table_specs()["t0"]
    start = template.sparse_arch.embedding_bag_weights(["t1", "t2"])
    start["t0"] = hashed_init_weight(400, DIM, spec.seed, spec.init_range)
    resident = make_dlrm(kind, tables=tables, backend="torch")
    resident.sparse_arch.load_embedding_bag_weights(start)
    ref = _wrap(resident, plan_types, world_size, False, tables)
    train_with("base", ref, batches)
    want = {"loss": torch.zeros(0), **_snapshot(ref)}
    out: dict[str, Any] = {}
    for name in names:
        model = _wrap(cached_model(), plan_types, world_size, False, tables)
        losses = train_with(name, model, batches)
        counters = [c for m in sharded_collections(model) for c in m.cache_stats().values()]
        got = {"loss": torch.zeros(0), **_snapshot(model)}
        assert losses.numel() == steps
        out[name] = {"bitwise": compare(name, got, want, where),
                     "forward_misses": sum(c["forward_misses"] for c in counters),
                     "unique_misses": sum(c["unique_misses"] for c in counters),
                     "shards": len(counters)}
    return out


def uneven_body(rank: int, world_size: int, name: str, counts: Sequence[int]) -> int:
    """Rank r has ``counts[r]`` batches: every rank must stop after min(counts) steps."""
    model = _wrap(make_dlrm(), "table_wise", world_size, dense_group=name == "semi-sync")
    batches = [make_batch(s, rank) for s in range(counts[rank])]
    kwargs = {"start_step": 0} if name == "semi-sync" else {}
    return int(train_with(name, model, batches, **kwargs).numel())
