"""The cached (disk + DRAM row cache) embedding kernel against resident tables and an LRU model."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from ctrctl.modules.cached_embedding import CachedEmbeddingBag, hashed_init_weight
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.modules.row_cache import RowFile, SetAssociativeRowCache
from ctrctl.modules.torch_embedding import TorchTableBatchedEmbeddingBags

TABLES = [(2000, 8), (500, 4)]
FEATURE_TABLE_MAP = [0, 0, 1]  # table 0 serves two features
SEEDS = [11, 12]
BATCH = 32


def _zipf(rng: np.random.Generator, rows: int, n: int, a: float = 1.2) -> np.ndarray:
    """Zipf-skewed ids, hot ids scattered over the table (not all in the first sets)."""
    ranks = (rng.zipf(a, n) - 1) % rows
    return (ranks * 7919 + 13) % rows


def _batches(steps: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        lengths = rng.integers(0, 4, size=len(FEATURE_TABLE_MAP) * BATCH)
        ids = []
        for f, t in enumerate(FEATURE_TABLE_MAP):
            n = int(lengths[f * BATCH : (f + 1) * BATCH].sum())
            ids.append(_zipf(rng, TABLES[t][0], n))
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        out.append((torch.from_numpy(np.concatenate(ids)), torch.from_numpy(offsets)))
    return out


def _ranges() -> list[tuple[float, float]]:
    return [(-(1.0 / r) ** 0.5, (1.0 / r) ** 0.5) for r, _ in TABLES]


def _resident(optimizer: EmbeddingOptimizerConfig) -> TorchTableBatchedEmbeddingBags:
    ref = TorchTableBatchedEmbeddingBags(TABLES, FEATURE_TABLE_MAP, optimizer)
    for target, (rows, dim), seed, bounds in zip(
        ref.split_weights(), TABLES, SEEDS, _ranges(), strict=True
    ):
        target.copy_(hashed_init_weight(rows, dim, seed, bounds))
    return ref


def _cached(optimizer: EmbeddingOptimizerConfig, load_factor: float,
            tmp_path: Path) -> CachedEmbeddingBag:
    return CachedEmbeddingBag(TABLES, FEATURE_TABLE_MAP, optimizer,
                              cache_load_factor=load_factor, seeds=SEEDS,
                              init_ranges=_ranges(), cache_dir=tmp_path)


def _train(cached: CachedEmbeddingBag, ref: TorchTableBatchedEmbeddingBags, steps: int,
           prefetch: bool) -> int:
    """Train both on the same batches, checking each step's output bitwise; max unique ids."""
    batches = _batches(steps)
    proj = torch.randn(steps, sum(cached.feature_dims), generator=torch.Generator().manual_seed(3))
    if prefetch:
        cached.prefetch(*batches[0])
    most = 0
    for i, (indices, offsets) in enumerate(batches):
        out = cached(indices, offsets)
        if prefetch and i + 1 < steps:
            cached.prefetch(*batches[i + 1])  # batch i+1's rows come in while batch i runs
        expected = ref(indices, offsets)
        assert torch.equal(out, expected), f"step {i}: pooled outputs differ"
        (out * proj[i]).sum().backward()
        (expected * proj[i]).sum().backward()
        most = max(most, int(torch.unique(indices).numel()))
    return most


@pytest.mark.parametrize("prefetch", [False, True], ids=["inline", "prefetch"])
@pytest.mark.parametrize("load_factor", [0.05, 0.2, 1.0])
@pytest.mark.parametrize("kind", ["exact_rowwise_adagrad", "exact_sgd"])
def test_cached_trains_to_the_same_bits_as_resident(
    tmp_path: Path, kind: str, load_factor: float, prefetch: bool
) -> None:
    optimizer = EmbeddingOptimizerConfig(kind=kind, lr=0.3)  # type: ignore[arg-type]
    cached, ref = _cached(optimizer, load_factor, tmp_path), _resident(optimizer)
    _train(cached, ref, steps=25, prefetch=prefetch)
    counters = cached.counters()
    forward_misses = sum(c["forward_misses"] for c in counters)
    if prefetch:
        assert forward_misses == 0
    else:
        assert forward_misses == sum(c["unique_misses"] for c in counters) > 0
    if load_factor < 1.0:
        assert counters[0]["rows_written_back"] > 0  # the cache really evicted rows
        assert cached.caches[0].main_slots * 4 <= TABLES[0][0]
    for t, (got, want) in enumerate(zip(cached.split_weights(), ref.split_weights(),
                                        strict=True)):
        assert torch.equal(got, want), f"table {t}: weights differ"
    for got, want in zip(cached.optimizer_state(), ref.split_optimizer_states(), strict=True):
        assert got.keys() == want.keys()
        for key in got:
            assert torch.equal(got[key], want[key])
    cached.close()


