"""``ctrctl eval``: metrics, calibration, segments, baselines and gates for a trained model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

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
                      f"AUC lift {_fmt(metrics.get('auc_lift'))}", markup=False)
    if metrics.get("checkpoint_finished") is False:
        console.print(f"[yellow]warning:[/] the run did not finish: this is its checkpoint "
                      f"of step {metrics['checkpoint_step']:,}, not its final model")
    for key, why in metrics.items():
        if key.startswith("undefined_"):
            console.print(f"[yellow]{key[10:]} undefined:[/] {escape(str(why))}")
    for feature, rows in segments.items():
        seg = Table(title=f"by {feature} (largest {min(len(rows), 10)} of {len(rows)})")
        for name in ("segment", "rows", "label rate", "AUC", "logloss", "calibration"):
            seg.add_column(name, justify="left" if name == "segment" else "right")
        for r in rows[:10]:
            seg.add_row(str(r["segment"]), _fmt(r["rows"]), _fmt(r["label_rate"]),
                        _fmt(r["auc"]), _fmt(r["logloss"]), _fmt(r["calibration"]))
        console.print(seg)


def _eval_retrieval(checkpoint: Path, out: Path, dataset: Path | None, split: str,
                    index: Path | None, baselines: bool, overwrite: bool, tracker: Any,
                    as_json: bool) -> None:
    from ctrctl.retrieval.evaluate import evaluate_retrieval

    with locked(out, "eval"):
        metrics = evaluate_retrieval(checkpoint, out, dataset=dataset, split=split,
                                     index=index, baselines=baselines, overwrite=overwrite,
                                     tracker=tracker)
    if as_json:
        typer.echo(json.dumps(metrics, indent=2))
        return
    table = Table(title=f"retrieval on {split}: {metrics['queries']:,} queries, "
                        f"{metrics['items']:,} items (full ranking)")
    table.add_column("metric")
    prefixes = [p for p in ("", "index.", "popularity.", "bpr.")
                if f"{p}recall@10" in metrics]
    for prefix in prefixes:
        table.add_column(prefix.rstrip(".") or "model", justify="right")
    for name in [k for k in metrics if k.startswith(("recall@", "ndcg@"))]:
        table.add_row(name, *[f"{metrics[p + name]:.4f}" for p in prefixes])
    console.print(table)


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
    index: Annotated[Path | None, typer.Option(
        help="Two-tower checkpoints: an index folder (ctrctl index) to rank through too "
             "(index.recall@K).")] = None,
    overwrite: Overwrite = False,
    tracking_uri: TrackingUri = None,
    no_track: NoTrack = False,
    experiment: Experiment = "ctrctl",
) -> None:
    """Evaluate a checkpoint (or a predictions file) on a dataset split.

    A two-tower checkpoint (model.kind: two_tower) is evaluated by full ranking of every
    item, the user's earlier items excluded: recall@K and NDCG@K (K 10, 50, 100) of the
    model, of --index, of popularity and of BPR matrix factorisation, in metrics.json.
    """
    from ctrctl.evaluation import launch as dist_launch
    from ctrctl.evaluation.evaluate import evaluate, gates_from_output
    from ctrctl.evaluation.gates import parse_gates, raise_for_failures
    from ctrctl.io import check_destination

    parse_gates(gate or [])  # a bad gate fails here, before anything runs
    if checkpoint is not None and predictions is None:
        from ctrctl.retrieval.evaluate import is_two_tower

        if is_two_tower(checkpoint):
            _eval_retrieval(checkpoint, out, dataset, split, index, not no_baselines,
                            overwrite, tracker_from(no_track, tracking_uri, experiment, background=True),
                            as_json)
            return
    if not gate and config is not None:
        from ctrctl.config import load_config
        from ctrctl.evaluation.gates import gates_from_mapping

        gate = [str(g) for g in gates_from_mapping(load_config(config).eval.gates)]
    with locked(out, "eval"):
        if dist_launch.needs_launch(nproc_per_node):
            check_destination(out, overwrite)
            spec = dist_launch.EvalSpec(
                out=str(out), checkpoint=_text(checkpoint), dataset=_text(dataset),
                predictions=_text(predictions), split=split, segment_by=tuple(segment_by or ()),
                gates=tuple(gate or ()), save_predictions=save_predictions,
                keep=_keep(keep), baselines=not no_baselines, overwrite=overwrite,
                batch_size=batch_size, num_bins=num_bins, exact_limit=exact_limit,
                ece_bins=ece_bins, track=not no_track, tracking_uri=tracking_uri,
                experiment=experiment)
            code = dist_launch.launch_eval(spec, nproc_per_node)
            gates_from_output(out, code)  # raises GateError / DistributedError
            metrics = json.loads((out / "metrics.json").read_text())
            _summary(metrics, {})
            if as_json:
                stdout.print_json(data=metrics)
            return
        result = evaluate(
            out, checkpoint=checkpoint, dataset=dataset, predictions=predictions, split=split,
            segment_by=segment_by or (), gates=gate or (), save_predictions=save_predictions,
            keep=_keep(keep), baselines=not no_baselines, overwrite=overwrite,
            batch_size=batch_size, num_bins=num_bins, exact_limit=exact_limit,
            ece_bins=ece_bins, progress=make_progress(),
            tracker=tracker_from(no_track, tracking_uri, experiment, background=True), gates_raise=False,
        )
        _summary(result.metrics, result.segments)
        for g in result.gates:
            console.print(f"[{'green' if g.passed else 'red'}]gate[/] {g.describe()}")
        if as_json:
            stdout.print_json(data=result.metrics)
        raise_for_failures(result.gates)


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _keep(keep: str | None) -> tuple[str, ...]:
    return tuple(k.strip() for k in keep.split(",") if k.strip()) if keep else ()


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
