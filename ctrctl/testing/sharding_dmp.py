"""Rank bodies for DistributedModelParallel, resharded checkpoints and rank failures.

* :func:`dmp_body`: DMP over a real EmbeddingBagCollection + a linear head trains two steps
  exactly as the unsharded model does on the global batch.
* :func:`save_body` / :func:`resume_body`: save at one world size, load at another (another
  plan too): identical weights, and the next step again equals the unsharded model's.
* :func:`run_ranks`: spawn ranks without killing the survivors when one dies (unlike
  ``mp.spawn``), so tests can read what each survivor reported and when.

Example:
    >>> run_multiprocess(dmp_body, 2, args=({"t0": "row_wise", ...}, "exact_sgd"))
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from ctrctl import checkpoint as ckpt
from ctrctl.checkpoint import format as checkpoint_format
from ctrctl.distributed import comm
from ctrctl.distributed.checkpoint import gather_table_weights, load_sharded, save_sharded
from ctrctl.distributed.default_plan import forced_plan
from ctrctl.distributed.model_parallel import DistributedModelParallel
from ctrctl.distributed.processes import free_port
from ctrctl.modules.embedding_modules import EmbeddingBagCollection
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.testing.sharding import DENSE_IN, GoldenBatch, _say, golden_tables, make_batches

LR = 0.05


class TinyModel(nn.Module):
    """An EmbeddingBagCollection and a linear head over ``cat(dense, pooled)``."""

    ebc: Any
    head: nn.Linear

    def __init__(self, ebc: nn.Module, width: int, seed: int) -> None:
        super().__init__()
        self.ebc = ebc
        torch.manual_seed(seed)
        self.head = nn.Linear(DENSE_IN + width, 1)

    def forward(self, batch: GoldenBatch, keys: Sequence[str]) -> torch.Tensor:
        pooled = self.ebc(batch.kjt(keys))
        return self.head(torch.cat([batch.dense, pooled.values()], dim=1)).squeeze(1)


def make_model(kind: str, seed: int, backend: str = "auto") -> tuple[TinyModel, list[str]]:
    tables = golden_tables()
    ebc = EmbeddingBagCollection(tables, EmbeddingOptimizerConfig(kind=cast(Any, kind), lr=LR),
                                 seed=seed, backend=backend)
    width = sum(t.embedding_dim * len(t.feature_names) for t in tables)
    return TinyModel(ebc, width, seed), [f for t in tables for f in t.feature_names]


def concat_batches(batches: Sequence[GoldenBatch]) -> GoldenBatch:
    """The global batch: every rank's samples in rank order."""
    features = batches[0].lengths.shape[0]
    return GoldenBatch(
        torch.cat([b.lengths for b in batches], dim=1),
        [torch.cat([b.values[f] for b in batches]) for f in range(features)],
        None,
        torch.cat([b.dense for b in batches]),
        torch.cat([b.labels for b in batches]))


def mean_of_rank_means(per_sample: torch.Tensor, batch_per_rank: Sequence[int]) -> torch.Tensor:
    """The loss DDP's averaging optimises: each rank's mean, averaged over ranks."""
    return torch.stack([p.mean() for p in per_sample.split(list(batch_per_rank))]).mean()


def reference_steps(model: TinyModel, keys: list[str], steps: Sequence[Sequence[GoldenBatch]]
                    ) -> list[torch.Tensor]:
    """Train the unsharded model one step per global batch; return each step's logits."""
    opt = torch.optim.SGD(model.head.parameters(), lr=LR)
    out = []
    for batches in steps:
        logits = model(concat_batches(batches), keys)
        per_sample = F.binary_cross_entropy_with_logits(
            logits, torch.cat([b.labels for b in batches]), reduction="none")
        mean_of_rank_means(per_sample, [len(b.labels) for b in batches]).backward()
        opt.step()
        opt.zero_grad()
        out.append(logits.detach())
    return out


def sharded_steps(dmp: DistributedModelParallel, keys: list[str], rank: int,
                  steps: Sequence[Sequence[GoldenBatch]]) -> list[torch.Tensor]:
    opt = torch.optim.SGD(dmp.dense_parameters(), lr=LR)
    out = []
    for batches in steps:
        mine = batches[rank]
        logits = dmp(mine, keys)
        F.binary_cross_entropy_with_logits(logits, mine.labels).backward()
        opt.step()
        opt.zero_grad()
        out.append(logits.detach())
    return out


