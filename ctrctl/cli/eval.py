"""``ctrctl eval``: metrics, calibration, segments, baselines and gates for a trained model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
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
    stdout,
    tracker_from,
)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.5f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _summary(metrics: dict[str, Any], segments: dict[str, list[dict[str, Any]]]) -> None:
    table = Table(title=f"eval {metrics['split']}: {metrics['rows']:,} rows")
    table.add_column("metric")
    table.add_column("model", justify="right")
    table.add_column("baseline", justify="right")
    bound = metrics.get("auc_bound")
    auc = _fmt(metrics["auc"]) + (f" ±{bound:.1e}" if metrics["auc_mode"] == "binned" else "")
    table.add_row("AUC", auc, _fmt(metrics.get("baseline_feature_auc")))
    table.add_row("PR-AUC", _fmt(metrics["pr_auc"]), "")
    table.add_row("logloss", _fmt(metrics["logloss"]),
                  _fmt(metrics.get("baseline_feature_logloss")))
    for key, label in (("ne", "NE"), ("calibration", "calibration"), ("ece", "ECE"),
                       ("label_rate", "label rate")):
        table.add_row(label, _fmt(metrics[key]), "")
    console.print(table)
    if metrics.get("baseline_feature"):
        console.print(f"baseline: smoothed training CTR of {metrics['baseline_feature']}; "
                      f"AUC lift {_fmt(metrics.get('auc_lift'))}")
    if metrics.get("checkpoint_finished") is False:
        console.print(f"[yellow]warning:[/] the run did not finish: this is its checkpoint "
                      f"of step {metrics['checkpoint_step']:,}, not its final model")
    for key, why in metrics.items():
        if key.startswith("undefined_"):
            console.print(f"[yellow]{key[10:]} undefined:[/] {why}")
    for feature, rows in segments.items():
        seg = Table(title=f"by {feature} (largest {min(len(rows), 10)} of {len(rows)})")
        for name in ("segment", "rows", "label rate", "AUC", "logloss", "calibration"):
            seg.add_column(name, justify="left" if name == "segment" else "right")
        for r in rows[:10]:
            seg.add_row(str(r["segment"]), _fmt(r["rows"]), _fmt(r["label_rate"]),
                        _fmt(r["auc"]), _fmt(r["logloss"]), _fmt(r["calibration"]))
        console.print(seg)


def eval_command(
    out: OutDir,
    checkpoint: Annotated[Path | None, typer.Option(
        help="Training output, checkpoints folder or step folder to score with.")] = None,
    dataset: Annotated[Path | None, typer.Option(
        help="Preprocessed dataset folder (default: the one the checkpoint was trained on).")] = None,
    predictions: Annotated[Path | None, typer.Option(
        help="Parquet with label and score columns to evaluate instead of a checkpoint.")] = None,
    split: Annotated[str, typer.Option(help="Dataset split to evaluate.")] = "test",
    segment_by: Annotated[list[str] | None, typer.Option(
        "--segment-by", help="Also report metrics per value of this feature; repeatable.")] = None,
    gate: Annotated[list[str] | None, typer.Option(
        "--gate", help="Threshold such as auc>=0.70 or calibration=1.0+-0.05; repeatable. "
        "A failed gate exits with code 3.")] = None,
    save_predictions: Annotated[bool, typer.Option(
        "--save-predictions", help="Also write the evaluated labels and scores as Parquet, "
        "with each row's position in the split (row).")] = False,
    keep: Annotated[str | None, typer.Option(
        help="Feature columns to copy beside each saved prediction, e.g. C1,C2 "
        "(with --save-predictions).")] = None,
    no_baselines: Annotated[bool, typer.Option(
        "--no-baselines", help="Skip the base-rate and per-feature CTR baselines.")] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Scoring batch size.")] = 8192,
    num_bins: Annotated[int, typer.Option(
        help="Score-histogram bins for streaming AUC (its error bound is reported).")] = 1 << 20,
    exact_limit: Annotated[int, typer.Option(
        help="Up to this many rows, AUC/PR-AUC/ECE are exact (sorted); beyond, binned.")] = 10_000_000,
    ece_bins: Annotated[int, typer.Option(help="Equal-mass bins for ECE and the diagram.")] = 20,
    nproc_per_node: Annotated[int, typer.Option(
        "--nproc-per-node", min=1, help="Processes to score with (torchrun, gloo on CPU).")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print metrics.json to stdout.")] = False,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Pipeline YAML whose eval.gates apply when no --gate is given.")] = None,
    overwrite: Overwrite = False,
    tracking_uri: TrackingUri = None,
    no_track: NoTrack = False,
    experiment: Experiment = "ctrctl",
) -> None:
    """Evaluate a checkpoint (or a predictions file) on a dataset split."""
    from ctrctl.distributed.launch import close_process_group, init_process_group
    from ctrctl.evaluation import launch as dist_launch
    from ctrctl.evaluation.evaluate import evaluate, gates_from_output
    from ctrctl.evaluation.gates import parse_gates, raise_for_failures
    from ctrctl.io import check_destination

    parse_gates(gate or [])  # a bad gate fails here, before anything runs
    if not gate and config is not None:
        from ctrctl.config import load_config
        from ctrctl.evaluation.gates import gates_from_mapping

        gate = [str(g) for g in gates_from_mapping(load_config(config).eval.gates)]
    child = bool(os.environ.get(dist_launch.CHILD_ENV))  # the launcher holds the lock
    with locked(None if child else out, "eval"):
        if dist_launch.needs_launch(nproc_per_node):
            check_destination(out, overwrite)
            code = dist_launch.launch_eval(_child_args(locals()), nproc_per_node)
            gates_from_output(out, code)  # raises GateError / DistributedError
            metrics = json.loads((out / "metrics.json").read_text())
            _summary(metrics, {})
            if as_json:
                stdout.print_json(data=metrics)
            return
        distributed = init_process_group()
        rank = int(os.environ.get("RANK", "0")) if distributed else 0
        completed = False
        try:
            result = evaluate(
                out, checkpoint=checkpoint, dataset=dataset, predictions=predictions, split=split,
                segment_by=segment_by or (), gates=gate or (), save_predictions=save_predictions,
                keep=tuple(k.strip() for k in keep.split(",") if k.strip()) if keep else (),
                baselines=not no_baselines, overwrite=overwrite, batch_size=batch_size,
                num_bins=num_bins, exact_limit=exact_limit, ece_bins=ece_bins,
                progress=make_progress() if rank == 0 else None,
                tracker=tracker_from(no_track or rank != 0, tracking_uri, experiment),
                gates_raise=False,
            )
            completed = True
        finally:
            if distributed:
                close_process_group(synchronize=completed)
        if os.environ.get(dist_launch.CHILD_ENV):
            return  # the launching process reports, from gates.json
        if rank == 0:
            _summary(result.metrics, result.segments)
            for g in result.gates:
                console.print(f"[{'green' if g.passed else 'red'}]gate[/] {g.describe()}")
            if as_json:
                stdout.print_json(data=result.metrics)
        raise_for_failures(result.gates)


def _child_args(values: dict[str, Any]) -> list[str]:
    """The same command for each torchrun child, without --nproc-per-node."""
    args = ["eval", "--out", str(values["out"]), "--split", values["split"],
            "--batch-size", str(values["batch_size"]), "--num-bins", str(values["num_bins"]),
            "--exact-limit", str(values["exact_limit"]), "--ece-bins", str(values["ece_bins"]),
            "--experiment", values["experiment"]]
    for name in ("checkpoint", "dataset", "predictions", "tracking_uri", "keep"):
        if values[name] is not None:
            args += [f"--{name.replace('_', '-')}", str(values[name])]
    for name in ("segment_by", "gate"):
        for item in values[name] or []:
            args += [f"--{name.replace('_', '-')}", item]
    for name in ("save_predictions", "no_baselines", "overwrite", "no_track"):
        if values[name]:
            args.append(f"--{name.replace('_', '-')}")
    return args


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
