"""``tune``: an Optuna search over a pipeline's settings, judged on the val split.

The study lives in ``DIR/study.db`` (sqlite, Optuna's RDB storage), so a killed search
resumes where it stopped: a rerun on the same folder loads the study, marks the trial that
was running when the process died as FAIL, queues its values again, and runs only the trials
still missing (completed and pruned trials count; none is run twice). The output lock of
``DIR`` refuses a second search on it while one runs.

Sampler: TPE, seeded (``seed``); its first trials are random (a third of the budget, 3 to
10), and trial 0 is the base config itself whenever its values lie in the space (null and
``auto`` settings as they resolve on the dataset), so the
search never reports worse than the config it started from. Pruner: ``median`` (a trial
below the median of the others at the same validation step stops, after 3 finished trials)
or ``halving`` (successive halving over the validation steps), or ``none``.

Example:
    >>> result = tune(TuneRequest(dataset=Path("data/avazu"), out=Path("runs/tune"),
    ...                           trials=12, timeout_s=900))
    >>> result.best_value, result.best_params
"""

from __future__ import annotations

import contextlib
import json
import logging
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ctrctl.config import PipelineConfig, apply_overrides, load_config, parse_config
from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import ConfigError, CtrctlError
from ctrctl.io import check_output_location, output_lock
from ctrctl.tracking import Tracker
from ctrctl.training.sizes import auto_batch_size
from ctrctl.tuning.outputs import write_best, write_plots, write_trials
from ctrctl.tuning.recheck import describe, recheck
from ctrctl.tuning.space import (
    Param,
    default_space,
    load_space,
    overrides_for,
    space_from_mapping,
    values_of,
)
from ctrctl.tuning.trial import (
    STUDY_NAME,
    TrialTarget,
    read_manifest,
    run_trial,
    storage_url,
    training_view,
    write_trial_config,
)

__all__ = ["METRICS", "PRUNERS", "TuneRequest", "TuneResult", "make_objective", "open_study",
           "tune"]

logger = logging.getLogger(__name__)

#: The metrics a search may optimise, and which way is better.
METRICS: dict[str, Literal["minimize", "maximize"]] = {"val.logloss": "minimize",
                                                        "val.auc": "maximize"}
PRUNERS = ("median", "halving", "none")


@dataclass(frozen=True)
class TuneRequest:
    """What to search.

    Attributes:
        dataset: the preprocessed dataset (it needs a val split).
        out: the tune folder (study.db, trials/, best.yaml, best/, trials.parquet, plots).
        config: the base pipeline YAML (None: the built-in defaults).
        overrides: ``key=value`` overrides on the base config.
        trials: finished trials (complete or pruned) the study should hold.
        timeout_s: start no trial after this many seconds of this call (None: no limit).
        metric: ``val.logloss`` or ``val.auc``.
        space: a ``--space`` YAML, or its mapping (None or empty: the default space,
            :func:`~ctrctl.tuning.space.default_space`).
        seed: the sampler's seed.
        pruner: ``median``, ``halving`` or ``none``.
        parallel: trials at once, each on ``cores / parallel`` threads.
        nproc_per_node: processes per trial (through the training launcher).
        finalists: the best completed trials retrained on fresh val samples after the
            search, with the base config's trial (0: the best val metric wins unchecked;
            :mod:`~ctrctl.tuning.recheck`).
        holdouts: the fresh val samples each finalist is trained on.
    """

    dataset: Path
    out: Path
    config: Path | None = None
    overrides: tuple[str, ...] = ()
    trials: int = 20
    timeout_s: float | None = None
    metric: str = "val.logloss"
    space: Path | dict[str, Any] | None = None
    seed: int = 0
    pruner: str = "median"
    parallel: int = 1
    nproc_per_node: int = 1
    finalists: int = 3
    holdouts: int = 2


@dataclass(frozen=True)
class TuneResult:
    """What :func:`tune` found.

    Attributes:
        best_value: the best trial's val metric (None: no trial completed).
        best_params: its searched values.
        best_number: its trial number.
        counts: trials by state (``COMPLETE``, ``PRUNED``, ``FAIL`` ...).
        seconds_per_trial: median wall time of the finished trials.
        parent_run_id: the MLflow run holding one child run per trial.
        recheck: the finalists' val metrics (their own, then one per holdout) and means,
            best first; the first is the best trial.
    """

    out: Path
    metric: str
    best_value: float | None
    best_params: dict[str, Any]
    best_number: int | None
    best_yaml: Path | None
    best: Path | None
    trials_path: Path
    plots: list[Path]
    counts: dict[str, int]
    seconds_per_trial: float | None
    parent_run_id: str | None = None
    space: list[str] = field(default_factory=list)
    recheck: list[dict[str, Any]] = field(default_factory=list)


