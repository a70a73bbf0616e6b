"""The remappers of a model's managed-collision tables, applied to a KJT before the lookup.

::

    KJT (raw keys for zch features) --ManagedCollisionCollection--> KJT (slots) --EBC--> pooled
                                     + rows given to new owners re-initialised (weights, and
                                       optimizer state zeroed) in whatever holds them

The collection runs before the embedding collection and before any input distribution, so
it works the same for every sharding type: the rows it resets are written wherever they
live (an unsharded collection's tables, or each shard a rank holds: table-wise, row-wise,
column-wise, data-parallel, cached), their fused optimizer state zeroed, and the state
that an attached dense optimizer keeps for a data-parallel replica's rows reset
(:meth:`ManagedCollisionCollection.attach_optimizer`).

Each table's remapper is split into fixed shards (:mod:`ctrctl.modules.collision_shards`).
Placed over several ranks (:meth:`ManagedCollisionCollection.place`, from the sharding
plan), each rank keeps the shards whose first row it holds; every step each rank sends each
of its keys to the rank holding the key's shard, which remaps it, and the slot comes back
(two all-to-alls over ``process_group``: :mod:`ctrctl.modules.collision_exchange`). The state depends only on the multiset of a step's keys (not their order) and on
the number of shards, never the world size, so a world-2 run and a world-1 run over the same
global batches agree, and a checkpoint (:meth:`full_state_dict`) reshards on load
(:meth:`load_full_state_dict`).

Example:
    >>> mc = ManagedCollisionCollection(
    ...     {"user": CollisionConfig(capacity=100_000, eviction="lru")}, tables=ebc_configs)
    >>> kjt = mc(kjt, ebc)          # user's raw keys -> slots; evicted rows reset in ebc
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

import torch
from torch import nn

from ctrctl.errors import CheckpointError, ConfigError
from ctrctl.modules.collision_exchange import RoutedKeys
from ctrctl.modules.collision_shards import ShardedRemapper, shard_owners
from ctrctl.modules.collisions import CollisionConfig
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.sparse import KeyedJaggedTensor


class ManagedCollisionCollection(nn.Module):
    """One :class:`CollisionRemapper` per managed-collision table.

    Args:
        collisions: table name -> its collision config (capacity = the table's rows).
        tables: every table's config (features, rows, dims and init ranges come from here).
        seed: seed of the re-initialisation of reassigned rows (with the table name and step,
            so every rank draws the same rows); kept in the state dict.
        process_group: training with several ranks: the group that exchanges the keys.

    The remappers update in training mode (``model.train()``) and only look up in eval mode.
    """

    def __init__(self, collisions: Mapping[str, CollisionConfig],
                 tables: Sequence[EmbeddingBagConfig], seed: int = 0,
                 process_group: Any | None = None) -> None:
        super().__init__()
        by_name = {t.name: t for t in tables}
        unknown = sorted(set(collisions) - set(by_name))
        if unknown:
            raise ConfigError(f"collision configs name unknown tables {unknown}",
                              where="ManagedCollisionCollection")
        for name, config in collisions.items():
            if config.capacity != by_name[name].num_embeddings:
                raise ConfigError(
                    f"table {name!r} has {by_name[name].num_embeddings} rows but its "
                    f"collision capacity is {config.capacity}",
                    where="ManagedCollisionCollection", hint="size the table by the capacity")
        self.remappers = nn.ModuleDict({n: ShardedRemapper(c) for n, c in collisions.items()})
        self._tables = {n: by_name[n] for n in collisions}
        self._table_of = {f: t.name for t in tables if t.name in collisions
                          for f in t.feature_names}
        # A buffer, so that a resumed model re-draws rows as the saved one would have.
        self.reset_seed: torch.Tensor
        self.register_buffer("reset_seed", torch.tensor(seed, dtype=torch.int64))
        # Training steps taken, the same on every rank: it seeds each step's re-draw.
        self.train_steps: torch.Tensor
        self.register_buffer("train_steps", torch.zeros((), dtype=torch.int64))
        self.process_group = process_group
        #: True once :meth:`place` spread the remapper shards over the group's ranks.
        self.placed = False
        #: The data time (days) of the coming training step; ttl tables need it.
        self.now: float | None = None
        #: Optimizers that step tables outside the fused kernels (a data-parallel table's
        #: replica is a dense parameter): their state of reassigned rows is reset too.
        self.dense_optimizers: list[torch.optim.Optimizer] = []
        #: How placed ranks exchange a step's keys: ``all_to_all`` sends each key to its
        #: shard's rank alone; ``all_gather`` (the former exchange, kept to compare with)
        #: gathers every rank's keys everywhere and sums the slots. Same slots, same state.
        self.exchange: Literal["all_to_all", "all_gather"] = "all_to_all"

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Reset ``optimizer``'s state of reassigned rows as well (a train pipeline attaches
        its dense optimizer, which steps data-parallel tables)."""
        if all(o is not optimizer for o in self.dense_optimizers):
            self.dense_optimizers.append(optimizer)

    def place(self, blocks: Mapping[str, Sequence[tuple[int, int, int]]], rank: int) -> None:
        """Keep only the remapper shards this rank owns: those whose first row it holds.

        Args:
            blocks: per managed table, its blocks as ``(rank, row_offset, rows)`` (a
                sharding plan's shards); a table missing here keeps every shard.
            rank: this rank in :attr:`process_group`.
        """
        for name, module in self.remappers.items():
            assert isinstance(module, ShardedRemapper)
            if name in blocks:
                module.place(shard_owners(module.ranges, blocks[name]), rank)
        self.placed = True

    def table_features(self) -> dict[str, str]:
        """Feature -> its managed-collision table."""
        return dict(self._table_of)

    def features(self) -> list[str]:
        """The KJT keys whose values are raw keys."""
        return list(self._table_of)

    def forward(self, features: KeyedJaggedTensor, tables: nn.Module | None = None,
                now: float | None = None) -> KeyedJaggedTensor:
        """``features`` with every managed feature's raw keys replaced by slots.

        Args:
            features: the batch (other features pass through unchanged).
            tables: the embedding collection (or its sharded form) whose rows the remappers
                serve; in training, rows given to new owners are reset there.
            now: the step's data time in days (default :attr:`now`).
        """
        keys = features.keys()
        managed = [i for i, k in enumerate(keys) if k in self._table_of]
        if not managed:
            return features
        update = self.training
        now = self.now if now is None else now
        values = features.values()
        bounds = features.offset_per_key()
        if self.placed and self.exchange == "all_to_all" and _world(self.process_group) > 1:
            new_values = self._remap_routed(features, managed, now, update)
            return self._finish(features, new_values, tables, update)
        gathered = None
        if update or self.placed:  # placed: a key's shard may be held by another rank
            gathered, now = self._gather(values, features.length_per_key(), now)
        new_values = values.clone()
        if gathered is None:
            for i in managed:
                local = values[bounds[i]:bounds[i + 1]]
                new_values[bounds[i]:bounds[i + 1]] = self._remapper(keys[i]).remap(
                    local, now, update)
        else:
            # Every rank remaps every rank's keys in the shards it holds (0 elsewhere);
            # placed, each key's shard is on one rank, and a sum gives every rank the slots.
            slots = [self._remapper(keys[i]).remap(torch.cat(gathered[i]), now, update)
                     for i in managed]
            joined = torch.cat(slots)
            if self.placed:
                _all_reduce(joined, self.process_group)
            rank = _rank(self.process_group)
            for i, part in zip(managed, joined.split([t.numel() for t in slots]), strict=True):
                start = sum(p.numel() for p in gathered[i][:rank])
                new_values[bounds[i]:bounds[i + 1]] = part[start:start + bounds[i + 1]
                                                           - bounds[i]]
        return self._finish(features, new_values, tables, update)

    def _finish(self, features: KeyedJaggedTensor, new_values: torch.Tensor,
                tables: nn.Module | None, update: bool) -> KeyedJaggedTensor:
        """Count the step, reset reassigned rows, and return ``features`` on ``new_values``."""
        if update:
            self.train_steps += 1
            if tables is not None:
                self.reset_rows(tables)
        return KeyedJaggedTensor(
            keys=features.keys(), values=new_values, weights=features.weights_or_none(),
            lengths=features.lengths(), offsets=features.offsets(), stride=features.stride(),
            length_per_key=features.length_per_key(), offset_per_key=features.offset_per_key())

    def _remap_routed(self, features: KeyedJaggedTensor, managed: list[int],
                      now: float | None, update: bool) -> torch.Tensor:
        """``features``' values with the managed keys replaced by slots: each key sent to
        its shard's rank, remapped there (every shard held here steps, key or not), and its
        slot sent back."""
        keys, values = features.keys(), features.values()
        bounds = features.offset_per_key()
        own = [values[bounds[i]:bounds[i + 1]] for i in managed]
        routed = RoutedKeys.exchange(
            own, [self._remapper(keys[i]).owner_of(k) for i, k in zip(managed, own,
                                                                       strict=True)],
            now, self.process_group)
        slots = [self._remapper(keys[i]).remap(k, routed.now, update)
                 for i, k in zip(managed, routed.keys, strict=True)]
        new_values = values.clone()
        for i, part in zip(managed, routed.reply(slots), strict=True):
            new_values[bounds[i]:bounds[i + 1]] = part
        return new_values

    def _remapper(self, feature: str) -> ShardedRemapper:
        remapper = self.remappers[self._table_of[feature]]
        assert isinstance(remapper, ShardedRemapper)
        return remapper

    def _gather(self, values: torch.Tensor, length_per_key: list[int], now: float | None
                ) -> tuple[list[list[torch.Tensor]] | None, float | None]:
        """Per feature, every rank's keys in rank order (None on one process), and the
        step's data time: the latest of the ranks' ``now`` (None where no rank has one)."""
        group = self.process_group
        if group is None:
            return None, now
        import torch.distributed as dist

        world = dist.get_world_size(group)
        if world == 1:
            return None, now
        # The rank's data time rides with its lengths as the bits of a float64 (one gather).
        stamp = torch.tensor([-math.inf if now is None else now], dtype=torch.float64)
        lengths = torch.cat([torch.tensor(length_per_key, dtype=torch.int64),
                             stamp.view(torch.int64)]).to(values.device)
        all_lengths = [torch.empty_like(lengths) for _ in range(world)]
        dist.all_gather(all_lengths, lengths, group=group)
        latest = max(float(t[-1:].cpu().view(torch.float64)) for t in all_lengths)
        now = None if latest == -math.inf else latest
        all_lengths = [t[:-1] for t in all_lengths]
        longest = max(int(t.sum()) for t in all_lengths)
        padded = torch.zeros(longest, dtype=torch.int64, device=values.device)
        padded[: values.numel()] = values
        all_values = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(all_values, padded, group=group)
        out: list[list[torch.Tensor]] = [[] for _ in length_per_key]
        for rank_lengths, rank_values in zip(all_lengths, all_values, strict=True):
            start = 0
            for f, n in enumerate(rank_lengths.tolist()):
                out[f].append(rank_values[start:start + n])
                start += n
        return out, now

    # ---- resetting reassigned rows ------------------------------------------------------

    @torch.no_grad()
    def reset_rows(self, tables: nn.Module) -> dict[str, int]:
        """Re-initialise the rows given to new owners since the last call, and zero their
        optimizer state, wherever ``tables`` holds them; returns rows reset per table."""
        done: dict[str, int] = {}
        for name, module in self.remappers.items():
            assert isinstance(module, ShardedRemapper)
            slots = module.take_reassigned()
            if self.placed:  # the shards' owners tell every holder of the rows
                slots = _all_gather_varlen(slots, self.process_group, self.reset_seed.device)
            slots = torch.unique(slots)  # ascending: the draw below is the same everywhere
            if slots.numel() == 0:
                continue
            config = self._tables[name]
            generator = torch.Generator().manual_seed(
                int(self.reset_seed) * 1_000_003 + zlib.crc32(name.encode()) * 7919
                + int(self.train_steps))
            low, high = config.init_range
            fresh = torch.empty(slots.numel(), config.embedding_dim).uniform_(
                low, high, generator=generator)  # (n, D), the same on every rank
            for row0, col0, weight, state in _blocks(tables, name):
                inside = (slots >= row0) & (slots < row0 + weight.size(0))
                rows = slots[inside] - row0
                if rows.numel() == 0:
                    continue
                cols = slice(col0, col0 + weight.size(1))
                weight[rows.to(weight.device)] = fresh[inside.cpu()][:, cols].to(
                    weight.device, weight.dtype)
                for tensor in state.values():
                    tensor[rows.to(tensor.device)] = 0
                for tensor, value in _dense_optimizer_state(self.dense_optimizers, weight):
                    tensor[rows.to(tensor.device)] = value
            done[name] = slots.numel()
        return done

    def stats(self) -> dict[str, dict[str, float]]:
        """Per table, its remapper's statistics (see :meth:`CollisionRemapper.stats`).
        Placed over several ranks, the shards' counters are summed over the group: every
        rank must call this together."""
        names = list(self.remappers)
        counters = [cast(ShardedRemapper, self.remappers[n]).counters() for n in names]
        if self.placed and counters:
            joined = torch.stack(counters).to(self.reset_seed.device)
            _all_reduce(joined, self.process_group)
            counters = list(joined.cpu().unbind(0))
        return {n: cast(ShardedRemapper, self.remappers[n]).stats(c)
                for n, c in zip(names, counters, strict=True)}

    # ---- checkpoints: the whole state, whichever ranks hold its shards -----------------

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The state dict of every shard, wherever held (every rank must call this together
        once placed): what a checkpoint saves, loadable under any world size or plan."""
        state = {k: v.detach().cpu() for k, v in self.state_dict().items()}
        if not self.placed or _world(self.process_group) == 1:
            return state
        import torch.distributed as dist

        parts: list[dict[str, torch.Tensor] | None] = [None] * _world(self.process_group)
        dist.all_gather_object(parts, state, group=self.process_group)
        merged: dict[str, torch.Tensor] = {}
        for part in reversed(parts):  # rank 0's copy of the replicated buffers wins
            assert part is not None
            merged.update(part)
        return dict(sorted(merged.items()))

    def load_full_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load a :meth:`full_state_dict`: the shards held here take theirs, the others'
        are checked and left (that is how the state reshards).

        Raises:
            CheckpointError: a key of the shards held here is missing, or one names no
                shard of this model (saved with other tables or another ``shards``).
        """
        state = self._from_unsharded(state)
        own = self.state_dict()
        known = {f"remappers.{n}.shards.{s}." for n, m in self.remappers.items()
                 for s in range(cast(ShardedRemapper, m).config.shards)}
        missing = sorted(set(own) - set(state))
        unknown = sorted(k for k in state if k not in own
                         and not any(k.startswith(p) for p in known))
        if missing or unknown:
            raise CheckpointError(
                f"the managed-collision state does not fit the model (missing "
                f"{missing[:3]}, unexpected {unknown[:3]})", where="ManagedCollisionCollection",
                hint="load it into a model built from the checkpoint's own dataset and config")
        self.load_state_dict({k: state[k] for k in own})

    def _from_unsharded(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A state saved before remappers had shards (``remappers.<table>.<buffer>``) as the
        one shard of a ``shards: 1`` table; the step count then comes from that remapper."""
        out = dict(state)
        for name, module in self.remappers.items():
            old = f"remappers.{name}."
            if cast(ShardedRemapper, module).config.shards != 1 or f"{old}step" not in out:
                continue
            for key in [k for k in out if k.startswith(old) and ".shards." not in k]:
                out[f"{old}shards.0.{key[len(old):]}"] = out.pop(key)
            out.setdefault("train_steps", out[f"{old}shards.0.step"].clone())
        return out


def _rank(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_rank(group)


def _world(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group) if group is not None else 1


def _all_reduce(tensor: torch.Tensor, group: Any) -> None:
    """Sum ``tensor`` over ``group`` in place."""
    import torch.distributed as dist

    dist.all_reduce(tensor, group=group)


def _all_gather_varlen(tensor: torch.Tensor, group: Any, device: torch.device) -> torch.Tensor:
    """Every rank's 1-D int64 ``tensor`` (lengths may differ), concatenated in rank order;
    sent from ``device`` (the group's backend's)."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    size = torch.tensor([tensor.numel()], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    counts = [int(t) for t in sizes]
    padded = torch.zeros(max(counts), dtype=torch.int64, device=device)
    padded[:tensor.numel()] = tensor.to(device)
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[:n] for p, n in zip(parts, counts, strict=True)])


