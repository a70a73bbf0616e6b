"""``ctrctl plan``: shard the embedding tables over ranks from the cost model, and explain it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ctrctl.cli.common import (
    DevicePreset,
    Experiment,
    NoTrack,
    Overwrite,
    TrackingUri,
    console,
    locked,
    output_file,
    stdout,
    tracker_from,
)

GIB = 1024**3


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _memory(used: float, capacity: float) -> str:
    if capacity <= 0:
        return "-"
    return f"{used / GIB:.2f}/{capacity / GIB:.1f} GiB ({100 * used / capacity:.0f}%)"


def _render(outcome: Any, max_rows: int = 32) -> None:
    from ctrctl.distributed.planner import rank_rows, table_rows

    result, summary = outcome.result, outcome.summary
    topo = result.topology
    ranks = Table(title=f"per rank (estimated ms per step, batch {result.batch_size}/rank)")
    for name in ("rank", "hbm", "ddr", "fwd compute", "bwd compute", "fwd comms",
                 "bwd comms", "total", "shards"):
        ranks.add_column(name, justify="left" if name == "shards" else "right")
    rows = rank_rows(result)
    shown = sorted(rows, key=lambda r: -r["total"])[:max_rows] if len(rows) > max_rows \
        else rows
    for r in shown:
        ranks.add_row(str(r["rank"]), _memory(r["hbm_bytes"], r["hbm_capacity"]),
                      _memory(r["ddr_bytes"], r["ddr_capacity"]),
                      *(_ms(r[k]) for k in ("fwd_compute", "bwd_compute", "fwd_comms",
                                            "bwd_comms", "total")),
                      " ".join(f"{k}:{v}" for k, v in r["shards"].items()))
    if len(rows) > max_rows:
        ranks.caption = f"the {max_rows} slowest of {len(rows)} ranks"
    console.print(ranks)
    tables = Table(title="per table")
    for name in ("table", "rows x dim", "pooling", "type", "kernel", "ranks", "memory",
                 "cost ms"):
        tables.add_column(name, justify="right" if name in ("pooling", "cost ms") else "left")
    trows = table_rows(result)
    for t in trows[:max_rows]:
        rank_text = ",".join(map(str, t["ranks"][:6])) + ("..." if len(t["ranks"]) > 6 else "")
        tables.add_row(t["table"], f"{t['rows']:,} x {t['dim']}", f"{t['pooling_factor']:.1f}",
                       t["sharding_type"], t["compute_kernel"], rank_text,
                       f"{(t['hbm_bytes'] + t['ddr_bytes']) / GIB:.2f} GiB", _ms(t["cost"]))
    if len(trows) > max_rows:
        tables.caption = f"the {max_rows} most expensive of {len(trows)} tables"
    console.print(tables)
    slow = ", ".join(f"{d['table']} ({_ms(d['cost'])} ms)"
                     for d in summary["top_tables_slowest_rank"])
    full = ", ".join(f"{d['table']} ({d['memory'] / GIB:.2f} GiB)"
                     for d in summary["top_tables_fullest_rank"])
    console.print(
        f"{topo.world_size} ranks ({topo.local_world_size} per host, {topo.device}): estimated "
        f"{_ms(result.step_time)} ms per step (slowest rank {summary['slowest_rank']}, "
        f"collectives' latency {_ms(result.overhead)} ms), imbalance "
        f"{summary['imbalance']:.3f}, planned in {result.planning_seconds:.2f} s")
    if summary["figures"] == "preset" and topo.device == "cpu":
        console.print("[yellow]these are preset figures, not this machine's[/yellow]: on CPU "
                      "they can be several times off (on a 2-core machine the step measured "
                      "5-11x the estimate); `ctrctl plan --calibrate` measures this machine "
                      "in about a minute and writes topology.json for --topology")
    console.print(f"slowest rank {summary['slowest_rank']}: {slow}")
    console.print(f"fullest rank {summary['fullest_rank']} "
                  f"({100 * summary['fullest_rank_fraction']:.0f}% of memory): {full}")
    if outcome.sweep:
        sweep = Table(title="what more ranks buy")
        for name in ("world size", "fits", "batch/rank", "step ms", "samples/s", "fullest"):
            sweep.add_column(name, justify="right")
        for p in outcome.sweep:
            sweep.add_row(str(p.world_size), "yes" if p.fits else "no", str(p.batch_size),
                          _ms(p.step_time) if p.fits else "-",
                          f"{p.samples_per_second:,.0f}" if p.fits else "-",
                          f"{100 * p.fullest_fraction:.0f}%" if p.fits else p.reason[:40])
        console.print(sweep)


def plan_command(
    out: Annotated[Path | None, typer.Option("--out", "-o", callback=output_file,
                                             help="Where to write plan.json.")]
    = None,
    dataset: Annotated[Path | None, typer.Option(help="Preprocessed dataset folder.")] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Pipeline YAML (model, plan sections).")]
    = None,
    tables: Annotated[Path | None, typer.Option(
        help="Tables YAML: embedding_dim + num_embeddings_per_feature, or a tables list.")]
    = None,
    world_size: Annotated[str, typer.Option(
        help="Ranks, or 'auto' for the smallest that fits (with a sweep of larger ones).")]
    = "1",
    local_world_size: Annotated[int | None, typer.Option(help="Ranks per host.")] = None,
    device: Annotated[DevicePreset | None, typer.Option(
        help="cpu, cuda (TorchRec's GPU defaults) or a GPU preset.")]
    = None,
    hbm_gb: Annotated[float | None, typer.Option(help="Device memory per rank, GiB.")] = None,
    ddr_gb: Annotated[float | None, typer.Option(help="Host memory per rank, GiB.")] = None,
    batch_size: Annotated[int | None, typer.Option(
        help="Samples per rank per step (default: the config's global batch / ranks, or 512).")]
    = None,
    sharding_type: Annotated[str | None, typer.Option(
        help="Force one sharding type on every table.")] = None,
    embedding_dim: Annotated[int | None, typer.Option(
        min=1, help="Dim of tables from --dataset.")]
    = None,
    topology: Annotated[Path | None, typer.Option(
        help="topology.json with measured figures (written by --calibrate).")] = None,
    calibrate: Annotated[bool, typer.Option(
        "--calibrate", help="Measure this machine first and write --topology (default "
        "topology.json).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    overwrite: Overwrite = False,
    tracking_uri: TrackingUri = None,
    no_track: NoTrack = False,
    experiment: Experiment = "ctrctl",
) -> None:
    """Plan how the embedding tables are sharded over ranks, and explain the plan."""
    from ctrctl.errors import ConfigError
    from ctrctl.planning.request import PlanRequest, run_plan

    if calibrate:
        from ctrctl.planning.calibration import calibrate as measure

        topology = topology or Path("topology.json")
        with locked(topology, "plan --calibrate"):
            measured = measure(topology, overwrite=overwrite)
        console.print(f"calibrated this machine in {measured.calibrated['seconds']:.1f} s: "
                      f"wrote {topology}")
        if dataset is None and tables is None and config is None:
            return
    if world_size != "auto" and not world_size.isdigit():
        raise ConfigError(f"--world-size {world_size!r} is not a number or 'auto'")
    request = PlanRequest(
        dataset=dataset, config=config, tables=tables,
        world_size=None if world_size == "auto" else int(world_size),
        local_world_size=local_world_size, device=device.value if device else None, hbm_gb=hbm_gb, ddr_gb=ddr_gb,
        batch_size=batch_size, sharding_type=sharding_type, embedding_dim=embedding_dim,
        topology=topology, out=out, overwrite=overwrite)
    tracker = tracker_from(no_track, tracking_uri, experiment, background=True)
    with locked(out, "plan"):
        outcome = run_plan(request, tracker)
    _render(outcome)
    if out is not None:
        console.print(f"wrote {out}", markup=False)
    if as_json:
        stdout.print_json(data=outcome.summary)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)
