"""A managed-collision table's remapper split into fixed shards, each held by one rank.

The table's non-default slots ``1 .. capacity-1`` are cut into ``shards`` contiguous ranges;
a raw key belongs to shard ``mix(key) mod shards`` (a splitmix64 finaliser), and each shard
is an independent :class:`~ctrctl.modules.collisions.CollisionRemapper` over its own range,
with its own admission and eviction. Capacity 13, 3 shards::

    slot    0 | 1 2 3 4 | 5 6 7 8 | 9 10 11 12
    shard   - |    0    |    1    |     2        row 0: the default row of every shard

A shard's remapper numbers its rows locally (local 0: the default row, local ``j``: global
``lo + j - 1``). The split depends on ``shards`` only, never on the world size, so a run
on any number of ranks takes the same decisions; the ranks just hold different shards.
:meth:`ShardedRemapper.place` keeps the shards a rank owns and drops the others (their
memory with them): the owner of a shard is the rank holding its first row (row-wise,
table-wise), or the shard number modulo the holders where every rank holds every row
(column-wise, data-parallel).

Example:
    >>> remapper = ShardedRemapper(CollisionConfig(capacity=13, shards=3))
    >>> remapper.remap(torch.tensor([42, 7]))     # global slots (here every shard is local)
    >>> remapper.place([0, 0, 1], rank=1)         # rank 1 keeps shard 2 only
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import nn

from ctrctl.errors import ConfigError
from ctrctl.modules.collisions import (
    DEFAULT_ROW,
    STAT_NAMES,
    CollisionConfig,
    CollisionRemapper,
    FrozenRemap,
)

__all__ = ["ShardedRemapper", "shard_of", "shard_owners", "shard_ranges"]

# splitmix64's constants as signed int64 (torch multiplies int64 with wrap-around).
_MIX1 = 0xBF58476D1CE4E5B9 - 2**64
_MIX2 = 0x94D049BB133111EB - 2**64


def shard_of(keys: torch.Tensor, shards: int) -> torch.Tensor:
    """The shard (0..shards-1) of each int64 raw key: splitmix64's finaliser, then modulo."""
    if shards == 1:
        return torch.zeros_like(keys)
    z = keys.to(torch.int64)
    z = (z ^ (z >> 30)) * _MIX1
    z = (z ^ (z >> 27)) * _MIX2
    z = z ^ (z >> 31)
    return torch.remainder(z, shards)


def shard_ranges(capacity: int, shards: int) -> list[tuple[int, int]]:
    """Global slots ``[lo, hi)`` of each shard: the ``capacity - 1`` non-default slots cut
    into ``shards`` near-equal contiguous ranges (the first ones one longer)."""
    slots = capacity - 1
    if not 1 <= shards <= slots:
        raise ConfigError(f"shards={shards} for a table of {slots} slots (capacity "
                          f"{capacity})", where="CollisionConfig",
                          hint="use 1 <= shards <= capacity - 1")
    out, lo = [], 1
    for s in range(shards):
        n = slots // shards + (1 if s < slots % shards else 0)
        out.append((lo, lo + n))
        lo += n
    return out


