"""``ctrctl synth``: synthetic Criteo/Avazu raw logs with a known click model."""

from __future__ import annotations

from pathlib import Path
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
    format: Annotated[LogFormat, typer.Option(
        "--format", "-f", metavar="<format>",
        help="Log format: criteo, avazu, or two_tower (an interaction log from planted user "
             "and item factors, --cardinality users=N items=M, with the oracle's recall@K).")] = (
        LogFormat.criteo
    ),
    rows: Annotated[int, typer.Option(min=1, metavar="<int>", help="Total rows over all splits.")] = 100_000,
    seed: Annotated[int, typer.Option(help="Seed: the same arguments give the same bytes.")] = 0,
    split: Annotated[
        list[str] | None,
        typer.Option(help="NAME=FRACTION, repeated (default train=0.8 val=0.1 test=0.1)."),
    ] = None,
    cardinality: Annotated[
        list[str] | None,
        typer.Option(help="FEATURE=DISTINCT_VALUES, repeated, e.g. C3=100000."),
    ] = None,
    days: Annotated[
        int | None,
        typer.Option(min=2, metavar="<int>", help="Write a stream of days instead (day_1.csv ..): columns "
                     "click, day, hour, user (hex key), item (int key); --rows is split "
                     "evenly over the days and --format is ignored."),
    ] = None,
    new_ids_per_day: Annotated[
        int, typer.Option(min=0, metavar="<int>", help="With --days: users born each day after the first "
                          "(items: a quarter of it).")] = 2_000,
    popularity_drift: Annotated[
        float, typer.Option(min=0.0, metavar="<float>", help="With --days: daily decay rate R of an id's "
                            "popularity (weight x exp(-R x age in days)).")] = 0.3,
    overwrite: Overwrite = False,
    tracking_uri: TrackingUri = None,
    no_track: NoTrack = False,
    experiment: Experiment = "ctrctl",
) -> None:
    """Write synthetic click logs, their true click probabilities and the best AUC."""
    from ctrctl.data.synthetic import parse_assignments, synthesize

    if days is not None:
        _synth_days(out, days, rows, new_ids_per_day, popularity_drift, seed, overwrite)
        return
    if format == LogFormat.two_tower:
        _synth_two_tower(out, rows, seed, parse_assignments(cardinality, int, "--cardinality"),
                         overwrite)
        return
    tracker = tracker_from(no_track, tracking_uri, experiment, background=True)
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


def _synth_days(out: Path, days: int, rows: int, new_ids_per_day: int, drift: float,
                seed: int, overwrite: bool) -> None:
    from ctrctl.data.synthetic_days import synthesize_days

    with locked(out, "synth"):
        result = synthesize_days(out, days=days, rows_per_day=max(1, rows // days),
                                 new_ids_per_day=new_ids_per_day, popularity_drift=drift,
                                 seed=seed, overwrite=overwrite)
    table = Table(title=f"{days} days of logs in {result.out}")
    for name in ("day", "file", "rows", "label rate", "best AUC"):
        table.add_column(name, justify="left" if name == "file" else "right")
    for day, path in result.files.items():
        table.add_row(str(day), path.name, f"{result.rows[day]:,}",
                      f"{result.label_rate[day]:.4f}", f"{result.best_auc[day]:.4f}")
    console.print(table)
    console.print(f"distinct ids: {result.distinct}")


def _synth_two_tower(out: Path, rows: int, seed: int, sizes: dict[str, int],
                     overwrite: bool) -> None:
    from ctrctl.errors import ConfigError
    from ctrctl.retrieval.synthetic import synthesize_two_tower

    unknown = sorted(set(sizes) - {"users", "items"})
    if unknown:
        raise ConfigError(f"--cardinality {unknown[0]}: two_tower takes users= and items=")
    users = sizes.get("users", 2000)
    with locked(out, "synth"):
        result = synthesize_two_tower(out, users=users, items=sizes.get("items", 5000),
                                      per_user=max(rows // users, 3), seed=seed,
                                      overwrite=overwrite)
    oracle = ", ".join(f"{k} {v:.3f}" for k, v in result["oracle"].items())
    console.print(f"{result['rows']:,} interactions of {users:,} users in {out}; "
                  f"oracle {oracle}")


def register(app: typer.Typer) -> None:
    app.command("synth")(synth_command)
