"""DistributedModelParallel: shard a model's embedding tables by a plan, DDP for the rest.

Every rank builds the same unsharded model, then wraps it::

    model = DLRM(EmbeddingBagCollection(tables, optimizer), ...)
    dmp = DistributedModelParallel(model, plan)        # plan None: table-wise round robin
    dense_opt = torch.optim.Adagrad(dmp.dense_parameters(), lr=0.01)
    loss = loss_fn(dmp(batch), labels)                 # a mean over this rank's batch
    loss.backward()                                    # tables update here (fused optimizer)
    dense_opt.step(); dense_opt.zero_grad()

Each :class:`~ctrctl.modules.embedding_modules.EmbeddingBagCollection` is replaced by a
:class:`~ctrctl.distributed.embeddingbag.ShardedEmbeddingBagCollection`; the model is then
wrapped in DDP (gloo on CPU, NCCL on CUDA), which averages the dense gradients (data-parallel
tables included) over ranks and ignores the sharded tables. With gradient division (the
default) a step on B samples per rank equals a step of the unsharded model on the W*B samples
of all ranks with the loss averaged over them.

Example:
    >>> dmp = DistributedModelParallel(model, ShardingPlan.load("plan.json"))
    >>> dmp.fused_optimizer.lr = 0.02                  # the tables' learning rate
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ctrctl.distributed.default_plan import default_plan
from ctrctl.distributed.embeddingbag import (
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
)
from ctrctl.distributed.sharding.base import LocalShard
from ctrctl.distributed.types import ShardingPlan
from ctrctl.errors import PlanError
from ctrctl.modules.embedding_modules import EmbeddingBagCollection


def _collections(module: nn.Module) -> list[tuple[str, EmbeddingBagCollection]]:
    """(qualified name, module) of each EmbeddingBagCollection, outermost first."""
    if isinstance(module, EmbeddingBagCollection):
        return [("", module)]
    return [(name, m) for name, m in module.named_modules()
            if isinstance(m, EmbeddingBagCollection)]


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def shard(
    module: nn.Module,
    plan: ShardingPlan | None = None,
    process_group: Any | None = None,
    sharder: EmbeddingBagCollectionSharder | None = None,
) -> nn.Module:
    """Replace the EmbeddingBagCollection(s) in ``module`` by sharded ones; nothing else changes.

    Args:
        module: an EmbeddingBagCollection, or a model holding some.
        plan: the plan (validated against the tables and the world here); None: table-wise
            round robin (:func:`~ctrctl.distributed.default_plan.default_plan`).
        process_group: the ranks to shard over (default: the world).
        sharder: how to shard (default :class:`EmbeddingBagCollectionSharder`).

    Returns:
        The sharded collection when ``module`` is one, else ``module`` with its collections
        replaced in place.

    Example:
        >>> sebc = shard(ebc, plan)
    """
    sharder = sharder or EmbeddingBagCollectionSharder()
    found = _collections(module)
    if not found:
        raise PlanError("the model has no EmbeddingBagCollection to shard",
                        where=type(module).__name__)
    tables = [t for _, ebc in found for t in ebc.embedding_bag_configs()]
    world = dist.get_world_size(process_group)
    if plan is None:
        plan = default_plan(tables, world)
    plan.validate({t.name: (t.num_embeddings, t.embedding_dim) for t in tables}, world)
    for name, ebc in found:
        entries = {t.name: plan.tables[t.name] for t in ebc.embedding_bag_configs()}
        sharded = sharder.shard(ebc, entries, process_group, plan.local_world_size)
        if not name:
            return sharded
        _replace(module, name, sharded)
    return module


class FusedOptimizerView:
    """The embedding optimizer of a sharded model, fused into backward: read and set its lr.

    ``step`` and ``zero_grad`` do nothing (the update happened in backward); they exist so the
    view can sit beside the dense optimizer in a loop that calls both.
    """

    def __init__(self, modules: list[ShardedEmbeddingBagCollection]) -> None:
        self._modules = modules

    @property
    def lr(self) -> float | None:
        for m in self._modules:
            lr = m.get_lr()
            if lr is not None:
                return lr
        return None

    @lr.setter
    def lr(self, value: float) -> None:
        for m in self._modules:
            m.set_lr(value)

    def state(self) -> dict[tuple[str, int, int], dict[str, torch.Tensor]]:
        """(table, row_offset, col_offset) of each local shard -> its state tensors (views)."""
        return {(s.table, s.metadata.row_offset, s.metadata.col_offset): s.optimizer_state
                for m in self._modules for s in m.local_shards()}

    def step(self) -> None:
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None


class DistributedModelParallel(nn.Module):
    """A model with its embedding tables sharded per a plan and its dense part under DDP.

    Args:
        module: the unsharded model, identical on every rank.
        plan: the sharding plan; None: table-wise round robin.
        process_group: the ranks (default: the world; give it a timeout, see
            :func:`ctrctl.distributed.comm.init_process_group`).
        sharder: how collections are sharded.
        ddp: wrap the dense part in DDP (False: the caller averages dense gradients).
        find_unused_parameters: passed to DDP.
        dense_process_group: the group DDP all-reduces dense gradients on (default:
            ``process_group``). A group of its own keeps DDP's collectives apart from the
            embeddings' when those run on another thread (the ``semi-sync`` pipeline).

    Attributes:
        module: the wrapped model (DDP around the sharded model when ``ddp``).
        plan: the plan in use.
        fused_optimizer: a :class:`FusedOptimizerView` of the tables' fused optimizer.

    Example:
        >>> dmp = DistributedModelParallel(model, plan)
        >>> opt = torch.optim.Adagrad(dmp.dense_parameters(), lr=0.01)
    """

    def __init__(
        self,
        module: nn.Module,
        plan: ShardingPlan | None = None,
        process_group: Any | None = None,
        sharder: EmbeddingBagCollectionSharder | None = None,
        ddp: bool = True,
        find_unused_parameters: bool = False,
        dense_process_group: Any | None = None,
    ) -> None:
        super().__init__()
        world = dist.get_world_size(process_group)
        tables = [t for _, ebc in _collections(module) for t in ebc.embedding_bag_configs()]
        self.plan = plan if plan is not None else default_plan(tables, world)
        sharded = shard(module, self.plan, process_group, sharder)
        self.process_group = process_group
        self.dense_process_group = dense_process_group
        self._sharded_modules = [m for m in sharded.modules()
                                 if isinstance(m, ShardedEmbeddingBagCollection)]
        self.fused_optimizer = FusedOptimizerView(self._sharded_modules)
        dense = self._dense_parameter_ids(sharded)
        wrapped: nn.Module = sharded
        if ddp and world > 1 and any(p.requires_grad for p in sharded.parameters()
                                     if id(p) in dense):
            ignore = [name for name, p in sharded.named_parameters() if id(p) not in dense]
            ignore += [name for name, _ in sharded.named_buffers()
                       if any(name.startswith(prefix) for prefix in self._sharded_prefixes(
                           sharded))]
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(sharded, ignore)
            # Buffers are built identically on every rank: no per-step broadcast of them
            # (the one at construction copies equal values).
            wrapped = DistributedDataParallel(sharded, process_group=dense_process_group
                                              if dense_process_group is not None
                                              else process_group,
                                              find_unused_parameters=find_unused_parameters,
                                              forward_sync_buffers=False,
                                              gradient_as_bucket_view=True)
        self.module = wrapped

    @staticmethod
    def _sharded_prefixes(model: nn.Module) -> list[str]:
        if isinstance(model, ShardedEmbeddingBagCollection):
            return [""]
        return [name + "." for name, m in model.named_modules()
                if isinstance(m, ShardedEmbeddingBagCollection)]

    @staticmethod
    def _dense_parameter_ids(model: nn.Module) -> set[int]:
        fused = {id(p) for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection)
                 for lookup in m.fused_lookups() for p in lookup.parameters()}
        return {id(p) for p in model.parameters() if id(p) not in fused}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @property
    def unwrapped(self) -> nn.Module:
        """The sharded model without DDP."""
        inner = self.module
        return inner.module if isinstance(inner, DistributedDataParallel) else inner

    def dense_parameters(self) -> Iterator[nn.Parameter]:
        """What the dense optimizer steps: everything but the fused tables (DP tables too)."""
        dense = self._dense_parameter_ids(self.unwrapped)
        for p in self.unwrapped.parameters():
            if id(p) in dense:
                yield p

    def sharded_modules(self) -> list[ShardedEmbeddingBagCollection]:
        return list(self._sharded_modules)

    def local_shards(self) -> list[LocalShard]:
        """Every table block this rank holds (for checkpoints)."""
        return [s for m in self._sharded_modules for s in m.local_shards()]
