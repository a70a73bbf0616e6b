"""``ctrctl run``: a pipeline YAML's steps in order, incremental, tracked, registered."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ctrctl.cli.common import Experiment, NoTrack, TrackingUri, console, make_progress, tracker_from


def _metric(outcome: Any) -> str:
    pair = outcome.key_metric
    if pair is None:
        return outcome.reason
    key, value = pair
    return f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"


def _line(outcome: Any) -> None:
    if outcome.status == "running":
        console.print(f"[bold]{outcome.name}[/]: running", highlight=False)
    elif outcome.status != "outside":
        took = f" in {outcome.seconds:.1f} s" if outcome.status == "ran" else ""
        console.print(f"[bold]{outcome.name}[/]: {outcome.status}{took} ({_metric(outcome)})",
                      highlight=False)


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run_command(
        pipeline: Annotated[Path, typer.Argument(help="The pipeline YAML (pipelines/*.yaml).")],
        overrides: Annotated[list[str] | None, typer.Argument(
            help="key=value overrides, e.g. data.inputs=[train=day_0.tsv]")] = None,
        from_step: Annotated[str | None, typer.Option("--from", help="First step to run.")] = None,
        until_step: Annotated[str | None, typer.Option("--until", help="Last step to run.")
                              ] = None,
        force: Annotated[bool, typer.Option("--force", help="Rerun steps even when unchanged.")
                         ] = False,
        workdir: Annotated[Path | None, typer.Option(
            "--workdir", help="Working folder (default: runner.workdir or runs/<name>).")] = None,
        tracking_uri: TrackingUri = None,
        no_track: NoTrack = False,
        experiment: Experiment = "ctrctl",
    ) -> None:
        """Run synth, preprocess, plan, train, eval, quantize and register from one YAML."""
        from ctrctl.runner import run_pipeline

        tracker = tracker_from(no_track, tracking_uri, experiment)
        result = run_pipeline(pipeline, overrides or (), workdir=workdir, from_step=from_step,
                              until_step=until_step, force=force, tracker=tracker,
                              tracking_uri=tracking_uri, progress=make_progress(),
                              on_step=_line)
        table = Table(title=f"ctrctl run {result.config.name} ({result.workdir})")
        for name in ("step", "status", "seconds", "key metric"):
            table.add_column(name, justify="right" if name == "seconds" else "left")
        for o in result.outcomes:
            table.add_row(o.name, o.status, f"{o.seconds:.1f}" if o.status == "ran" else "",
                          _metric(o))
        console.print(table)
        if result.parent_run_id:
            console.print(f"MLflow parent run {result.parent_run_id}", highlight=False)
        if result.model_uri:
            console.print(f"model {result.model_uri}", highlight=False)
        if not result.gates_passed:
            console.print("[bold red]a gate failed[/]: the alias was not moved", highlight=False)
        raise typer.Exit(result.exit_code)
