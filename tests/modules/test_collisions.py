"""The managed-collision remapper against a pure-Python reference of the same rules."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
import torch

from ctrctl.errors import ConfigError
from ctrctl.modules.collisions import DEFAULT_ROW, CollisionConfig, CollisionRemapper


@dataclass
class Reference:
    """The remapper's rules written out with dicts, one id at a time."""

    config: CollisionConfig
    owner: dict[int, int] = field(default_factory=dict)  # slot -> key
    count: dict[int, int] = field(default_factory=dict)  # slot -> lookups
    used: dict[int, int] = field(default_factory=dict)  # slot -> last step
    when: dict[int, float] = field(default_factory=dict)  # slot -> last data time
    waiting: dict[int, tuple[int, int]] = field(default_factory=dict)  # key -> (count, step)
    step: int = 0
    admissions: int = 0
    evictions: int = 0
    default_lookups: int = 0

    def remap(self, keys: list[int], now: float = 0.0) -> list[int]:
        c = self.config
        self.step += 1
        if c.eviction == "ttl":
            assert c.ttl_days is not None
            for slot in [s for s in self.owner if self.when[s] < now - c.ttl_days]:
                del self.owner[slot]
                self.evictions += 1
        slot_of = {k: s for s, k in self.owner.items()}
        seen: dict[int, int] = {}
        for k in keys:
            seen[k] = seen.get(k, 0) + 1
        new: dict[int, int] = {}
        for k in sorted(seen):
            if k in slot_of:
                s = slot_of[k]
                self.count[s] += seen[k]
                self.used[s], self.when[s] = self.step, now
            else:
                new[k] = seen[k] + (self.waiting.pop(k, (0, 0))[0]
                                    if c.admit_min_count > 1 else 0)
        if c.admit_min_count > 1:
            for k, total in new.items():
                self.waiting[k] = (total, self.step)
            if len(self.waiting) > c.waiting_rows:
                kept = sorted(self.waiting.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))
                self.waiting = dict(kept[: c.waiting_rows])
        candidates = sorted((k for k, t in new.items() if t >= c.admit_min_count),
                            key=lambda k: (-new[k], k))
        free = [s for s in range(c.capacity) if s != DEFAULT_ROW and s not in self.owner]
        for k in candidates:
            if free:
                slot = free.pop(0)
            elif c.eviction == "ttl":
                break
            else:
                residents = [s for s in self.owner if self.used[s] != self.step]
                if not residents:
                    break
                if c.eviction == "lru":
                    slot = min(residents, key=lambda s: (self.used[s], s))
                else:
                    slot = min(residents, key=lambda s: (self.count[s], self.used[s], s))
                    if self.count[slot] > new[k]:
                        break
                self.evictions += 1
            self.owner[slot] = k
            self.count[slot], self.used[slot], self.when[slot] = new[k], self.step, now
            slot_of[k] = slot
            self.waiting.pop(k, None)
            self.admissions += 1
        out = [slot_of.get(k, DEFAULT_ROW) for k in keys]
        self.default_lookups += sum(1 for k in keys if k not in slot_of)
        return out


CONFIGS = [
    CollisionConfig(capacity=9, eviction="lfu"),
    CollisionConfig(capacity=9, eviction="lru"),
    CollisionConfig(capacity=9, eviction="ttl", ttl_days=1.5),
    CollisionConfig(capacity=7, eviction="lfu", admit_min_count=3, pending_capacity=5),
    CollisionConfig(capacity=7, eviction="lru", admit_min_count=2, pending_capacity=4),
    CollisionConfig(capacity=7, eviction="ttl", ttl_days=0.75, admit_min_count=2),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.eviction}-k{c.admit_min_count}")
def test_remapper_matches_reference_on_random_requests(config: CollisionConfig) -> None:
    """10,000 random requests over the six configs (1,667 each), Zipf-ish keys incl. negatives."""
    rng = random.Random(CONFIGS.index(config))
    remapper, reference = CollisionRemapper(config), Reference(config)
    pool = [rng.randrange(-2**63, 2**63) for _ in range(24)] + list(range(-3, 5))
    now = 0.0
    for request in range(10_000 // len(CONFIGS) + 1):
        now += rng.choice([0.0, 0.0, 0.25, 0.5])
        keys = [pool[min(int(rng.expovariate(0.12)), len(pool) - 1)]
                for _ in range(rng.choice([1, 2, 3, 5, 8, 13]))]
        got = remapper.remap(torch.tensor(keys, dtype=torch.int64), now=now).tolist()
        want = reference.remap(keys, now)
        assert got == want, f"request {request}: keys {keys}"
        if request % 97 == 0:  # a read-only lookup changes nothing
            assert remapper.remap(torch.tensor(keys), update=False).tolist() == want
    owned = {int(s): int(remapper.slot_keys[s]) for s in remapper.occupied.nonzero().flatten()}
    assert owned == reference.owner
    assert {s: int(remapper.counts[s]) for s in owned} == {s: reference.count[s] for s in owned}
    stats = remapper.stats()
    assert (stats["admissions"], stats["evictions"], stats["default_lookups"]) == (
        reference.admissions, reference.evictions, reference.default_lookups)
    assert reference.evictions > 0 and reference.default_lookups > 0  # the paths were taken


def test_lookup_without_update_sends_unknown_ids_to_the_default_row() -> None:
    remapper = CollisionRemapper(CollisionConfig(capacity=4))
    assert remapper.remap(torch.tensor([5, 6, 5])).tolist() == [1, 2, 1]
    assert remapper.remap(torch.tensor([6, 99]), update=False).tolist() == [2, DEFAULT_ROW]
    assert remapper.stats()["admissions"] == 2


def test_state_dict_round_trip_maps_keys_the_same_way() -> None:
    config = CollisionConfig(capacity=6, eviction="lru", admit_min_count=2)
    a, b = CollisionRemapper(config), CollisionRemapper(config)
    for keys in ([1, 2, 2, 3], [3, 4, 4, 5, 1], [6, 6, 7, 7, 8, 8, 1]):
        a.remap(torch.tensor(keys))
    b.load_state_dict(a.state_dict())
    for keys in ([9, 9, 1, 6], [2, 3, 10, 10], [11, 11, 12, 12, 13, 13]):
        assert a.remap(torch.tensor(keys)).tolist() == b.remap(torch.tensor(keys)).tolist()


@pytest.mark.parametrize("bad", [dict(capacity=1), dict(capacity=8, eviction="fifo"),
                                 dict(capacity=8, eviction="ttl"),
                                 dict(capacity=8, admit_min_count=0)])
def test_bad_configs_are_one_clear_error(bad: dict) -> None:
    with pytest.raises(ConfigError):
        CollisionConfig(**bad)


def test_ttl_needs_the_data_time() -> None:
    remapper = CollisionRemapper(CollisionConfig(capacity=4, eviction="ttl", ttl_days=1))
    with pytest.raises(ConfigError, match="data time"):
        remapper.remap(torch.tensor([1]))
