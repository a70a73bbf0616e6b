"""``ctrctl tune``: a hyperparameter search on the val split (Optuna, TPE, pruned)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ctrctl.cli.common import Experiment, NoTrack, OutDir, TrackingUri, console, tracker_from


def tune_command(
    dataset: Annotated[Path, typer.Option(
        help="Preprocessed dataset folder; it needs a val split (preprocess carves 10% of "
        "train by default). The test split is never read.")],
    out: OutDir,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="Overrides of the base config, such as training.epochs=5.",
        show_default=False)] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", "-c", help="Base pipeline YAML the trials start from (default: the "
        "built-in defaults).")] = None,
    trials: Annotated[int, typer.Option(
        min=1, help="Finished trials (complete or pruned) the study should hold; a rerun on "
        "the same --out resumes and runs only the missing ones.")] = 20,
    timeout_s: Annotated[float | None, typer.Option(
        "--timeout-s", min=0, help="Start no new trial after this many seconds.",
        show_default=False)] = None,
    metric: Annotated[str, typer.Option(
        help="The val metric to optimise: val.logloss (lower) or val.auc (higher).")]
        = "val.logloss",
    space: Annotated[Path | None, typer.Option(
        help="Search space YAML: pipeline keys -> {low, high, log} or {choices: [...]} "
        "(default: learning rates, embedding dim, interaction, MLP shapes, batch size, "
        "weight decay).", show_default=False)] = None,
    seed: Annotated[int, typer.Option(help="Seed of the TPE sampler.")] = 0,
    pruner: Annotated[str, typer.Option(
        help="Stops bad trials at their validations: median, halving (successive halving) "
        "or none.")] = "median",
    parallel: Annotated[int, typer.Option(
        min=1, help="Trials at once, the cores divided between them.")] = 1,
    nproc_per_node: Annotated[int, typer.Option(
        "--nproc-per-node", min=1, help="Processes per trial, through the training "
        "launcher.")] = 1,
    finalists: Annotated[int, typer.Option(
        min=0, help="After the search, the best completed trials that are trained again on "
        "fresh val samples together with the base config's trial; the best mean wins (0: "
        "the best val metric wins unchecked).")] = 3,
    holdouts: Annotated[int, typer.Option(
        min=0, help="Fresh val samples (drawn from train, as large as val) each finalist "
        "is trained on.")] = 2,
    tracking_uri: TrackingUri = None,
    no_track: NoTrack = False,
    experiment: Experiment = "ctrctl",
) -> None:
    """Search training settings on the val split; writes best.yaml, best/, trials.parquet
    and plots to --out.

    Each trial trains with early stopping on val; the pruner stops bad ones early. The
    study lives in --out/study.db: a killed search resumes when run again.
    """
    from ctrctl.tuning import TuneRequest, tune

    request = TuneRequest(dataset=dataset, out=out, config=config,
                          overrides=tuple(overrides or ()), trials=trials,
                          timeout_s=timeout_s, metric=metric, space=space, seed=seed,
                          pruner=pruner, parallel=parallel, nproc_per_node=nproc_per_node,
                          finalists=finalists, holdouts=holdouts)
    result = tune(request, tracker=tracker_from(no_track, tracking_uri, experiment))
    counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(result.counts.items()))
    per = f", {result.seconds_per_trial:.1f} s per trial" if result.seconds_per_trial else ""
    console.print(f"tune: {counts}{per}")
    if result.best_value is None:
        console.print("[yellow]no trial completed[/]: no best.yaml")
        raise typer.Exit(1)
    table = Table(title=f"best: trial {result.best_number}, {result.metric} "
                  f"{result.best_value:.5f}")
    table.add_column("setting")
    table.add_column("value", justify="right")
    for key, value in sorted(result.best_params.items()):
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console.print(table)
    if len(result.recheck) > 1:
        means = ", ".join(f"trial {c['trial']}{' (base)' if c['base'] else ''} "
                          f"{c['mean']:.5f}" for c in result.recheck)
        console.print(f"rechecked on fresh val samples (mean {result.metric}): {means}")
    console.print(f"best config: {escape(str(result.best_yaml))}; checkpoint: "
                  f"{escape(str(result.best))}")


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_command)