def _pruner(name: str, trials: int) -> Any:
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=min(3, max(trials - 1, 1)))
    if name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def open_study(out: Path, metric: str, seed: int, pruner: str, trials: int) -> Any:
    """Create or load the study in ``out/study.db``.

    Raises:
        ConfigError: the folder's study optimises another metric.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out.mkdir(parents=True, exist_ok=True)
    sampler = optuna.samplers.TPESampler(seed=seed,
                                         n_startup_trials=min(10, max(3, trials // 3)))
    study = optuna.create_study(storage=storage_url(out), study_name=STUDY_NAME,
                                direction=METRICS[metric], sampler=sampler,
                                pruner=_pruner(pruner, trials), load_if_exists=True)
    known = study.user_attrs.get("metric")
    if known is None:
        study.set_user_attr("metric", metric)
    elif known != metric:
        raise ConfigError(f"the study in this folder optimises {known}, not {metric}",
                          where=str(out), hint=f"pass --metric {known} or another --out")
    return study


def _recover(study: Any) -> list[int]:
    """Trials left RUNNING by a killed process: marked FAIL and queued again (same values)."""
    from optuna.trial import TrialState

    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        study.enqueue_trial(t.params, user_attrs={"requeued_from": t.number})
        logger.warning("trial %d was cut off (the search was killed): marked FAIL and "
                       "queued again", t.number)
    return [t.number for t in stale]


def _finished(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False,
                                states=(TrialState.COMPLETE, TrialState.PRUNED)))


def make_objective(target: TrialTarget, base: PipelineConfig, space: Sequence[Param],
                   tracker: Tracker | None = None) -> Callable[[Any], float]:
    """The function Optuna calls per trial: draw values, train, return the val metric."""
    out = Path(target.out)

    def objective(trial: Any) -> float:
        values = {p.key: p.suggest(trial) for p in space}
        config = parse_config(apply_overrides(base.to_dict(), overrides_for(base, values)),
                              where=f"trial {trial.number}")
        path = write_trial_config(out, trial.number, config)
        trial.set_user_attr("config", str(path.with_suffix(".json")))
        outcome = run_trial(trial, target, config, path, tracker)
        return outcome.metrics[target.metric]

    return objective


def _base(request: TuneRequest) -> PipelineConfig:
    if request.metric not in METRICS:
        raise ConfigError(f"unknown metric {request.metric!r}", where="--metric",
                          hint=f"use one of {', '.join(METRICS)}")
    if request.pruner not in PRUNERS:
        raise ConfigError(f"unknown pruner {request.pruner!r}", where="--pruner",
                          hint=f"use one of {', '.join(PRUNERS)}")
    if request.trials < 1 or request.parallel < 1 or request.nproc_per_node < 1:
        raise ConfigError("--trials, --parallel and --nproc-per-node must be at least 1")
    if request.finalists < 0 or request.holdouts < 0:
        raise ConfigError("--finalists and --holdouts must be 0 or more")
    # Early stopping watches the searched metric, so each trial keeps its best weights by it.
    key = request.metric.removeprefix("val.")
    return load_config(request.config, [*request.overrides,
                                        f"training.early_stopping.metric={key}",
                                        "training.early_stopping.mode=auto"])


def search_space(request: TuneRequest, base: PipelineConfig,
                 manifest: DatasetManifest) -> list[Param]:
    """The request's space: its file, its mapping, or the default one."""
    if isinstance(request.space, dict) and request.space:
        return space_from_mapping(request.space, base.to_dict())
    if isinstance(request.space, Path):
        return load_space(request.space, base.to_dict())
    return default_space(base, manifest, request.nproc_per_node)


def resolved_values(base: PipelineConfig, manifest: DatasetManifest,
                    world_size: int) -> dict[str, Any]:
    """What the base config's null and ``auto`` settings become on this dataset (the sized
    batch size, the interaction ``auto`` picks), so that its point in the space is found."""
    return {"training.batch_size": auto_batch_size(manifest.split("train").rows, world_size),
            "model.interaction": base.model.resolved_interaction(len(manifest.dense),
                                                                 len(manifest.sparse))}


