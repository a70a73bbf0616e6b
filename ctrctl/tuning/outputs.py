"""What a search leaves in its folder: ``best.yaml``, ``best/``, ``trials.parquet``, plots.

- ``best.yaml``: the base config with the best trial's values, resolved (a pipeline YAML
  that ``ctrctl train --config`` and ``ctrctl run`` accept);
- ``best/``: the best trial's training output (its final checkpoint holds the weights of its
  best validation step, as early stopping restored them);
- ``trials.parquet``: one row per trial: number, state, value, steps, seconds, params;
- ``history.png`` (metric against trial) and ``importances.png`` (fANOVA importances, with
  at least two finished trials), drawn by Optuna's matplotlib visualisation.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctrctl.config import PipelineConfig, dump_config
from ctrctl.io import staged_folder, write_text_atomic

__all__ = ["write_best", "write_plots", "write_trials"]

logger = logging.getLogger(__name__)


def write_trials(study: Any, path: Path) -> Path:
    """Every trial of ``study`` as one Parquet row (params as ``param.KEY`` columns)."""
    import polars as pl

    rows: list[dict[str, Any]] = []
    for t in study.get_trials(deepcopy=False):
        seconds = t.user_attrs.get("seconds")
        if seconds is None and t.datetime_start and t.datetime_complete:
            seconds = (t.datetime_complete - t.datetime_start).total_seconds()
        rows.append({
            "number": t.number, "state": t.state.name, "value": t.value,
            "steps": t.user_attrs.get("steps", t.last_step),
            "best_step": t.user_attrs.get("best_step"), "seconds": seconds,
            "pruned_at": t.last_step if t.state.name == "PRUNED" else None,
            **{f"param.{k}": str(v) if isinstance(v, str) else float(v)
               for k, v in t.params.items()},
        })
    frame = pl.DataFrame(rows, infer_schema_length=None)
    tmp = path.with_name(f".{path.name}.tmp")
    frame.write_parquet(tmp)
    tmp.replace(path)
    return path


def write_plots(study: Any, out: Path) -> list[Path]:
    """``history.png`` and (with two finished trials or more) ``importances.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vis

    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    plots: list[Path] = []
    drawers: list[tuple[str, Callable[[Any], Any]]] = [
        ("history.png", vis.plot_optimization_history)]
    if len(done) >= 2 and len({str(t.params) for t in done}) >= 2:
        drawers.append(("importances.png", vis.plot_param_importances))
    for name, draw in drawers:
        with warnings.catch_warnings():  # the matplotlib backend is "experimental"
            warnings.simplefilter("ignore")
            try:
                axes = draw(study)
            except (ValueError, RuntimeError) as exc:  # e.g. no variance to attribute
                logger.warning("no %s: %s", name, exc)
                continue
        figure: Any = axes.figure
        figure.tight_layout()
        path = out / name
        tmp = out / f".{name}.tmp.png"
        figure.savefig(tmp, dpi=100)
        plt.close(figure)
        tmp.replace(path)
        plots.append(path)
    return plots


def write_best(out: Path, config: PipelineConfig, trial_folder: Path) -> tuple[Path, Path]:
    """``best.yaml`` (the best trial's resolved config) and ``best/`` (its training output)."""
    best_yaml = out / "best.yaml"
    write_text_atomic(best_yaml, "# the best trial's settings, written by ctrctl tune\n"
                      + dump_config(config))
    best = out / "best"
    with staged_folder(best, overwrite=True) as staging:
        for item in trial_folder.iterdir():
            if item.name.startswith("."):
                continue
            target = staging / item.name
            if item.is_dir():
                shutil.copytree(item, target)
            else:
                shutil.copy2(item, target)
    return best_yaml, best