class ShardedRemapper(nn.Module):
    """Raw keys -> global slots of one table, through ``config.shards`` shard remappers.

    Args:
        config: the table's collision config (``shards`` of them; ``capacity`` and
            ``pending_capacity`` are the whole table's and are split over the shards).

    Buffers: ``shards.<s>.*``, each a :class:`CollisionRemapper`'s, for the shards held here
    (every one until :meth:`place`).
    """

    def __init__(self, config: CollisionConfig) -> None:
        super().__init__()
        self.config = config
        self.ranges = shard_ranges(config.capacity, config.shards)
        self.owners = [0] * config.shards
        self.shards = nn.ModuleDict(
            {str(s): CollisionRemapper(self.shard_config(s)) for s in range(config.shards)})

    def shard_config(self, shard: int) -> CollisionConfig:
        """Shard ``shard``'s own config: its rows plus the default row, its share of the
        waiting ids."""
        lo, hi = self.ranges[shard]
        share = math.ceil(self.config.waiting_rows * (hi - lo) / (self.config.capacity - 1))
        return dataclasses.replace(self.config, capacity=hi - lo + 1, shards=1,
                                   pending_capacity=max(1, share))

    # ---- placement ----------------------------------------------------------------------
    def place(self, owners: Sequence[int], rank: int) -> None:
        """Keep only the shards ``owners`` (shard -> rank) give to ``rank``."""
        if len(owners) != self.config.shards:
            raise ConfigError(f"{len(owners)} owners for {self.config.shards} shards",
                              where="ShardedRemapper.place")
        self.owners = list(owners)
        for s in self.local():
            if owners[s] != rank:
                del self.shards[str(s)]

    def owner_of(self, keys: torch.Tensor) -> torch.Tensor:
        """The rank holding each int64 raw key's shard (per :meth:`place`; 0 before)."""
        owners = torch.tensor(self.owners, dtype=torch.int64, device=keys.device)
        return owners[shard_of(keys, self.config.shards)]

    def local(self) -> list[int]:
        """The shards held here, ascending."""
        return sorted(int(k) for k in self.shards)

    @property
    def all_local(self) -> bool:
        return len(self.shards) == self.config.shards

    def _shard(self, s: int) -> CollisionRemapper:
        module = self.shards[str(s)]
        assert isinstance(module, CollisionRemapper)
        return module

    def _to_global(self, s: int, local: torch.Tensor) -> torch.Tensor:
        lo = self.ranges[s][0]
        return torch.where(local == DEFAULT_ROW, local, local + (lo - 1))

    # ---- lookups ------------------------------------------------------------------------
    @torch.no_grad()
    def remap(self, keys: torch.Tensor, now: float | None = None,
              update: bool = True) -> torch.Tensor:
        """Global slots of int64 ``keys`` whose shards are held here; 0 for the rest (the
        default row, or another rank's answer: ranks sum theirs). With ``update``, every
        local shard steps (admits, evicts, counts), even one that got no key."""
        keys = keys.to(torch.int64)
        which = shard_of(keys, self.config.shards)
        out = torch.zeros_like(keys)
        for s in self.local():
            at = (which == s).nonzero().squeeze(1)
            out[at] = self._to_global(s, self._shard(s).remap(keys[at], now, update))
        return out

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """Global slot of each key, -1 where it owns none (or its shard is held elsewhere)."""
        keys = keys.to(torch.int64)
        which = shard_of(keys, self.config.shards)
        out = torch.full_like(keys, -1)
        for s in self.local():
            at = (which == s).nonzero().squeeze(1)
            local = self._shard(s).lookup(keys[at])
            out[at] = torch.where(local < 0, local, self._to_global(s, local))
        return out

    def take_reassigned(self) -> torch.Tensor:
        """Global slots given to new owners in the local shards since the last call."""
        parts = [self._to_global(s, self._shard(s).take_reassigned()) for s in self.local()]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)

    # ---- statistics and export ----------------------------------------------------------
    def counters(self) -> torch.Tensor:
        """The local shards' counters summed (:data:`STAT_NAMES` order), then owned slots."""
        out = torch.zeros(len(STAT_NAMES) + 1, dtype=torch.int64)
        for s in self.local():
            shard = self._shard(s)
            out[:-1] += shard.stats_counters.cpu()
            out[-1] += int(shard.occupied.sum())
        return out

    def stats(self, counters: torch.Tensor | None = None) -> dict[str, float]:
        """Occupancy, lookups, default lookups and rate, admissions, evictions, distinct ids
        (see :meth:`CollisionRemapper.stats`) from ``counters`` (default: the local ones)."""
        values = (self.counters() if counters is None else counters).tolist()
        out = {name: float(v) for name, v in zip(STAT_NAMES, values[:-1], strict=True)}
        out["occupancy"] = values[-1] / (self.config.capacity - 1)
        out["default_rate"] = out["default_lookups"] / max(out["lookups"], 1.0)
        return out

    def slot_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(owner key, occupied) of every global slot (needs every shard held here)."""
        if not self.all_local:
            raise ConfigError("the remapper's shards are spread over ranks",
                              where="ShardedRemapper.slot_state",
                              hint="load the checkpoint in one process first")
        keys = torch.zeros(self.config.capacity, dtype=torch.int64)
        occupied = torch.zeros(self.config.capacity, dtype=torch.bool)
        for s in self.local():
            lo, hi = self.ranges[s]
            shard = self._shard(s)
            keys[lo:hi] = shard.slot_keys[1:].cpu()
            occupied[lo:hi] = shard.occupied[1:].cpu()
        return keys, occupied

    def frozen(self) -> FrozenRemap:
        """The read-only key -> slot map of every shard together, for serving and export."""
        return FrozenRemap(*self.slot_state())

    def extra_repr(self) -> str:
        return f"shards={self.config.shards}, ranges={self.ranges}, owners={self.owners}"


def shard_owners(ranges: Sequence[tuple[int, int]], blocks: Sequence[tuple[int, int, int]],
                 ) -> list[int]:
    """The rank of each shard: among the blocks ``(rank, row_offset, rows)`` of the table
    holding its first row, the one numbered ``shard mod count`` (one block holds it
    row-wise and table-wise; column-wise and data-parallel, several do)."""
    owners = []
    for s, (lo, _) in enumerate(ranges):
        holders = sorted({rank for rank, row0, rows in blocks if row0 <= lo < row0 + rows})
        if not holders:
            raise ConfigError(f"no rank holds row {lo} of the table", where="shard_owners")
        owners.append(holders[s % len(holders)])
    return owners