def _dense_optimizer_state(optimizers: Sequence[torch.optim.Optimizer], weight: torch.Tensor
                           ) -> list[tuple[torch.Tensor, float]]:
    """(state tensor, its fresh value) of every per-element state the ``optimizers`` keep for
    the parameter whose storage ``weight`` is (Adam's moments, Adagrad's sums, momentum
    buffers); scalars such as Adam's step count are shared by all rows and kept."""
    out: list[tuple[torch.Tensor, float]] = []
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for param in group["params"]:
                if (param.shape != weight.shape
                        or param.data_ptr() != weight.data_ptr()):
                    continue
                # Adagrad starts its sums at initial_accumulator_value, the rest at zero.
                start = float(group.get("initial_accumulator_value", 0.0))
                for key, tensor in optimizer.state.get(param, {}).items():
                    if isinstance(tensor, torch.Tensor) and tensor.shape == weight.shape:
                        out.append((tensor, start if key == "sum" else 0.0))
    return out


def _blocks(tables: nn.Module, name: str
            ) -> list[tuple[int, int, torch.Tensor, dict[str, torch.Tensor]]]:
    """(row offset, column offset, weight view, optimizer state views) of every block of
    table ``name`` held here: the whole table, or each local shard of a sharded collection."""
    local_shards = getattr(tables, "local_shards", None)
    if callable(local_shards):
        return [(s.metadata.row_offset, s.metadata.col_offset, s.weight, s.optimizer_state)
                for s in local_shards([name]) if s.table == name]
    weights = tables.embedding_bag_weights([name])  # type: ignore[operator]
    states = tables.optimizer_state([name])  # type: ignore[operator]
    return [(0, 0, weights[name], states.get(name, {}))]