def _head(dmp: DistributedModelParallel) -> nn.Linear:
    return cast(TinyModel, dmp.unwrapped).head


def _check_against(dmp: DistributedModelParallel, ref: TinyModel, logits: list[torch.Tensor],
                   ref_logits: list[torch.Tensor], rank: int, batch_per_rank: Sequence[int],
                   where: str) -> None:
    start = sum(batch_per_rank[:rank])
    for step, (mine, full) in enumerate(zip(logits, ref_logits, strict=True)):
        torch.testing.assert_close(mine, full[start:start + len(mine)],
                                   msg=_say(f"{where}: step {step} predictions: "))
    after = gather_table_weights(dmp)
    for name, expected in ref.ebc.embedding_bag_weights().items():
        torch.testing.assert_close(after[name], expected,
                                   msg=_say(f"{where}: table {name}: "))
    torch.testing.assert_close(_head(dmp).weight, ref.head.weight,
                               msg=_say(f"{where}: head: "))


def dmp_body(rank: int, world_size: int, plan_types: str | Mapping[str, str], kind: str,
             backend: str = "auto") -> float:
    """Two steps under DMP (DDP for the head) vs the unsharded model; returns the lr view."""
    where = f"DMP {plan_types} {kind} rank {rank}/{world_size}"
    model, keys = make_model(kind, seed=3, backend=backend)
    ref, _ = make_model(kind, seed=3, backend=backend)
    plan = forced_plan(model.ebc.embedding_bag_configs(), world_size, dict(plan_types)
                       if not isinstance(plan_types, str) else plan_types)
    dmp = DistributedModelParallel(model, plan)
    batch = (5,) * world_size
    steps = [make_batches(golden_tables(), batch, seed) for seed in (10, 11)]
    logits = sharded_steps(dmp, keys, rank, steps)
    ref_logits = reference_steps(ref, keys, steps)
    _check_against(dmp, ref, logits, ref_logits, rank, batch, where)
    dmp.fused_optimizer.lr = 0.5
    return float(dmp.fused_optimizer.lr or 0.0)


# ---- resharding ---------------------------------------------------------------------------
def save_body(rank: int, world_size: int, folder: str, plan_types: Any) -> dict[str, Any]:
    """Train one step sharded, save a checkpoint; return the full tables after the step."""
    model, keys = make_model("exact_adagrad", seed=5)
    plan = forced_plan(model.ebc.embedding_bag_configs(), world_size, plan_types)
    dmp = DistributedModelParallel(model, plan)
    sharded_steps(dmp, keys, rank, [make_batches(golden_tables(), (4,) * world_size, 20)])
    head = {k: v.detach().clone() for k, v in _head(dmp).state_dict().items()}
    path = save_sharded(folder, 1, dmp, head, {}, {"epoch": 0},
                        {"plan": plan.to_dict()})
    return {"path": str(path), "tables": gather_table_weights(dmp), "head": head}


def resume_body(rank: int, world_size: int, path: str, saved: dict[str, Any],
                plan_types: Any) -> bool:
    """Load a checkpoint from another world size/plan; check weights, then one more step."""
    where = f"resume on {world_size} ranks ({plan_types}), rank {rank}"
    model, keys = make_model("exact_adagrad", seed=99)      # other initial weights
    plan = forced_plan(model.ebc.embedding_bag_configs(), world_size, plan_types)
    dmp = DistributedModelParallel(model, plan)
    load_sharded(path, dmp)
    _head(dmp).load_state_dict(saved["head"])
    loaded = gather_table_weights(dmp)
    for name, expected in saved["tables"].items():
        torch.testing.assert_close(loaded[name], expected, rtol=0, atol=0,
                                   msg=_say(f"{where}: table {name} as loaded: "))
    # the unsharded model from the same checkpoint (weights and optimizer state), then a step
    ref, _ = make_model("exact_adagrad", seed=98)
    tables = ref.ebc.embedding_bag_configs()
    full = ckpt.load_table_shards(path, [(t.name, 0, 0, t.num_embeddings, t.embedding_dim)
                                         for t in tables])
    ref.ebc.load_embedding_bag_weights({s.table: s.weight for s in full})
    ref.ebc.load_optimizer_state({s.table: s.optimizer_state for s in full})
    ref.head.load_state_dict(saved["head"])
    steps = [make_batches(golden_tables(), (4,) * world_size, 21)]
    logits = sharded_steps(dmp, keys, rank, steps)
    _check_against(dmp, ref, logits, reference_steps(ref, keys, steps), rank,
                   (4,) * world_size, where)
    return True


