"""``run_pipeline``: a pipeline YAML's steps in order, skipped when nothing they read changed."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ctrctl.config import PipelineConfig, load_config
from ctrctl.errors import CtrctlError
from ctrctl.io import check_output_location, output_lock, write_text_atomic
from ctrctl.progress import Progress
from ctrctl.runner.events import RunObserver
from ctrctl.runner.lineage import log_step_datasets
from ctrctl.runner.state import StateStore, StepState, step_key
from ctrctl.runner.steps import STEPS, Context, Step, check_step_name, steps
from ctrctl.runner.validate import check_pipeline
from ctrctl.tracking import Tracker

logger = logging.getLogger(__name__)

#: Exit code of a run whose eval gates failed (the CLI's convention for a failed gate).
GATE_FAILED_EXIT = 3
#: The figure each step's line and the summary table show.
KEY_METRICS = {"synth": "rows", "preprocess": "rows", "plan": "world_size",
               "tune": "best", "train": "val.auc", "index": "recall@100", "eval": "auc",
               "quantize": "bytes.ratio", "register": "model_uri"}
#: A two-tower pipeline's figure where the ranker's is absent.
RETRIEVAL_KEY_METRICS = {"train": "val.recall@100", "eval": "recall@100"}


@dataclass
class StepOutcome:
    """What happened to one step in this run.

    Attributes:
        name: the step.
        status: ``running`` (reported as it starts), ``ran``, ``skipped`` (unchanged since
            it last completed), ``unavailable`` (cannot run in this setup, with the reason),
            ``outside`` (before ``--from`` or after ``--until``), ``failed``.
        seconds: wall time of the step in this run.
        summary: what the step reported (a key metric first, its run id).
        reason: why it was skipped or unavailable.
    """

    name: str
    status: str
    seconds: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    @property
    def key_metric(self) -> tuple[str, Any] | None:
        """The step's headline figure (``KEY_METRICS``), when it reported one."""
        key = KEY_METRICS.get(self.name)
        if key and self.summary.get(key) is None:
            key = RETRIEVAL_KEY_METRICS.get(self.name, key)
        value = self.summary.get(key) if key else None
        return (key, value) if key and value is not None else None


@dataclass
class RunResult:
    """What :func:`run_pipeline` did.

    Attributes:
        workdir: the working folder.
        config: the resolved config.
        outcomes: one per step, in order.
        parent_run_id: the MLflow parent run (None without tracking).
        model_uri: the registered version (``models:/NAME/VERSION``) when registered, else
            the model the quantize step logged with tracking on.
        gates_passed: every eval gate held (True when there are none).
    """

    workdir: Path
    config: PipelineConfig
    outcomes: list[StepOutcome]
    parent_run_id: str | None = None
    model_uri: str | None = None
    gates_passed: bool = True

    def outcome(self, name: str) -> StepOutcome:
        return next(o for o in self.outcomes if o.name == name)

    @property
    def exit_code(self) -> int:
        return 0 if self.gates_passed else GATE_FAILED_EXIT


def _load(config: PipelineConfig | str | Path, overrides: Sequence[str]
          ) -> tuple[PipelineConfig, str | None]:
    if isinstance(config, PipelineConfig):
        if overrides:
            from ctrctl.config import apply_overrides, parse_config

            return parse_config(apply_overrides(config.to_dict(), overrides), "config"), None
        return config, None
    return load_config(config, overrides), str(config)


def _selected(name: str, from_step: str | None, until_step: str | None) -> bool:
    index = STEPS.index(name)
    start = STEPS.index(from_step) if from_step else 0
    stop = STEPS.index(until_step) if until_step else len(STEPS) - 1
    return start <= index <= stop


