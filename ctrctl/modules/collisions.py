"""Managed-collision ("zch") remappers: raw 64-bit keys -> slots of a table with no shared rows.

Hashing puts every id into ``key mod rows`` and lets unrelated ids share a row. A
managed-collision table instead tracks which raw keys own which of its ``capacity`` rows::

    raw keys   [9e21..., 42, 42, 7, 123456789]      (int64, any value: no modulo, no vocabulary)
    slots      [    3,    5,  5, 0,        8]       row 0: the shared default row

- An id seen ``admit_min_count`` times (counted while it waits) is *admitted*: it gets a free
  slot, or evicts a resident chosen by the eviction policy, and keeps that slot until evicted.
- An id not yet admitted, or arriving when the table is full and nothing may be evicted, is
  looked up in row 0, the **shared default row**. One row rather than a small hashed overflow
  range: the ids that land there are by construction rare or new, and one row learns what
  "a rare or new id" predicts from all of them together; an overflow range would split those
  few examples over rows that each learn a noisy mix of unrelated ids (hashing again).
- Eviction: ``lfu`` evicts the resident with the fewest lookups (ties: least recently used,
  then the lowest slot) and only for a newcomer counted at least as often; ``lru`` the least
  recently used (by training step; ties: lowest slot); ``ttl`` frees every slot not looked up
  for ``ttl_days`` of *data* time at the start of a step and evicts nothing under pressure.
  A resident looked up in the current step is never evicted by it.
- An evicted slot's embedding row is re-initialised and its optimizer state zeroed before
  its new owner is looked up (:meth:`ManagedCollisionCollection.forward`), so no new id
  inherits an old id's row and no row is left all-zero (pytorch/torchrec#3030).

The state (slot -> key, counts, last use, waiting ids and their counts, statistics) is a set of
fixed-size buffers, so it is part of ``state_dict()``: checkpoints carry it, and a model loaded
from one maps every key as the trained model did. A table's remapper may be split into
fixed shards, each one of these over a range of the rows and held by the rank of its rows
(:mod:`ctrctl.modules.collision_shards`); the remapping runs before the embedding collection.

Kernel: FBGEMM 1.8.0 registers ``torch.ops.fbgemm.zero_collision_hash`` on CPU, a probing
hash with TTL eviction and no admission counting, LFU or LRU; this module is the vectorised
torch implementation of the policies above (sorted keys + ``searchsorted``).

Example:
    >>> remapper = CollisionRemapper(CollisionConfig(capacity=1000, eviction="lru"))
    >>> slots = remapper.remap(torch.tensor([42, 7, 42]))       # tensor([1, 2, 1])
    >>> remapper.take_reassigned()                                # slots to re-initialise
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import nn

from ctrctl.errors import ConfigError

Eviction = Literal["lfu", "lru", "ttl"]
EVICTIONS: tuple[str, ...] = ("lfu", "lru", "ttl")

#: The row every not-admitted id is looked up in.
DEFAULT_ROW = 0

#: A training remap's time per id (ns) that the planner prices: scripts/bench_zch_remap.py,
#: capacity 100,000, Zipf(1.1) ids, 16,384 a step, one thread, on the AMD EPYC (Zen 4) of
#: docs/collisions.md (median of 3 runs; the figure rises with the machine's load).
REMAP_NS_PER_ID = 159.0


@dataclasses.dataclass(frozen=True)
class CollisionConfig:
    """How one managed-collision table admits and evicts ids.

    Args:
        capacity: rows of the table, the shared default row (row 0) included.
        eviction: ``lfu``, ``lru`` or ``ttl``.
        ttl_days: ``ttl`` only: a slot not looked up for this many days of data time is freed.
        admit_min_count: lookups an id needs before it gets a row of its own (1: at once).
        pending_capacity: ids counted while they wait for admission (default ``capacity``);
            when more wait, the least counted, then least recently seen, are forgotten.
        shards: the remapper's state split into this many fixed parts, each held by the rank
            holding its rows (:mod:`ctrctl.modules.collision_shards`); a key's part is a hash
            of the key, and each part admits and evicts on its own.

    Example:
        >>> CollisionConfig(capacity=100_000, eviction="ttl", ttl_days=7, admit_min_count=2)
    """

    capacity: int
    eviction: Eviction = "lfu"
    ttl_days: float | None = None
    admit_min_count: int = 1
    pending_capacity: int | None = None
    shards: int = 1

    def __post_init__(self) -> None:
        where = "CollisionConfig"
        if self.capacity < 2:
            raise ConfigError(f"capacity={self.capacity}: a table needs the default row and "
                              "at least one slot", where=where, hint="use capacity >= 2")
        if self.eviction not in EVICTIONS:
            raise ConfigError(f"unknown eviction {self.eviction!r}", where=where,
                              hint=f"use one of {', '.join(EVICTIONS)}")
        if self.eviction == "ttl" and (self.ttl_days is None or self.ttl_days <= 0):
            raise ConfigError("eviction ttl needs ttl_days > 0", where=where)
        if self.admit_min_count < 1:
            raise ConfigError(f"admit_min_count={self.admit_min_count} must be >= 1",
                              where=where)
        if self.pending_capacity is not None and self.pending_capacity < 1:
            raise ConfigError("pending_capacity must be >= 1", where=where)
        if not 1 <= self.shards <= self.capacity - 1:
            raise ConfigError(f"shards={self.shards} for {self.capacity - 1} slots",
                              where=where, hint="use 1 <= shards <= capacity - 1")

    @property
    def waiting_rows(self) -> int:
        return self.pending_capacity if self.pending_capacity is not None else self.capacity

    def state_bytes(self) -> int:
        """Bytes of the remapper's state (what the planner adds to the table's memory)."""
        per_slot = 8 + 1 + 8 + 8 + 8  # key, occupied, count, last step, last time
        per_waiting = 8 + 8 + 8  # key, count, last step
        # The sorted lookup index (keys, slots) is rebuilt from the slots, not saved.
        return self.capacity * (per_slot + 16) + self.waiting_rows * per_waiting


STAT_NAMES: tuple[str, ...] = ("lookups", "default_lookups", "admissions", "evictions",
                               "distinct_ids")


class CollisionRemapper(nn.Module):
    """Raw keys -> slots of one managed-collision table (see the module docstring).

    Args:
        config: capacity, eviction and admission.

    Buffers (all in ``state_dict``): ``slot_keys``, ``occupied``, ``counts``, ``last_step``,
    ``last_time`` (per slot); ``waiting_keys``, ``waiting_counts``, ``waiting_step``,
    ``num_waiting`` (ids counted for admission); ``step``; ``stats`` (see :meth:`stats`).
    """

    def __init__(self, config: CollisionConfig) -> None:
        super().__init__()
        self.config = config
        c, p = config.capacity, config.waiting_rows
        self.slot_keys: torch.Tensor
        self.occupied: torch.Tensor
        self.counts: torch.Tensor
        self.last_step: torch.Tensor
        self.last_time: torch.Tensor
        self.waiting_keys: torch.Tensor
        self.waiting_counts: torch.Tensor
        self.waiting_step: torch.Tensor
        self.num_waiting: torch.Tensor
        self.step: torch.Tensor
        self.stats_counters: torch.Tensor
        self.register_buffer("slot_keys", torch.zeros(c, dtype=torch.int64))
        self.register_buffer("occupied", torch.zeros(c, dtype=torch.bool))
        self.register_buffer("counts", torch.zeros(c, dtype=torch.int64))
        self.register_buffer("last_step", torch.zeros(c, dtype=torch.int64))
        self.register_buffer("last_time", torch.zeros(c, dtype=torch.float64))
        self.register_buffer("waiting_keys", torch.zeros(p, dtype=torch.int64))
        self.register_buffer("waiting_counts", torch.zeros(p, dtype=torch.int64))
        self.register_buffer("waiting_step", torch.zeros(p, dtype=torch.int64))
        self.register_buffer("num_waiting", torch.zeros((), dtype=torch.int64))
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self.register_buffer("stats_counters", torch.zeros(len(STAT_NAMES), dtype=torch.int64))
        self._index: tuple[torch.Tensor, torch.Tensor] | None = None  # sorted keys, slots
        self._reassigned: list[torch.Tensor] = []
        self._register_load_state_dict_pre_hook(self._drop_index)

    def _drop_index(self, *args: object, **kwargs: object) -> None:
        self._index = None

    # ---- lookups ------------------------------------------------------------------------

    def _sorted_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Occupied slots' keys in ascending order and their slots (rebuilt after changes)."""
        if self._index is None:
            slots = self.occupied.nonzero().squeeze(1)
            keys, order = torch.sort(self.slot_keys[slots])
            self._index = (keys, slots[order])
        return self._index

    def _update_index(self, removed: torch.Tensor, added: torch.Tensor | None) -> None:
        """Keep the sorted index current: drop ``removed`` slots, merge ``added`` ones (their
        keys already written) in O(capacity) rather than a fresh sort."""
        if self._index is None:
            return
        keys, slots = self._index
        if removed.numel():
            keep = ~torch.isin(slots, removed)
            keys, slots = keys[keep], slots[keep]
        if added is not None and added.numel():
            new_keys, order = torch.sort(self.slot_keys[added])
            at = torch.searchsorted(keys, new_keys) + torch.arange(
                new_keys.numel(), device=keys.device)  # places in the merged index
            merged = keys.numel() + new_keys.numel()
            old = torch.ones(merged, dtype=torch.bool, device=keys.device)
            old[at] = False
            out_keys = torch.empty(merged, dtype=keys.dtype, device=keys.device)
            out_slots = torch.empty_like(out_keys)
            out_keys[at], out_slots[at] = new_keys, added[order]
            out_keys[old], out_slots[old] = keys, slots
            keys, slots = out_keys, out_slots
        self._index = (keys, slots)

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """Slot of each key, -1 where the key owns none (no state changes)."""
        sorted_keys, sorted_slots = self._sorted_index()
        if sorted_keys.numel() == 0:
            return torch.full_like(keys, -1)
        pos = torch.searchsorted(sorted_keys, keys).clamp_(max=sorted_keys.numel() - 1)
        found = sorted_keys[pos] == keys
        return torch.where(found, sorted_slots[pos], torch.full_like(keys, -1))

    @torch.no_grad()
    def remap(self, keys: torch.Tensor, now: float | None = None,
              update: bool = True) -> torch.Tensor:
        """Slots (same shape) for int64 raw ``keys``; ``update`` admits, evicts and counts.

        Args:
            keys: 1-D int64 raw keys of one step (every rank's, when training sharded).
            now: the step's data time in days (``ttl`` needs it when updating).
            update: False for evaluation and serving: only look up, unknown -> row 0.
        """
        keys = keys.to(torch.int64)
        if not update:
            slots = self.lookup(keys)
            return torch.where(slots < 0, torch.full_like(slots, DEFAULT_ROW), slots)
        if self.config.eviction == "ttl" and now is None:
            raise ConfigError("a ttl table needs the data time of each training step",
                              where="CollisionRemapper.remap",
                              hint="give the schema a time_column and pass now=")
        self.step += 1
        step = int(self.step)
        time = float(now) if now is not None else 0.0
        if self.config.eviction == "ttl":
            self._expire(time)
        uniq, inverse, seen = torch.unique(keys, return_inverse=True, return_counts=True)
        slot_of = self.lookup(uniq)  # (U,)
        hit = slot_of >= 0
        hit_slots = slot_of[hit]
        self.counts.index_add_(0, hit_slots, seen[hit])
        self.last_step[hit_slots] = step
        self.last_time[hit_slots] = time
        new_keys, new_seen = uniq[~hit], seen[~hit]
        totals = self._count_waiting(new_keys, new_seen, step)
        admitted = self._admit(new_keys, totals, step, time)  # (N,) slot or -1
        slot_of[~hit] = admitted
        slots = torch.where(slot_of < 0, torch.full_like(slot_of, DEFAULT_ROW), slot_of)
        counters = self.stats_counters
        counters[0] += keys.numel()
        counters[1] += int(seen[slot_of < 0].sum())
        counters[4] += int(new_keys.numel() - (totals > new_seen).sum())  # first sightings
        return slots[inverse]

    # ---- admission and eviction ---------------------------------------------------------

    def _expire(self, now: float) -> None:
        assert self.config.ttl_days is not None
        stale = self.occupied & (self.last_time < now - self.config.ttl_days)
        stale[DEFAULT_ROW] = False
        freed = int(stale.sum())
        if freed:
            self.occupied[stale] = False
            self.stats_counters[3] += freed
            self._update_index(stale.nonzero().squeeze(1), None)

    def _count_waiting(self, keys: torch.Tensor, seen: torch.Tensor,
                       step: int) -> torch.Tensor:
        """Counts including earlier waiting (ascending unique ``keys``); updates the waiting list."""
        if self.config.admit_min_count == 1:
            return seen  # nobody waits: every id is admitted at its first lookup
        n = int(self.num_waiting)
        w_keys, w_counts = self.waiting_keys[:n], self.waiting_counts[:n]
        w_step = self.waiting_step[:n]
        totals = seen.clone()
        if n:
            pos = torch.searchsorted(w_keys, keys).clamp_(max=n - 1)
            found = w_keys[pos] == keys
            totals[found] += w_counts[pos[found]]
            keep = torch.ones(n, dtype=torch.bool, device=keys.device)
            keep[pos[found]] = False  # re-added below with their new totals
            w_keys, w_counts, w_step = w_keys[keep], w_counts[keep], w_step[keep]
        # Provisionally every new key waits; _admit removes the admitted ones.
        self._write_waiting(torch.cat([w_keys, keys]), torch.cat([w_counts, totals]),
                            torch.cat([w_step, torch.full_like(keys, step)]))
        return totals

    def _write_waiting(self, keys: torch.Tensor, counts: torch.Tensor,
                       steps: torch.Tensor) -> None:
        """Store waiting ids sorted by key, the ``pending_capacity`` most counted ones
        (ties: most recently seen, then the lowest key)."""
        limit = self.config.waiting_rows
        if keys.numel() > limit:
            order = torch.sort(keys, stable=True).indices
            order = order[torch.sort(-steps[order], stable=True).indices]
            order = order[torch.sort(-counts[order], stable=True).indices][:limit]
            keys, counts, steps = keys[order], counts[order], steps[order]
        order = torch.sort(keys).indices
        n = keys.numel()
        self.waiting_keys[:n] = keys[order]
        self.waiting_counts[:n] = counts[order]
        self.waiting_step[:n] = steps[order]
        self.num_waiting.fill_(n)

    def _forget_waiting(self, keys: torch.Tensor) -> None:
        n = int(self.num_waiting)
        if not n or not keys.numel():
            return
        w_keys = self.waiting_keys[:n]
        keep = ~torch.isin(w_keys, keys)
        self._write_waiting(w_keys[keep], self.waiting_counts[:n][keep],
                            self.waiting_step[:n][keep])

    def _admit(self, keys: torch.Tensor, totals: torch.Tensor, step: int,
               time: float) -> torch.Tensor:
        """Slots for new ``keys`` with counts ``totals``: -1 for those not admitted."""
        out = torch.full_like(keys, -1)
        eligible = (totals >= self.config.admit_min_count).nonzero().squeeze(1)
        if eligible.numel() == 0:
            return out
        # Candidates: most counted first, ties by ascending key (keys arrive ascending).
        eligible = eligible[torch.sort(-totals[eligible], stable=True).indices]
        free = (~self.occupied).nonzero().squeeze(1)
        free = free[free != DEFAULT_ROW]
        take_free = min(free.numel(), eligible.numel())
        chosen, slots = eligible[:take_free], free[:take_free]
        rest = eligible[take_free:]
        victims = torch.empty(0, dtype=torch.int64, device=keys.device)
        if rest.numel() and self.config.eviction != "ttl":
            victims = self._victims(rest, totals, step)
            chosen = torch.cat([chosen, rest[: victims.numel()]])
            slots = torch.cat([slots, victims])
        if chosen.numel() == 0:
            return out
        out[chosen] = slots
        self.slot_keys[slots] = keys[chosen]
        self.occupied[slots] = True
        self.counts[slots] = totals[chosen]
        self.last_step[slots] = step
        self.last_time[slots] = time
        self.stats_counters[2] += chosen.numel()
        self.stats_counters[3] += victims.numel()
        self._forget_waiting(keys[chosen])
        self._reassigned.append(slots.clone())
        self._update_index(victims, slots)
        return out

    def _victims(self, candidates: torch.Tensor, totals: torch.Tensor,
                 step: int) -> torch.Tensor:
        """Slots to evict for ``candidates`` (in order), by the eviction policy."""
        slots = (self.occupied & (self.last_step != step)).nonzero().squeeze(1)
        slots = slots[slots != DEFAULT_ROW]  # ascending: the last tie-break
        slots = slots[torch.sort(self.last_step[slots], stable=True).indices]
        if self.config.eviction == "lfu":
            slots = slots[torch.sort(self.counts[slots], stable=True).indices]
        n = min(slots.numel(), candidates.numel())
        slots = slots[:n]
        if self.config.eviction == "lfu":
            # A newcomer evicts only a resident counted no more often than itself; candidates
            # come most counted first and victims least counted first, so the pairs that
            # qualify are a prefix.
            ok = self.counts[slots] <= totals[candidates[:n]]
            n = int(ok.to(torch.int64).cumprod(0).sum())
            slots = slots[:n]
        return slots

    # ---- state for the table ------------------------------------------------------------

    def take_reassigned(self) -> torch.Tensor:
        """Slots given to new owners since the last call (their rows need a reset)."""
        if not self._reassigned:
            return torch.empty(0, dtype=torch.int64, device=self.slot_keys.device)
        slots = torch.unique(torch.cat(self._reassigned))
        self._reassigned = []
        return slots

    def stats(self) -> dict[str, float]:
        """Occupancy (share of slots owned), lookups, default-row lookups and their share,
        admissions, evictions and distinct ids seen (first sightings of keys not resident
        and not waiting; an id forgotten and seen again counts again)."""
        out = {name: float(v) for name, v in zip(STAT_NAMES, self.stats_counters.tolist(),
                                                    strict=True)}
        out["occupancy"] = float(self.occupied.sum()) / (self.config.capacity - 1)
        out["default_rate"] = out["default_lookups"] / max(out["lookups"], 1.0)
        return out

    def frozen(self) -> FrozenRemap:
        """The read-only key -> slot map of the current state, for serving and export."""
        return FrozenRemap(self.slot_keys, self.occupied)

    def extra_repr(self) -> str:
        c = self.config
        return (f"capacity={c.capacity}, eviction={c.eviction}, ttl_days={c.ttl_days}, "
                f"admit_min_count={c.admit_min_count}")


