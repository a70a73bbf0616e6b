"""``ctrctl monitor``: drift, calibration and alarms for a model on new or served rows."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ctrctl.cli.common import Experiment, NoTrack, OutDir, TrackingUri, console, tracker_from


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


def monitor_command(
    model: Annotated[str, typer.Option(
        help="Training checkpoint, export folder, or models:/NAME@ALIAS (the served model); "
        "its training split's statistics are the reference.")],
    out: OutDir,
    dataset: Annotated[Path | None, typer.Option(
        help="Preprocessed dataset folder to judge the model on (with --split).")] = None,
    split: Annotated[str | None, typer.Option(help="The split of --dataset.")] = None,
    requests: Annotated[Path | None, typer.Option(
        help="`ctrctl serve --log-dir` folder: the served rows and their scores (with "
        "--labels).")] = None,
    labels: Annotated[Path | None, typer.Option(
        help="Parquet of labels that arrived later: request_id, row (the row's position in "
        "its request), label.")] = None,
    segment_by: Annotated[str | None, typer.Option(
        help="Report AUC, logloss and calibration per value of this feature.")] = None,
    gate: Annotated[list[str] | None, typer.Option(
        help="Alarm threshold, e.g. 'psi.max<=0.2' or 'calibration=1.0+-0.1'; repeatable; "
        "exit code 3 when one is breached. Names: psi.max, psi.mean, score.psi, "
        "score.mean_shift, missing.max, default_rate.max, staleness_s.max, auc, logloss, "
        "calibration, ece, rows, labelled_rows.")] = None,
    tracking_uri: TrackingUri = None,
    no_track: NoTrack = False,
    experiment: Experiment = "ctrctl",
) -> None:
    """Drift (PSI per feature and of the scores) against the model's training split, and
    AUC, logloss, calibration and ECE on labelled rows; metrics.json and plots in --out.

    Either a dataset split (--dataset, --split) or served traffic (--requests joined by
    request id with --labels). With --gate, exits 3 on a breach (for cron or CI alarms).
    """
    from ctrctl.monitoring import monitor

    tracker = tracker_from(no_track, tracking_uri, experiment)
    result = monitor(model, out, dataset=dataset, split=split, requests=requests,
                     labels=labels, segment_by=segment_by, gates=gate or (), tracker=tracker,
                     tracking_uri=tracking_uri)
    _show(result.metrics)
    console.print(f"metrics: {out / 'metrics.json'}", markup=False)


def _show(m: dict[str, Any]) -> None:
    table = Table(title=f"monitor {m['model']['name']} ({m['model']['version']}): "
                        f"{m['rows']:,} rows, {m['labelled_rows']:,} labelled")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("auc", "logloss", "calibration", "ece", "label_rate", "mean_score"):
        table.add_row(key, _fmt(m.get(key)))
    table.add_row(f"psi.max ({m['psi']['max_feature']})", _fmt(m["psi"]["max"]))
    table.add_row("psi.mean", _fmt(m["psi"]["mean"]))
    table.add_row("score.psi", _fmt(m["score"]["psi"]))
    table.add_row("score.mean_shift", _fmt(m["score"]["mean_shift"]))
    for source, age in m["staleness_s"].items():
        table.add_row(f"staleness_s.{source}", _fmt(age))
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command("monitor")(monitor_command)
