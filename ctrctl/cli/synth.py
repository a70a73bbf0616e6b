"""``ctrctl synth``: synthetic Criteo/Avazu raw logs with a known click model."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ctrctl.cli.common import (
    Experiment,
    LogFormat,
    NoTrack,
    OutDir,
    Overwrite,
    TrackingUri,
    console,
    locked,
    make_progress,
    tracker_from,
)


def synth_command(
    out: OutDir,
    format: Annotated[LogFormat, typer.Option("--format", "-f", help="Log format.")] = (
        LogFormat.criteo
    ),
    rows: Annotated[int, typer.Option(min=1, help="Total rows over all splits.")] = 100_000,
    seed: Annotated[int, typer.Option(help="Seed: the same arguments give the same bytes.")] = 0,
    split: Annotated[
        list[str] | None,
        typer.Option(help="NAME=FRACTION, repeated (default train=0.8 val=0.1 test=0.1)."),
    ] = None,
    cardinality: Annotated[
        list[str] | None,
        typer.Option(help="FEATURE=DISTINCT_VALUES, repeated, e.g. C3=100000."),
    ] = None,
    overwrite: Overwrite = False,
    tracking_uri: TrackingUri = None,
    no_track: NoTrack = False,
    experiment: Experiment = "ctrctl",
) -> None:
    """Write synthetic click logs, their true click probabilities and the best AUC."""
    from ctrctl.data.synthetic import parse_assignments, synthesize

    tracker = tracker_from(no_track, tracking_uri, experiment)
    with locked(out, "synth"):
        result = synthesize(
            out,
            rows=rows,
            format=format.value,
            seed=seed,
            splits=parse_assignments(split, float, "--split") if split else None,
            cardinalities=parse_assignments(cardinality, int, "--cardinality") or None,
            overwrite=overwrite,
            progress=make_progress(),
            tracker=tracker,
        )
    table = Table(title=f"{result.format} logs in {result.out}")
    for name in ("split", "file", "rows", "label rate", "best AUC"):
        table.add_column(name, justify="left" if name in ("split", "file") else "right")
    for name, count in result.rows.items():
        table.add_row(
            name,
            result.files[name].name,
            f"{count:,}",
            f"{result.label_rate[name]:.4f}",
            f"{result.best_auc[name]:.4f}",
        )
    console.print(table)
    console.print(
        f"{result.total_rows:,} rows in {result.seconds:.2f} s "
        f"({result.rows_per_second:,.0f} rows/s)"
    )


def register(app: typer.Typer) -> None:
    app.command("synth")(synth_command)
