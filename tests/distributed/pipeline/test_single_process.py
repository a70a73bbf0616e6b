"""Pipelines in one process: every batch drained, cached tables' rows prefetched (no forward
misses, the weights of ``base``), the stages traced, bad names refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ctrctl.distributed.pipeline import (
    PIPELINES,
    Tracer,
    choose_pipeline,
    make_pipeline,
    write_trace,
)
from ctrctl.errors import ConfigError
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.testing.pipelines import DIM, compare, make_batch, make_dlrm, train_with

CACHED_TABLES = [EmbeddingBagConfig("t0", 400, DIM, ("f0", "f1")),
                 EmbeddingBagConfig("t1", 60, DIM, ("f2",))]


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    ebc = model.sparse_arch
    ebc.flush()
    out = {f"table.{k}": v.detach().clone() for k, v in ebc.embedding_bag_weights().items()}
    out.update({f"dense.{k}": v.detach().clone() for k, v in model.state_dict().items()
                if not k.startswith("sparse_arch")})
    return out


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_batch_is_trained_once_in_order(name: str) -> None:
    model = make_dlrm()
    batches = [make_batch(s, 0) for s in range(7)]
    losses = train_with(name, model, batches, **({"start_step": 2} if name == "semi-sync"
                                                 else {}))
    assert losses.numel() == 7 and bool(torch.isfinite(losses).all())


@pytest.mark.parametrize("kind", ["exact_rowwise_adagrad", "exact_sgd"])
def test_prefetch_pipeline_never_misses_and_trains_as_base(kind: str) -> None:
    batches = [make_batch(s, 0, tables=CACHED_TABLES) for s in range(40)]
    runs, misses = {}, {}
    for name in ("base", "prefetch"):
        # a cache of a quarter of t0's rows: batches keep evicting and reading rows back
        model = make_dlrm(kind, cached_tables={"t0": 0.25}, tables=CACHED_TABLES)
        losses = train_with(name, model, batches)
        counters = model.sparse_arch.cache_counters()["t0"]
        misses[name] = counters["forward_misses"]
        assert counters["unique_misses"] > 0
        runs[name] = {"loss": losses, **_weights(model)}
        # no batch left holding rows once the run is over
        assert [b.locked_rows() for b in model.sparse_arch.bags if hasattr(b, "locked_rows")
                ] == [0]
    assert misses["prefetch"] == 0 and misses["base"] > 0, misses
    assert compare("prefetch", runs["prefetch"], runs["base"], kind)


def test_auto_picks_prefetch_for_cached_tables_and_sparse_dist_otherwise() -> None:
    assert choose_pipeline("auto", make_dlrm()) == "sparse-dist"
    cached = make_dlrm(cached_tables={"t0": 0.5}, tables=CACHED_TABLES)
    assert choose_pipeline("auto", cached) == "prefetch"
    with pytest.raises(ConfigError, match="unknown pipeline 'fast'"):
        make_pipeline("fast", cached, torch.optim.SGD(cached.parameters(), lr=0.1),
                      torch.device("cpu"))


def test_trace_names_each_stage_per_step_and_thread(tmp_path: Path) -> None:
    tracer = Tracer()
    train_with("sparse-dist", make_dlrm(), [make_batch(s, 0) for s in range(4)], tracer=tracer)
    path = write_trace(tmp_path / "trace.json", tracer)
    assert path is not None
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    steps = {e["args"].get("step") for e in spans if e["name"] == "forward"}
    assert steps == {0, 1, 2, 3}
    assert {"load", "forward", "backward", "optimizer"} <= {e["name"] for e in spans}
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert "ctrctl-load-ahead" in threads and "MainThread" in threads
    # loading ran on its own thread, overlapping the main thread's steps
    load_tid = next(e["tid"] for e in events if e["name"] == "thread_name"
                    and e["args"]["name"] == "ctrctl-load-ahead")
    assert all(e["tid"] == load_tid for e in spans if e["name"] == "load")