class FrozenRemap(nn.Module):
    """A remapper's key -> slot map, read-only, in fixed-size buffers (``torch.export``-able).

    ``index_keys`` holds the owned keys ascending, then padding (the largest int64) up to the
    capacity; ``index_slots`` their slots, the padding's row 0. A key not owned (or matching
    only padding) maps to the default row.
    """

    def __init__(self, slot_keys: torch.Tensor, occupied: torch.Tensor) -> None:
        super().__init__()
        owned = occupied.nonzero().squeeze(1)
        keys, order = torch.sort(slot_keys[owned], stable=True)
        pad = slot_keys.numel() - keys.numel()
        self.index_keys: torch.Tensor
        self.index_slots: torch.Tensor
        self.register_buffer("index_keys", torch.cat(
            [keys, torch.full((pad,), torch.iinfo(torch.int64).max, dtype=torch.int64,
                              device=keys.device)]))
        self.register_buffer("index_slots", torch.cat(
            [owned[order], torch.full((pad,), DEFAULT_ROW, dtype=torch.int64,
                                      device=keys.device)]))

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        """Slots (same shape) of int64 raw ``keys``."""
        last = self.index_keys.numel() - 1
        pos = torch.searchsorted(self.index_keys, keys).clamp(max=last)
        return torch.where(self.index_keys[pos] == keys, self.index_slots[pos],
                           torch.zeros_like(keys))