# ---- failures -------------------------------------------------------------------------------
#: When this rank started the work under test (after imports and model building): the
#: seconds a survivor reports run from here to the error it raised.
_step_started = 0.0


def _start_clock() -> None:
    global _step_started
    _step_started = time.monotonic()


def _rank_main(rank: int, world_size: int, port: int, timeout_s: float,
               fn: Callable[..., Any], args: tuple[Any, ...], results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    global _step_started
    _step_started = time.monotonic()
    try:
        comm.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        with comm.fail_fast():
            value = fn(rank, world_size, *args)
        results[rank] = ("ok", repr(value), time.monotonic() - _step_started)
    except BaseException as exc:
        results[rank] = (type(exc).__name__, f"{exc}\n{traceback.format_exc()}",
                         time.monotonic() - _step_started)
        os._exit(1)  # leave at once, as a crashing rank would (no group teardown)
    dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int, args: tuple[Any, ...] = (),
              timeout_s: float = 30.0, wait_s: float = 120.0) -> dict[int, tuple[Any, ...]]:
    """Run ``fn`` on ``world_size`` ranks; wait for every one of them, dead or alive.

    Returns:
        rank -> (status, message, seconds) for ranks that reported; a rank that was killed
        reports nothing.
    """
    ctx = mp.get_context("spawn")
    manager = ctx.Manager()
    results = manager.dict()
    port = free_port()
    procs = [ctx.Process(target=_rank_main,
                         args=(r, world_size, port, timeout_s, fn, args, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + wait_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    out = dict(results)
    manager.shutdown()
    return out


def kill_mid_step_body(rank: int, world_size: int, victim: int) -> None:
    """Rank ``victim`` dies (os._exit) inside the forward, after the input distribution."""
    model, keys = make_model("exact_rowwise_adagrad", seed=1)
    plan = forced_plan(model.ebc.embedding_bag_configs(), world_size, "row_wise")
    dmp = DistributedModelParallel(model, plan)
    if rank == victim:
        for kernel in dmp.sharded_modules()[0].fused_lookups():
            kernel.register_forward_pre_hook(lambda *_: os._exit(9))
    batches = make_batches(golden_tables(), (4,) * world_size, 0)
    _start_clock()
    for _ in range(3):
        dmp(batches[rank], keys).sum().backward()


def raise_mid_step_body(rank: int, world_size: int, victim: int) -> None:
    """Rank ``victim`` raises (a bad id) before its first collective; the others wait in it."""
    model, keys = make_model("exact_rowwise_adagrad", seed=1)
    plan = forced_plan(model.ebc.embedding_bag_configs(), world_size, "table_wise")
    dmp = DistributedModelParallel(model, plan)
    batches = make_batches(golden_tables(), (4,) * world_size, 0)
    _start_clock()
    if rank == victim:
        raise ValueError("feature f0 has id 10**9, outside table t0's 37 rows")
    dmp(batches[rank], keys).sum().backward()


def kill_in_checkpoint_body(rank: int, world_size: int, folder: str, victim: int) -> None:
    """Rank ``victim`` dies after writing its pieces, before the checkpoint is complete."""
    model, keys = make_model("exact_rowwise_adagrad", seed=1)
    plan = forced_plan(model.ebc.embedding_bag_configs(), world_size, "row_wise")
    dmp = DistributedModelParallel(model, plan)
    if rank == victim:
        checkpoint_format._gather_pieces = lambda *a, **k: os._exit(9)  # type: ignore[assignment]
    _start_clock()
    save_sharded(Path(folder), 7, dmp, {}, {}, {"epoch": 0}, {})
