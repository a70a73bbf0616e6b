"""``ctrctl train``: a DLRM from a pipeline config on a preprocessed dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ctrctl.cli.common import (
    Experiment,
    NoTrack,
    OutDir,
    Overwrite,
    TrackingUri,
    console,
    locked,
    make_progress,
    tracker_from,
)
from ctrctl.progress import format_value


def train_command(
    dataset: Annotated[Path, typer.Option(help="Preprocessed dataset folder.")],
    out: OutDir,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="Config overrides such as training.batch_size=1024.", show_default=False)] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Pipeline YAML; keys it leaves out take the built-in "
        "defaults, ctrctl/defaults/default.yaml in the installed package (pipelines/"
        "default.yaml in a checkout). `ctrctl config show` prints them resolved.")] = None,
    resume: Annotated[bool, typer.Option(
        help="Continue from the latest checkpoint in --out, with the run's own settings "
        "(its config.json; overrides apply on top).")] = False,
    init_from: Annotated[str | None, typer.Option(
        help="Warm start: begin from this checkpoint (a step, checkpoints or training output "
        "folder) or registered model (models:/NAME@ALIAS, models:/NAME/VERSION): its dense "
        "and embedding weights and optimizer state, on this dataset, under any world size or "
        "plan; steps, schedule and data order start fresh. A hashed table that grew keeps its "
        "old rows; any other difference from the dataset is refused. training.init_from.",
        show_default=False)] = None,
    plan: Annotated[Path | None, typer.Option(
        help="Sharding plan (plan.json) for several processes.")] = None,
    nproc_per_node: Annotated[int, typer.Option(
        "--nproc-per-node", min=1, help="Processes on this node (1: train in this process); "
        "a collective waits CTRCTL_DIST_TIMEOUT_S (300) for its peers.")] = 1,
    nnodes: Annotated[int, typer.Option(
        min=1, help="Nodes taking part; they wait CTRCTL_JOIN_TIMEOUT_S (600) for each other "
        "to join.")] = 1,
    node_rank: Annotated[int, typer.Option(min=0, help="This node's index.")] = 0,
    rdzv_endpoint: Annotated[str | None, typer.Option(
        help="HOST:PORT every node meets at (several nodes).")] = None,
    pipeline: Annotated[str | None, typer.Option(
        help="Train pipeline: auto (prefetch with cached tables, else sparse-dist), base, "
        "sparse-dist, prefetch or semi-sync (changes the numerics); training.pipeline.",
        show_default=False)] = None,
    dedup: Annotated[str | None, typer.Option(
        help="Deduplicated lookups in sharded tables: auto (on for a batch whose distinct-bag "
        "share is below the measured threshold), on or off; training.dedup.",
        show_default=False)] = None,
    trace: Annotated[Path | None, typer.Option(
        help="Write a Chrome trace of the pipeline's stages (per step and thread) here.",
        show_default=False)] = None,
    overwrite: Overwrite = False,
    tracking_uri: TrackingUri = None,
    no_track: NoTrack = False,
    experiment: Experiment = "ctrctl",
) -> None:
    """Train a DLRM; checkpoints, metrics.json and config.json land in --out.

    Without --config: the built-in defaults (see --config); batch size, epochs (a cap) and validation cadence follow from the training rows, and early stopping on the val split ends the run with the best validation's weights.
    """
    from ctrctl.config import load_config
    from ctrctl.training.launch import TrainSpec, launch_training
    from ctrctl.training.loop import train
    from ctrctl.training.preflight import preflight
    from ctrctl.training.resume import resume_config, saved_config

    overrides = list(overrides or [])
    if pipeline is not None:
        overrides.append(f"training.pipeline={pipeline}")
    if init_from is not None:
        overrides.append(f"training.init_from={init_from}")
    if dedup is not None:
        overrides.append(f"training.dedup={dedup}")
    if trace is not None:
        overrides.append(f"training.trace={trace.resolve()}")
    cfg = resume_config(out, config, overrides) if resume else load_config(config, overrides)
    if resume and config is None:
        config = saved_config(out)  # the workers of a multi-process run read it too
    tracker = tracker_from(no_track, tracking_uri, experiment)  # a dead server fails here
    sharding = preflight(dataset, out, cfg, plan, nproc_per_node * nnodes, resume, overwrite)
    # One writer per output (per node when several nodes share one --out).
    with locked(out, "train", name=f"node{node_rank}" if nnodes > 1 else ""):
        if nproc_per_node * nnodes > 1:
            spec = TrainSpec(dataset=str(dataset), out=str(out), config=str(config) if config else None,
                             overrides=tuple(overrides or ()), resume=resume, overwrite=overwrite,
                             plan=str(plan) if plan else None, track=not no_track,
                             tracking_uri=tracking_uri, experiment=experiment,
                             # every rank resolves a models:/ warm start in this store
                             env={"MLFLOW_TRACKING_URI": tracking_uri} if tracking_uri else {})
            # A failed rank raises DistributedError naming it (distributed.launch).
            launch_training(spec, nproc_per_node, nnodes, node_rank, rdzv_endpoint)
            console.print(f"[green]trained[/] with {nproc_per_node * nnodes} processes -> {escape(str(out))}")
            return
        result = train(dataset, out, cfg, resume=resume, overwrite=overwrite,
                       plan=sharding,
                       tracker=tracker,
                       progress=make_progress())
        title = (f"train: already finished at step {result.step:,} ({result.stop_reason}), "
                 "nothing trained" if result.already_finished else
                 f"train: {result.step:,} steps, {result.samples_per_s:,.0f} samples/s")
        table = Table(title=title)
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in sorted(result.metrics.items()):
            table.add_row(key, format_value(key, value, digits=5))
        console.print(table)
        if result.cache:
            from ctrctl.training.cache_report import format_cache_report

            console.print("cached tables:")
            console.print(format_cache_report(result.cache), markup=False, highlight=False)
        console.print(f"checkpoint: {result.checkpoint}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