def test_exact_adagrad_and_mean_pooling_match(tmp_path: Path) -> None:
    optimizer = EmbeddingOptimizerConfig(kind="exact_adagrad", lr=0.2)
    cached = CachedEmbeddingBag(TABLES, FEATURE_TABLE_MAP, optimizer, pooling="mean",
                                cache_load_factor=0.1, seeds=SEEDS, init_ranges=_ranges(),
                                cache_dir=tmp_path)
    ref = TorchTableBatchedEmbeddingBags(TABLES, FEATURE_TABLE_MAP, optimizer, pooling="mean")
    for target, (rows, dim), seed, bounds in zip(ref.split_weights(), TABLES, SEEDS, _ranges(),
                                                 strict=True):
        target.copy_(hashed_init_weight(rows, dim, seed, bounds))
    _train(cached, ref, steps=10, prefetch=True)
    for got, want in zip(cached.split_weights(), ref.split_weights(), strict=True):
        assert torch.equal(got, want)
    cached.close()


def test_flush_leaves_the_resident_weights_in_the_file(tmp_path: Path) -> None:
    optimizer = EmbeddingOptimizerConfig(lr=0.3)
    cached, ref = _cached(optimizer, 0.2, tmp_path), _resident(optimizer)
    _train(cached, ref, steps=15, prefetch=True)
    cached.flush()
    for cache, want, state in zip(cached.caches, ref.split_weights(),
                                  ref.split_optimizer_states(), strict=True):
        store = cache.store
        touched = torch.from_numpy(store.touched)
        assert not cache.dirty.any()
        assert torch.equal(torch.from_numpy(store.weight)[touched], want[touched])
        assert torch.equal(torch.from_numpy(store.states["momentum1"])[touched],
                           state["momentum1"][touched])
        # Rows never written are not on disk, and were never trained: still their initial values.
        untouched = np.nonzero(~store.touched)[0]
        assert untouched.size > 0
        assert torch.equal(want[torch.from_numpy(untouched)],
                           torch.from_numpy(store.initial(untouched)))
        assert (state["momentum1"][torch.from_numpy(untouched)] == 0).all()
        assert (store.weight[untouched] == 0).all()  # reserved blocks, never written
    cached.close()


def test_dram_stays_within_load_factor_plus_a_batch_bound(tmp_path: Path) -> None:
    optimizer = EmbeddingOptimizerConfig(lr=0.3)
    load_factor = 0.05
    cached, ref = _cached(optimizer, load_factor, tmp_path), _resident(optimizer)
    most = _train(cached, ref, steps=20, prefetch=True)
    assert sum(c["conflict_misses"] for c in cached.counters()) > 0  # the overflow was used
    for cache, (rows, _) in zip(cached.caches, TABLES, strict=True):
        assert cache.main_slots <= load_factor * rows + cache.ways  # whole sets
        # Two batches in flight, the overflow area at most doubled past its need.
        assert cache.capacity - cache.main_slots <= 4 * most
        metadata = 8 + 1 + 4 + 8
        bound = (load_factor * rows + cache.ways + 4 * most) * (cache.store.row_bytes + metadata)
        assert cache.dram_bytes() <= bound + cache.store.touched.nbytes
    cached.close()


@pytest.mark.parametrize("steps", [100, pytest.param(1000, marks=pytest.mark.slow)])
def test_many_steps_leave_no_row_locked(tmp_path: Path, steps: int) -> None:
    bag = CachedEmbeddingBag([(1000, 4)], optimizer=EmbeddingOptimizerConfig(lr=0.1),
                             cache_load_factor=0.05, cache_dir=tmp_path)
    rng = np.random.default_rng(5)
    batches = [
        (torch.from_numpy(_zipf(rng, 1000, 48)), torch.arange(0, 49, 3)) for _ in range(steps)
    ]
    bag.prefetch(*batches[0])
    for i, batch in enumerate(batches):
        out = bag(*batch)
        if i + 1 < len(batches):
            bag.prefetch(*batches[i + 1])
        out.sum().backward()
    assert bag.locked_rows() == 0
    assert not bag.caches[0].overflow
    with torch.no_grad():  # an evaluation forward holds nothing
        bag(*batches[0])
    assert bag.locked_rows() == 0
    bag(*batches[1])  # a forward whose backward never runs is released by the next one
    bag(*batches[2]).sum().backward()
    assert bag.locked_rows() == 0
    bag.close()