def _run_parallel(request: TuneRequest, target: TrialTarget, remaining: int) -> None:
    """``parallel`` worker processes on the one study, the cores divided between them."""
    import os

    threads = max(1, (os.cpu_count() or 1) // request.parallel)
    spec_dir = request.out / ".workers"
    spec_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(request.parallel):
        spec = {"request": {k: str(v) if isinstance(v, Path) else v
                            for k, v in request.__dict__.items()},
                "target": json.loads(target.to_json()), "seed": request.seed + i,
                "total": request.trials, "threads": threads}
        path = spec_dir / f"{i}.json"
        path.write_text(json.dumps(spec))
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        procs.append(subprocess.Popen([sys.executable, "-m", "ctrctl.tuning.worker",
                                       str(path)], env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise CtrctlError(f"tune workers exited with {codes}", where=str(request.out),
                          hint="see their messages above; a rerun resumes the study")


def tune(request: TuneRequest, tracker: Tracker | None = None) -> TuneResult:
    """Search ``request``'s space on the val split; write best.yaml, best/, trials, plots.

    Raises:
        ConfigError: a bad metric, pruner, space key or range, or no val split.
        OutputLockedError: another search writes the folder.
    """
    tracker = tracker or Tracker()
    base = _base(request)
    out = check_output_location(request.out)
    manifest = read_manifest(request.dataset)
    world = request.nproc_per_node
    space = search_space(request, base, manifest)
    with output_lock(out, "tune"):
        view = training_view(Path(request.dataset), out / ".view", base.training.val_split)
        study = open_study(out, request.metric, request.seed, request.pruner, request.trials)
        requeued = _recover(study)
        if not study.trials:
            point = values_of(space, base, resolved_values(base, manifest, world))
            if point is not None:
                study.enqueue_trial(point, user_attrs={"base": True})
        remaining = max(0, request.trials - _finished(study))
        parent_id = study.user_attrs.get("mlflow_parent_run_id")
        # A resumed study logs on into its first parent run, so one run holds every trial.
        opened = tracker.run("tune", {"ctrctl.tune.folder": str(out)}) if parent_id is None \
            else contextlib.nullcontext(tracker.open(parent_id))
        with opened as parent:
            if parent.run_id and parent_id is None:
                study.set_user_attr("mlflow_parent_run_id", parent.run_id)
                parent_id = parent.run_id
            parent.log_params({"tune.trials": request.trials, "tune.metric": request.metric,
                               "tune.seed": request.seed, "tune.pruner": request.pruner,
                               "tune.space": "; ".join(p.describe() for p in space)})
            target = TrialTarget(view=str(view), out=str(out), metric=request.metric,
                                 nproc_per_node=request.nproc_per_node,
                                 track=tracker.enabled,
                                 tracking_uri=getattr(tracker, "tracking_uri", None),
                                 experiment=getattr(tracker, "experiment", "ctrctl"),
                                 parent_run_id=parent_id)
            logger.info("tune: %d trials to run (%d finished, %s requeued)", remaining,
                        request.trials - remaining, requeued or "none")
            if remaining and request.parallel > 1:
                _run_parallel(request, target, remaining)
                study = open_study(out, request.metric, request.seed, request.pruner,
                                   request.trials)
            elif remaining:
                import optuna

                study.optimize(make_objective(target, base, space, tracker.child(parent_id)),
                               n_trials=remaining, timeout=request.timeout_s,
                               callbacks=[optuna.study.MaxTrialsCallback(
                                   request.trials, states=(optuna.trial.TrialState.COMPLETE,
                                                           optuna.trial.TrialState.PRUNED))])
            result = _write_outputs(study, request, space, parent_id, view,
                                    base.training.val_split)
            if result.best_value is not None:
                parent.log_metrics({f"best.{request.metric}": result.best_value,
                                    "trials.pruned": float(result.counts.get("PRUNED", 0))})
                parent.log_params({f"best.{k}": v for k, v in result.best_params.items()})
                if len(result.recheck) > 1:
                    parent.log_metrics({f"recheck.trial_{c['trial']}.mean": c["mean"]
                                        for c in result.recheck})
                for path in [result.trials_path, *result.plots]:
                    parent.log_artifact(path)
                if result.best_yaml is not None:
                    parent.log_artifact(result.best_yaml)
    return result


def _write_outputs(study: Any, request: TuneRequest, space: Sequence[Param],
                   parent_id: str | None, view: Path, val_split: str) -> TuneResult:
    out = request.out
    trials_path = write_trials(study, out / "trials.parquet")
    plots = write_plots(study, out)
    counts: dict[str, int] = {}
    for t in study.trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    seconds = [float(t.user_attrs["seconds"]) for t in study.trials
               if "seconds" in t.user_attrs]
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    best_yaml = best = None
    best_value: float | None = None
    params: dict[str, Any] = {}
    number = None
    checked: list[dict[str, Any]] = []
    if done:
        number, candidates = recheck(study, out, view, request.metric, val_split,
                                     request.finalists, request.holdouts, request.seed)
        checked = describe(candidates)
        trial = study.trials[number]
        best_value, params = trial.value, dict(trial.params)
        config = parse_config(json.loads(Path(trial.user_attrs["config"]).read_text()))
        best_yaml, best = write_best(out, config, Path(trial.user_attrs["folder"]))
    else:
        logger.warning("no trial completed: no best.yaml")
    return TuneResult(out=out, metric=request.metric, best_value=best_value,
                      best_params=params, best_number=number, best_yaml=best_yaml, best=best,
                      trials_path=trials_path, plots=plots, counts=counts,
                      seconds_per_trial=statistics.median(seconds) if seconds else None,
                      parent_run_id=parent_id, space=[p.describe() for p in space],
                      recheck=checked)
