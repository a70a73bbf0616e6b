"""Rank bodies for managed-collision tests: a DLRM with a zch table, trained sharded on gloo,
saved, and resumed under another world size and plan (importable by spawned ranks).

Every world size trains on the same global batches of :data:`GLOBAL_BATCH` rows, rank ``r``
taking rows ``[r * B / W, (r + 1) * B / W)``; the loss of a step is the mean of the ranks'
means (equal shares: the global mean), so a run on 1, 2 or 4 ranks takes the same steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from ctrctl import checkpoint as ckpt
from ctrctl.distributed.checkpoint import gather_table_weights, load_sharded, save_sharded
from ctrctl.distributed.default_plan import forced_plan
from ctrctl.models.build import dense_parameters, dense_state, load_dense_state, wrap_model
from ctrctl.modules import (
    DLRM,
    CollisionConfig,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingOptimizerConfig,
    ManagedCollisionCollection,
    dlrm_loss,
)
from ctrctl.modules.collision_shards import ShardedRemapper
from ctrctl.sparse import KeyedJaggedTensor

GLOBAL_BATCH = 8
DIM = 8
#: Raw user keys: far more than the zch table's rows, so every step admits and evicts.
USER_KEYS = [(7919 * k) ** 3 - 2**61 for k in range(1, 41)]


def zch_dlrm(seed: int, capacity: int = 12, shards: int = 1) -> DLRM:
    tables = [EmbeddingBagConfig("user", capacity, DIM, ["user"]),
              EmbeddingBagConfig("item", 16, DIM, ["item"])]
    # exact_adagrad: per-element state, so column shards step as the whole row does
    # (rowwise Adagrad's state is a mean over the columns a shard holds).
    optimizer = EmbeddingOptimizerConfig(kind="exact_adagrad", lr=0.2)
    ebc = EmbeddingBagCollection(tables, optimizer=optimizer, seed=seed)
    mc = ManagedCollisionCollection(
        {"user": CollisionConfig(capacity, eviction="lru", shards=shards)}, tables, seed=seed)
    torch.manual_seed(seed)
    return DLRM(ebc, 2, [8, DIM], [8, 1], collisions=mc)


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Step ``step``'s rows: dense (B, 2), user keys (B,), item ids (B,), labels (B,)."""
    gen = torch.Generator().manual_seed(1000 + step)
    users = torch.tensor(USER_KEYS)[torch.randint(0, len(USER_KEYS), (GLOBAL_BATCH,),
                                                  generator=gen)]
    return (torch.randn(GLOBAL_BATCH, 2, generator=gen), users,
            torch.randint(0, 16, (GLOBAL_BATCH,), generator=gen),
            torch.randint(0, 2, (GLOBAL_BATCH,), generator=gen))


def _rank_rows(step: int, rank: int, world: int
               ) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    dense, users, items, labels = global_batch(step)
    share = GLOBAL_BATCH // world
    rows = slice(rank * share, (rank + 1) * share)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["user", "item"], torch.cat([users[rows], items[rows]]),
        torch.ones(2 * share, dtype=torch.int64))
    return dense[rows], kjt, labels[rows]


def train_body(rank: int, world_size: int, plan_types: str | Mapping[str, str],
               steps: Sequence[int], load_from: str | None = None,
               save_to: str | None = None, dense_optimizer: str = "sgd",
               shards: int = 1) -> dict[str, Any]:
    """Train ``steps`` (global batch numbers) sharded per ``plan_types``, from a fresh model
    or a checkpoint; optionally save one. ``dense_optimizer``: ``sgd`` or ``adam`` (attached
    to the remappers, which reset its state of reassigned data-parallel rows); ``shards``:
    the user remapper's. Returns the global losses, the full tables, the whole remapper state
    (gathered from its shards' ranks), the shards held here and the checkpoint's path."""
    model = zch_dlrm(seed=3 if load_from is None else 77, shards=shards)  # resume: any seed
    plan = forced_plan(model.sparse_arch.embedding_bag_configs(), world_size, plan_types)
    dmp = wrap_model(model, plan, dist.group.WORLD)
    if load_from is not None:
        load_sharded(load_from, dmp)
        state, _ = ckpt.load_dense(load_from)
        load_dense_state(dmp, state)
    opt: torch.optim.Optimizer = (torch.optim.Adam(dense_parameters(dmp), lr=0.05)
                                  if dense_optimizer == "adam"
                                  else torch.optim.SGD(dense_parameters(dmp), lr=0.1))
    assert model.collisions is not None
    model.collisions.attach_optimizer(opt)
    losses = []
    for step in steps:
        dense, kjt, labels = _rank_rows(step, rank, world_size)
        loss = dlrm_loss(dmp(dense, kjt), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world_size)
    path = None
    if save_to is not None:
        path = str(save_sharded(save_to, steps[-1], dmp, dense_state(dmp), {}, {}, {}))
    collisions = model.collisions
    assert collisions is not None
    user = collisions.remappers["user"]
    assert isinstance(user, ShardedRemapper)
    return {"losses": losses, "tables": gather_table_weights(dmp),
            "remapper": collisions.full_state_dict(), "local_shards": user.local(),
            "state_keys": sorted(collisions.state_dict()), "path": path}