def test_a_prefetch_for_another_batch_is_dropped(tmp_path: Path) -> None:
    optimizer = EmbeddingOptimizerConfig(lr=0.3)
    cached, ref = _cached(optimizer, 0.2, tmp_path), _resident(optimizer)
    batches = _batches(3, seed=9)
    cached.prefetch(*batches[1])  # not the batch that comes next
    for indices, offsets in batches:
        out = cached(indices, offsets)
        assert torch.equal(out, ref(indices, offsets))
        out.sum().backward()
        ref(indices, offsets).sum().backward()
    assert cached.locked_rows() == 0
    for got, want in zip(cached.split_weights(), ref.split_weights(), strict=True):
        assert torch.equal(got, want)
    cached.close()


@pytest.mark.parametrize("load_factor", [0.05, 0.2])
def test_backward_updates_while_the_next_prefetch_fills_its_slots(
    tmp_path: Path, load_factor: float
) -> None:
    """Each prefetch's reads are held until the batch before has started its update: the
    backward must not wait for the prefetch (that would hang), and the bits still match."""
    optimizer = EmbeddingOptimizerConfig(lr=0.3)
    cached, ref = _cached(optimizer, load_factor, tmp_path), _resident(optimizer)
    cache, main = cached.caches[0], threading.current_thread()
    updating, read = cache.updating, cache.store.read
    update_started = threading.Event()
    overlapped = []

    @contextlib.contextmanager
    def signalling_updating():  # type: ignore[no-untyped-def]
        update_started.set()
        with updating() as held:
            yield held

    def held_read(ids: np.ndarray):  # type: ignore[no-untyped-def]
        if threading.current_thread() is not main and cache.counters.calls > 1:
            assert update_started.wait(20), "the backward waited for the prefetch"
            update_started.clear()
            overlapped.append(ids.size)
        return read(ids)

    cache.updating = signalling_updating  # type: ignore[method-assign]
    cache.store.read = held_read  # type: ignore[method-assign]
    _train(cached, ref, steps=20, prefetch=True)
    assert len(overlapped) > 10  # most prefetches filled slots during a backward
    if load_factor == 0.05:
        assert cached.counters()[0]["conflict_misses"] > 0  # the overflow area grew too
    assert sum(c["forward_misses"] for c in cached.counters()) == 0
    for got, want in zip(cached.split_weights(), ref.split_weights(), strict=True):
        assert torch.equal(got, want)
    for got_state, want_state in zip(cached.optimizer_state(), ref.split_optimizer_states(),
                                     strict=True):
        for key in got_state:
            assert torch.equal(got_state[key], want_state[key])
    cached.close()


class _LruModel:
    """Brute force, one row at a time: what the cache's counters must say."""

    def __init__(self, num_sets: int, ways: int, row_bytes: int) -> None:
        self.num_sets, self.ways, self.row_bytes = num_sets, ways, row_bytes
        self.tag: list[list[int | None]] = [[None] * ways for _ in range(num_sets)]
        self.used = [[-1] * ways for _ in range(num_sets)]
        self.lock = [[0] * ways for _ in range(num_sets)]
        self.dirty = [[False] * ways for _ in range(num_sets)]
        self.overflow: dict[int, list] = {}  # row -> [locks, dirty]
        self.on_disk: set[int] = set()
        self.clock = 0
        self.c = dict.fromkeys(["calls", "requested_ids", "unique_ids", "unique_misses",
                                "conflict_misses", "rows_written_back", "bytes_read",
                                "bytes_written"], 0)

    def _write(self, row: int) -> None:
        self.on_disk.add(row)
        self.c["rows_written_back"] += 1
        self.c["bytes_written"] += self.row_bytes

    def lookup(self, ids: list[int], requested: int) -> list[tuple]:
        self.clock += 1
        self.c["calls"] += 1
        self.c["requested_ids"] += requested
        self.c["unique_ids"] += len(ids)
        held: list[tuple] = []
        misses: dict[int, list[int]] = {}
        for row in ids:
            s = row % self.num_sets
            if row in self.tag[s]:
                w = self.tag[s].index(row)
                self.lock[s][w] += 1
                self.used[s][w] = self.clock
                held.append(("set", s, w))
            elif row in self.overflow:
                self.overflow[row][0] += 1
                held.append(("overflow", row))
            else:
                misses.setdefault(s, []).append(row)
        self.c["unique_misses"] += sum(len(m) for m in misses.values())
        reads = []
        for s, rows in misses.items():
            free = sorted((self.used[s][w], w) for w in range(self.ways) if self.lock[s][w] == 0)
            for k, row in enumerate(sorted(rows)):
                if k < len(free):
                    w = free[k][1]
                    if self.tag[s][w] is not None and self.dirty[s][w]:
                        self._write(self.tag[s][w])  # type: ignore[arg-type]
                    self.tag[s][w], self.used[s][w] = row, self.clock
                    self.lock[s][w], self.dirty[s][w] = 1, False
                    held.append(("set", s, w))
                else:
                    self.c["conflict_misses"] += 1
                    self.overflow[row] = [1, False]
                    held.append(("overflow", row))
                reads.append(row)
        self.c["bytes_read"] += self.row_bytes * sum(row in self.on_disk for row in reads)
        return held

    def release(self, held: list[tuple], updated: bool) -> None:
        for h in held:
            if h[0] == "set":
                _, s, w = h
                self.dirty[s][w] |= updated
                self.lock[s][w] -= 1
            else:
                entry = self.overflow[h[1]]
                entry[1] |= updated
                entry[0] -= 1
                if entry[0] == 0:
                    if entry[1]:
                        self._write(h[1])
                    del self.overflow[h[1]]


