"""``ctrctl run``: a pipeline YAML's steps in order, incremental, tracked, registered."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ctrctl.cli.common import Experiment, NoTrack, TrackingUri, console, tracker_from


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run_command(
        pipeline: Annotated[Path, typer.Argument(help="The pipeline YAML (pipelines/*.yaml).")],
        overrides: Annotated[list[str] | None, typer.Argument(
            help="key=value overrides, e.g. data.inputs=\\[train=day_0.tsv]")] = None,
        from_step: Annotated[str | None, typer.Option("--from", help="First step to run.")] = None,
        until_step: Annotated[str | None, typer.Option("--until", help="Last step to run.")
                              ] = None,
        force: Annotated[bool, typer.Option("--force", help="Rerun steps even when unchanged.")
                         ] = False,
        workdir: Annotated[Path | None, typer.Option(
            "--workdir", help="Working folder (default: runner.workdir or runs/<name>).")] = None,
        plain: Annotated[bool, typer.Option(
            "--plain", help="Plain lines as steps start and end and a table at the end, "
            "instead of the live table (the default when the output is not a terminal).")
                         ] = False,
        tracking_uri: TrackingUri = None,
        no_track: NoTrack = False,
        experiment: Experiment = "ctrctl",
    ) -> None:
        """Run synth, preprocess, plan, train, eval, quantize and register from one YAML.

        On a terminal a live table shows each step's state (pending, running, done,
        skipped (cached), failed), its duration and key metric; elsewhere, or with --plain,
        a line per step and a summary table.
        """
        from ctrctl.cli.run_view import LiveRunView, make_view
        from ctrctl.progress import LogProgress
        from ctrctl.runner import run_pipeline

        tracker = tracker_from(no_track, tracking_uri, experiment)
        view = make_view(console, plain)
        with view:
            result = run_pipeline(
                pipeline, overrides or (), workdir=workdir, from_step=from_step,
                until_step=until_step, force=force, tracker=tracker, tracking_uri=tracking_uri,
                progress=view.progress if isinstance(view, LiveRunView) else LogProgress(),
                observer=view)
        if result.parent_run_id:
            console.print(f"MLflow parent run {result.parent_run_id}", markup=False, highlight=False)
        report = getattr(result, "report", None)  # a schedule's per-day report
        if report is not None:
            console.print(f"report {report}", markup=False, highlight=False)
        if result.model_uri:
            console.print(f"model {result.model_uri}", markup=False, highlight=False)
        if not result.gates_passed:
            console.print("[bold red]a gate failed[/]: the alias was not moved", highlight=False)
        raise typer.Exit(result.exit_code)