def checkpoint_exists(path: str) -> bool:
    return Path(path, "metadata.json").is_file()


# ---- the key exchange: all-to-all against all-gather ---------------------------------------
#: Per rank, samples of each step's batch (uneven: the ranks send different key counts).
EXCHANGE_STRIDES = [4, 2, 1, 3]


def exchange_tables() -> tuple[list[EmbeddingBagConfig], dict[str, CollisionConfig]]:
    """Two zch tables (one read by two features; an lru one with a waiting list, a ttl one)
    and a plain one, small enough that every step admits and evicts."""
    tables = [EmbeddingBagConfig("user", 13, 4, ["user", "user_last"]),
              EmbeddingBagConfig("ad", 9, 4, ["ad"]),
              EmbeddingBagConfig("item", 16, 4, ["item"])]
    return tables, {"user": CollisionConfig(13, eviction="lru", admit_min_count=2, shards=6),
                    "ad": CollisionConfig(9, eviction="ttl", ttl_days=1.0, shards=4)}


def exchange_batch(step: int, rank: int) -> tuple[KeyedJaggedTensor, float | None]:
    """Rank ``rank``'s batch of step ``step`` and its data time. Rank 1 never has a
    ``user_last`` key, rank 2 no data time, and at step 2 rank 2 has no key at all."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    stride = EXCHANGE_STRIDES[rank]
    names, universe = ["user", "user_last", "ad", "item"], [30, 30, 20, 16]
    lengths = torch.randint(0, 4, (len(names), stride), generator=gen)
    if rank == 1:
        lengths[1] = 0
    if rank == 2 and step == 2:
        lengths[:] = 0
    values = []
    for f, count in enumerate(lengths.sum(1).tolist()):
        ids = torch.randint(0, universe[f], (count,), generator=gen)
        values.append(ids if names[f] == "item" else ids * 7919 - 2**40 * (f + 1))
    now = None if rank == 2 else 10.0 + 0.7 * step + 0.25 * rank
    return (KeyedJaggedTensor.from_lengths_sync(names, torch.cat(values), lengths.reshape(-1)),
            now)


def exchange_body(rank: int, world_size: int, exchange: str, steps: int) -> dict[str, Any]:
    """Train a placed collection ``steps`` steps with ``exchange`` (``all_to_all`` or
    ``all_gather``), then look up once in eval mode. ``user``'s 6 shards go row-wise (the
    rank holding their first row), ``ad``'s round the ranks (every rank holds every row).
    Returns the slots of each step, the table weights, the whole remapper state, the
    statistics and the shards held here."""
    tables, collisions = exchange_tables()
    ebc = EmbeddingBagCollection(tables, seed=5)
    mc = ManagedCollisionCollection(collisions, tables, seed=9, process_group=dist.group.WORLD)
    mc.exchange = exchange  # type: ignore[assignment]
    per_rank = -(-13 // world_size)
    mc.place({"user": [(r, r * per_rank, min(per_rank, 13 - r * per_rank))
                       for r in range(world_size)],
              "ad": [(r, 0, 9) for r in range(world_size)]}, rank)
    mc.train()
    slots = []
    for step in range(steps):
        kjt, now = exchange_batch(step, rank)
        slots.append(mc(kjt, ebc, now=now).values())
    mc.eval()
    slots.append(mc(exchange_batch(steps, rank)[0], ebc).values())
    return {"slots": slots, "tables": ebc.embedding_bag_weights(),
            "remapper": mc.full_state_dict(), "stats": mc.stats(),
            "local": {n: cast(ShardedRemapper, m).local() for n, m in mc.remappers.items()}}