def test_counters_match_a_brute_force_lru_model(tmp_path: Path) -> None:
    rows = 3000
    store = RowFile(tmp_path, "t", rows, 4, {"momentum1": ()}, seed=1, init_range=(-0.1, 0.1))
    cache = SetAssociativeRowCache(store, load_factor=0.02)  # 2 sets of 32 slots
    model = _LruModel(cache.num_sets, cache.ways, store.row_bytes)
    rng = np.random.default_rng(0)
    previous: tuple[np.ndarray, list[tuple], bool] | None = None
    for call in range(10_000):
        raw = _zipf(rng, rows, int(rng.integers(1, 64)), a=1.1)
        ids = np.unique(raw)
        slots = cache.lookup_and_lock(ids, requested=raw.size)
        held = model.lookup(ids.tolist(), raw.size)
        assert (cache.slot_row[slots] == ids).all()
        updated = call % 3 != 0  # some batches are evaluation: read, not updated
        if previous is not None:  # the batch before is released after this one is fetched
            if previous[2]:
                cache.mark_dirty(previous[0])
            cache.release(previous[0])
            model.release(previous[1], previous[2])
        previous = (slots, held, updated)
    assert cache.counters.as_dict() == model.c
    assert model.c["conflict_misses"] > 0 and model.c["bytes_read"] > 0
    for s in range(cache.num_sets):
        assert cache.slot_row[s * cache.ways : (s + 1) * cache.ways].tolist() == [
            -1 if t is None else t for t in model.tag[s]
        ]


def _ebc_tables() -> list:
    from ctrctl.modules import EmbeddingBagConfig

    return [EmbeddingBagConfig("big", 3000, 8, ["f_big"]),
            EmbeddingBagConfig("small", 50, 8, ["f_small"]),
            EmbeddingBagConfig("other", 800, 8, ["f_other"])]


def _kjt(seed: int):  # type: ignore[no-untyped-def]
    from ctrctl.sparse import KeyedJaggedTensor

    rng = np.random.default_rng(seed)
    keys, rows = ["f_small", "f_big", "f_other"], [50, 3000, 800]  # not in config order
    lengths = rng.integers(0, 3, size=3 * 16)
    values = np.concatenate([_zipf(rng, r, int(lengths[i * 16 : (i + 1) * 16].sum()))
                             for i, r in enumerate(rows)])
    return KeyedJaggedTensor.from_lengths_sync(keys, torch.from_numpy(values),
                                               torch.from_numpy(lengths))