def run_pipeline(
    config: PipelineConfig | str | Path,
    overrides: Sequence[str] = (),
    *,
    workdir: str | Path | None = None,
    from_step: str | None = None,
    until_step: str | None = None,
    force: bool = False,
    tracker: Tracker | None = None,
    tracking_uri: str | None = None,
    progress: Progress | None = None,
    observer: RunObserver | None = None,
) -> RunResult:
    """Run a pipeline's steps (synth, preprocess, plan, tune, train, index, eval, quantize,
    register).

    The whole config is checked first (:func:`ctrctl.runner.validate.check_pipeline`). Each
    step whose inputs (content hashes) and settings are unchanged since it last completed,
    and whose outputs are intact, is skipped; a train step that was interrupted resumes
    from its last checkpoint. With tracking, one parent run holds the resolved YAML and one
    child run per step; the splits each step read or wrote are logged as datasets.

    Args:
        config: a pipeline YAML or a config.
        overrides: ``key=value`` overrides.
        workdir: the working folder (default ``runner.workdir`` or ``runs/<name>``).
        from_step, until_step: run only this part of the steps.
        force: rerun the selected steps even when unchanged.
        tracker: MLflow tracking (default: none).
        tracking_uri: the tracker's URI, for steps run as separate processes.
        progress: progress of the steps' work.
        observer: told as the run and each step start and end
            (:class:`ctrctl.runner.events.RunObserver`); the runner itself prints nothing.

    Returns:
        A :class:`RunResult`; ``exit_code`` is 3 when a gate failed.

    Raises:
        CtrctlError: the config is invalid (before anything runs), or a step failed (the
            message names it; rerunning continues from it).
    """
    check_step_name(from_step, "--from")
    check_step_name(until_step, "--until")
    if from_step and until_step and STEPS.index(from_step) > STEPS.index(until_step):
        raise CtrctlError(f"--from {from_step} comes after --until {until_step}")
    cfg, source = _load(config, overrides)
    if cfg.schedule.enabled:  # day by day: one run of these steps per day
        from ctrctl.runner.schedule import run_schedule

        return run_schedule(cfg, source, workdir=workdir, from_step=from_step,
                            until_step=until_step, force=force, tracker=tracker,
                            tracking_uri=tracking_uri, progress=progress, observer=observer)
    check_pipeline(cfg, source)
    folder = Path(workdir or cfg.runner.workdir or Path("runs") / cfg.name)
    check_output_location(folder, option="--workdir (runner.workdir)")
    folder.mkdir(parents=True, exist_ok=True)
    with output_lock(folder, "ctrctl run"):
        return _run_locked(cfg, source, overrides, folder, from_step, until_step, force,
                           tracker or Tracker(), tracking_uri, progress or Progress(),
                           observer or RunObserver())


def _run_locked(cfg: PipelineConfig, source: str | None, overrides: Sequence[str],
                folder: Path, from_step: str | None, until_step: str | None, force: bool,
                tracker: Tracker, tracking_uri: str | None, progress: Progress,
                observer: RunObserver) -> RunResult:
    resolved = folder / ".ctrctl" / "config.yaml"
    resolved.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(resolved, f"# resolved from {source or 'a config object'}"
                      f"{' with ' + ' '.join(overrides) if overrides else ''}\n"
                      + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    store = StateStore(folder)
    outcomes: list[StepOutcome] = []
    observer.run_started(cfg.name, STEPS, folder)
    with tracker.run(f"run {cfg.name}", tags={"ctrctl.step": "run",
                                             "ctrctl.pipeline": cfg.name}) as parent:
        parent.log_artifact(resolved)
        parent.log_params({"pipeline": source or "", "overrides": list(overrides),
                           "workdir": str(folder.resolve()), "from": from_step or "",
                           "until": until_step or "", "force": force})
        ctx = Context(cfg=cfg, workdir=folder, tracker=tracker.child(parent.run_id),
                      progress=progress, parent_run_id=parent.run_id, config_file=resolved,
                      tracking_uri=tracking_uri)
        for step in steps():
            state = store.load(step.name)
            if state is not None and state.status == "completed":
                ctx.summaries[step.name] = state.summary
            if not _selected(step.name, from_step, until_step):
                outcome = StepOutcome(step.name, "outside", summary=ctx.summaries.get(
                    step.name, {}), reason="outside --from/--until")
            else:
                outcome = _run_step(step, ctx, store, state, force, observer)
            outcomes.append(outcome)
            observer.step_finished(outcome)
        result = RunResult(workdir=folder, config=cfg, outcomes=outcomes,
                           parent_run_id=parent.run_id)
        evaluated = ctx.summaries.get("eval", {})
        result.gates_passed = bool(evaluated.get("gates_passed", True))
        # The registered version, else the model the quantize step logged (runs:/ or models:/).
        result.model_uri = (ctx.summaries.get("register", {}).get("model_uri")
                            or ctx.summaries.get("quantize", {}).get("model_uri"))
        # The verdict beside the timings, so runs compare in MLflow's runs list.
        scores = {f"eval.{k}": v for k, v in evaluated.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if "gates_passed" in evaluated:
            scores["eval.gates_passed"] = float(bool(evaluated["gates_passed"]))
        parent.log_metrics({f"{o.name}.seconds": o.seconds for o in outcomes} | scores)
        parent.set_tags({"ctrctl.gates.passed": str(result.gates_passed).lower(),
                         **({"ctrctl.model_uri": result.model_uri} if result.model_uri else {}),
                         **{f"ctrctl.step.{o.name}": o.status for o in outcomes}})
    observer.run_finished(result)
    return result


def _run_step(step: Step, ctx: Context, store: StateStore, state: StepState | None,
              force: bool, observer: RunObserver) -> StepOutcome:
    unavailable = step.unavailable(ctx)
    if unavailable:
        logger.info("%s: not run (%s)", step.name, unavailable)
        ctx.summaries.pop(step.name, None)
        return StepOutcome(step.name, "unavailable", reason=unavailable)
    inputs = store.hash_paths(step.inputs(ctx))
    key = step_key(inputs, step.settings(ctx))
    if (not force and state is not None and state.status == "completed" and state.key == key
            and store.outputs_intact(state, step.outputs(ctx))):
        logger.info("%s: unchanged since it completed at %s, skipped", step.name,
                    time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.updated)))
        with ctx.tracker.run(step.name, tags={"ctrctl.skipped": "true",
                                              "ctrctl.reused_run_id":
                                                  str(state.summary.get("run_id", ""))}) as run:
            log_step_datasets(run, step.name, ctx.cfg.name, ctx.dataset,
                              ctx.cfg.runner.eval_split, store.hashes)
        return StepOutcome(step.name, "skipped", summary=state.summary,
                           reason="inputs and settings unchanged")
    resume = (step.name == "train" and not force and state is not None
              and state.status in ("running", "failed") and state.key == key)
    store.save(StepState(step.name, "running", key, inputs))
    observer.step_started(StepOutcome(step.name, "running"))
    started, first = time.perf_counter(), len(ctx.tracker.started)
    try:
        summary = step.run(ctx, resume)
    except CtrctlError as exc:
        store.save(StepState(step.name, "failed", key, inputs, error=exc.render()))
        observer.step_finished(StepOutcome(step.name, "failed", time.perf_counter() - started,
                                           reason=exc.message))
        hint = (exc.hint + "; " if exc.hint else "") + "rerunning continues from this step"
        raise type(exc)(f"step {step.name} failed: {exc.message}", where=exc.where,
                        hint=hint) from exc
    except Exception as exc:
        store.save(StepState(step.name, "failed", key, inputs, error=repr(exc)))
        observer.step_finished(StepOutcome(step.name, "failed", time.perf_counter() - started,
                                           reason=repr(exc)))
        raise
    seconds = time.perf_counter() - started
    run_ids = [rid for name, rid in ctx.tracker.started[first:] if name == step.name]
    if not run_ids and ctx.parent_run_id:  # training workers track from their own processes
        run_ids = ctx.tracker.find_runs(ctx.parent_run_id, step.name)
    summary = {**summary, "run_id": run_ids[-1] if run_ids else None, "seconds": seconds}
    if run_ids:
        log_step_datasets(ctx.tracker.open(run_ids[-1]), step.name, ctx.cfg.name, ctx.dataset,
                          ctx.cfg.runner.eval_split, store.hashes)
    ctx.summaries[step.name] = summary
    store.save(StepState(step.name, "completed", key, inputs,
                         outputs=store.hash_paths(step.outputs(ctx)), summary=summary))
    logger.info("%s: done in %.1f s", step.name, seconds)
    return StepOutcome(step.name, "ran", seconds, summary)