def test_collection_with_cached_tables_matches_resident_and_round_trips(tmp_path: Path) -> None:
    from ctrctl.modules import EmbeddingBagCollection
    from ctrctl.modules.cached_embedding import table_seed

    optimizer = EmbeddingOptimizerConfig(lr=0.2)
    load = {"big": 0.05, "other": 0.2}
    cached = EmbeddingBagCollection(_ebc_tables(), optimizer, backend="torch", seed=4,
                                    cached_tables=load, cache_dir=str(tmp_path))
    assert sorted(cached.backends()) == ["cached", "torch"]
    ref = EmbeddingBagCollection(_ebc_tables(), optimizer, backend="torch", seed=4)
    weights = ref.embedding_bag_weights()
    weights["small"].copy_(cached.embedding_bag_weights()["small"])
    for cfg in _ebc_tables():
        if cfg.name in load:
            weights[cfg.name].copy_(hashed_init_weight(cfg.num_embeddings, cfg.embedding_dim,
                                                       table_seed(4, cfg.name), cfg.init_range))
    cached.prefetch(_kjt(0))
    for step in range(8):
        out = cached(_kjt(step))
        cached.prefetch(_kjt(step + 1))
        expected = ref(_kjt(step))
        assert torch.equal(out.values(), expected.values())
        out.values().square().sum().backward()
        expected.values().square().sum().backward()
    assert set(cached.cache_counters()) == {"big", "other"}
    assert all(c["forward_misses"] == 0 for c in cached.cache_counters().values())
    # state_dict (what checkpoints save) flushes the cache first and shows whole tables.
    state = cached.state_dict()
    for name, weight in ref.embedding_bag_weights().items():
        assert torch.equal(state[f"embedding_bags.{name}.weight"], weight)
    for name, opt in ref.optimizer_state().items():
        assert torch.equal(cached.optimizer_state()[name]["momentum1"], opt["momentum1"])
    # ... and a cached collection resumes from a resident one's state.
    fresh = EmbeddingBagCollection(_ebc_tables(), optimizer, backend="torch", seed=99,
                                   cached_tables=load, cache_dir=str(tmp_path))
    fresh.load_state_dict(ref.state_dict())
    fresh.load_optimizer_state(ref.optimizer_state())
    out, expected = fresh(_kjt(20)), ref(_kjt(20))
    assert torch.equal(out.values(), expected.values())
    out.values().sum().backward()
    expected.values().sum().backward()
    for name, weight in ref.embedding_bag_weights().items():
        assert torch.equal(fresh.embedding_bag_weights()[name], weight)


def test_model_config_asks_for_cached_tables_and_checkpoints_see_whole_tables(
    tmp_path: Path,
) -> None:
    from pydantic import ValidationError

    from ctrctl.config import ModelConfig
    from ctrctl.data.manifest import DatasetManifest, DenseFeature, SparseFeature, SplitInfo
    from ctrctl.distributed.checkpoint import table_shards
    from ctrctl.models.build import dlrm_from_manifest
    from ctrctl.sparse import KeyedJaggedTensor

    with pytest.raises(ValidationError, match="cached_tables"):
        ModelConfig(cached_tables={"C1": 0.0})
    manifest = DatasetManifest(
        label="label",
        dense=(DenseFeature("I0"),),
        sparse=(SparseFeature("C1", "hash", 4000), SparseFeature("C2", "vocab", 30)),
        splits={"train": SplitInfo(rows=10, label_rate=0.5)},
    )
    model = dlrm_from_manifest(manifest, 4, [4], [4, 1], backend="torch",
                               cached_tables={"*": 0.05, "C2": 1.0}, cache_dir=str(tmp_path))
    assert model.sparse_arch.backends() == ["cached"]
    rng = np.random.default_rng(1)
    for _ in range(5):
        kjt = KeyedJaggedTensor.from_lengths_sync(
            ["C1", "C2"],
            torch.from_numpy(np.concatenate([_zipf(rng, 4000, 64), rng.integers(0, 30, 64)])),
            torch.ones(128, dtype=torch.long))
        model(torch.randn(64, 1), kjt).sum().backward()
    shards = {s.table: s for s in table_shards(model)}
    assert {k: tuple(s.weight.shape) for k, s in shards.items()} == {"C1": (4000, 4),
                                                                       "C2": (30, 4)}
    resident = dlrm_from_manifest(manifest, 4, [4], [4, 1], backend="torch")
    resident.sparse_arch.load_embedding_bag_weights({k: s.weight for k, s in shards.items()})
    resident.sparse_arch.load_optimizer_state({k: s.optimizer_state for k, s in shards.items()})
    resident.load_state_dict({k: v for k, v in model.state_dict().items()
                              if not k.startswith("sparse_arch")}, strict=False)
    with torch.no_grad():
        assert torch.equal(model(torch.ones(64, 1), kjt), resident(torch.ones(64, 1), kjt))
    with pytest.raises(Exception, match="unknown tables"):
        dlrm_from_manifest(manifest, 4, [4], [4, 1], cached_tables={"C9": 0.5})
    # sharded, a cached table keeps its shards cached: tests/distributed/pipeline/


def test_a_lookup_of_no_ids_locks_nothing(tmp_path: Path) -> None:
    store = RowFile(tmp_path, "t", 100, 4, {}, seed=0, init_range=(-0.1, 0.1))
    cache = SetAssociativeRowCache(store, load_factor=0.5)
    assert cache.lookup_and_lock(np.zeros(0, dtype=np.int64)).size == 0
    assert cache.counters.calls == 1 and cache.locked_slots() == 0
