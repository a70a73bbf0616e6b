"""``ctrctl run`` with a ``schedule:``: train day by day, judge each model on the next day.

For days ``1 .. D`` (raw logs, one per day, in time order) the loop runs, for each day d
below D, one ordinary pipeline run (:func:`ctrctl.runner.core.run_pipeline`) in its own
working folder ``WORKDIR/days/day-d``:

- preprocess: train on day d (days ``d-train_window+1 .. d``), test on day d+1, with the
  first day's vocabularies (``data.reuse_transforms``, when it has any; hashed and zch
  features map ids the same way every day);
- train: warm-started (``training.init_from``) from day d-1's model;
- eval: on day d+1, rows no model of the schedule has trained on (progressive validation),
  with ``schedule.promote.gates`` as the gates;
- quantize, register: a new version per day; ``candidate`` moves when the gates pass,
  ``champion`` when the version beats the champion on day d+1's rows by ``min_gain``
  (:mod:`ctrctl.runner.promotion`: both scored in the same run).

Every day's steps are skipped by the runner's state machinery when nothing they read
changed, so a rerun after a day was added runs only the new day's steps, and a schedule
that was interrupted resumes at the day (and the step) where it stopped. The comparison
arms (``schedule.compare``) run beside the days: ``full_retrain`` under ``WORKDIR/
full_retrain/day-d`` (from scratch on days 1..d), ``frozen`` under ``WORKDIR/frozen``
(the first day's model scored on each next day). The report is written last
(:mod:`ctrctl.runner.schedule_report`).

Layout under the working folder::

    raw-days/         schedule.synth: day_1.csv ... and synth.json
    days/day-1/ ...   one run per trained day (dataset/, train/, eval/, export/, .ctrctl/)
    full_retrain/day-2/ ...
    frozen/day-2/ ...
    report/           days.json, days.md, *.png

Example:
    >>> result = run_pipeline("pipelines/continual-demo.yaml")
    >>> [(d["day"], d["auc"]) for d in result.days]
"""

from __future__ import annotations

import glob
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrctl.config import PipelineConfig, ScheduleConfig, parse_config
from ctrctl.errors import ConfigError
from ctrctl.io import check_output_location, output_lock, read_json_file
from ctrctl.progress import Progress
from ctrctl.runner.core import RunResult, run_pipeline
from ctrctl.runner.events import RunObserver
from ctrctl.runner.state import StateStore, StepState, step_key
from ctrctl.tracking import Tracker

__all__ = ["ScheduleResult", "day_files", "run_schedule"]

logger = logging.getLogger(__name__)


@dataclass
class ScheduleResult(RunResult):
    """What :func:`run_schedule` did: the last day's run, plus every day's record.

    Attributes:
        days: one record per trained day (see :func:`ctrctl.runner.schedule_report.
            day_record`), in day order.
        report: the report folder.
    """

    days: list[dict[str, Any]] = field(default_factory=list)
    report: Path | None = None


def day_files(schedule: ScheduleConfig, folder: Path) -> list[Path]:
    """The schedule's days, one raw log each, in time order.

    ``schedule.days`` items are paths or globs (a glob's sorted matches are days in that
    order); with ``schedule.synth`` the synthetic days under ``folder/raw-days`` (written
    here unless they already are, with the same settings).

    Raises:
        ConfigError: a day matches no file, or fewer than two days.
    """
    if schedule.synth is not None:
        return _synth_days(schedule, folder / "raw-days")
    files: list[Path] = []
    for item in schedule.days:
        matches = sorted((Path(p) for p in glob.glob(item)), key=_natural) \
            if glob.has_magic(item) else [Path(item)]
        missing = [str(p) for p in matches if not p.is_file()]
        if not matches or missing:
            raise ConfigError(f"schedule day {item!r} matches no file",
                              where="schedule.days", hint="list one raw log per day")
        files.extend(matches)
    if len(files) < 2:
        raise ConfigError(f"the schedule has {len(files)} day(s): a day's model is scored on "
                          "the next day, so at least two are needed", where="schedule.days")
    return files


def _natural(path: Path) -> list[Any]:
    """Sort key that puts ``day_2`` before ``day_10`` (numbers compared as numbers)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def _synth_days(schedule: ScheduleConfig, out: Path) -> list[Path]:
    from ctrctl.data.synthetic_days import synthesize_days

    s = schedule.synth
    assert s is not None
    wanted: dict[str, Any] = {"days": s.days, "rows_per_day": s.rows_per_day,
              "new_ids_per_day": s.new_ids_per_day, "popularity_drift": s.popularity_drift,
              "initial_ids": s.initial_ids, "seed": s.seed}
    info = out / "synth.json"
    written = read_json_file(info) if info.is_file() else {}
    files = [out / f"day_{d}.csv" for d in range(1, s.days + 1)]
    if {k: written.get(k) for k in wanted} != wanted or not all(f.is_file() for f in files):
        logger.info("schedule: writing %d synthetic days into %s", s.days, out)
        synthesize_days(out, days=s.days, rows_per_day=s.rows_per_day,
                        new_ids_per_day=s.new_ids_per_day, popularity_drift=s.popularity_drift,
                        initial_ids=s.initial_ids, seed=s.seed, overwrite=True)
    return files


def _day_config(cfg: PipelineConfig, files: Sequence[Path], k: int, folder: Path) -> PipelineConfig:
    """The pipeline run of day ``k+1`` (0-based ``k``): train on its window, test on the
    next day, warm-started from the day before."""
    schedule = cfg.schedule
    data = cfg.to_dict()
    window = files[max(0, k - schedule.train_window + 1): k + 1]
    data["name"] = f"{cfg.name}-day-{k + 1}"
    data["schedule"] = ScheduleConfig().model_dump(mode="json")
    data["synth"]["format"] = None
    data["runner"].update({"workdir": None, "eval_split": "test"})
    data["data"]["inputs"] = [f"train={p}" for p in window] + [f"test={files[k + 1]}"]
    data["data"]["split_ratio"] = None
    if k > 0:
        first = folder / "days" / "day-1" / "dataset"
        if _has_vocabularies(first):
            data["data"]["reuse_transforms"] = str(first)
        data["training"]["init_from"] = str(folder / "days" / f"day-{k}" / "train")
    if schedule.promote.gates:
        data["eval"]["gates"] = dict(schedule.promote.gates)
    data["register"].update({"champion_metric": schedule.promote.metric,
                             "min_gain": schedule.promote.min_gain})
    return parse_config(data, f"schedule day {k + 1}")


def _has_vocabularies(dataset: Path) -> bool:
    """The first day's dataset has vocabulary features: later days must reuse its
    vocabularies (hashed and zch features map ids the same way every day without it).
    A day that reuses them still carves its own val split."""
    from ctrctl.data.manifest import DatasetManifest

    return any(f.mode == "vocab" for f in DatasetManifest.load(dataset).sparse)


def _full_retrain_config(cfg: PipelineConfig, files: Sequence[Path], k: int,
                         folder: Path) -> PipelineConfig:
    """From scratch on days 1..k+1, tested on day k+2: nothing quantized or registered."""
    data = _day_config(cfg, files, k, folder).to_dict()
    data["name"] = f"{cfg.name}-full-retrain-{k + 1}"
    data["data"]["inputs"] = [f"train={p}" for p in files[: k + 1]] + [f"test={files[k + 1]}"]
    data["training"]["init_from"] = None
    data["quantize"]["enabled"] = False
    data["register"]["model_name"] = None
    return parse_config(data, f"schedule full retrain {k + 1}")


def _frozen(cfg: PipelineConfig, folder: Path, k: int, force: bool,
            tracker: Tracker) -> dict[str, Any]:
    """The first day's model scored on day k+2 (the test split of day k+1's dataset),
    skipped when neither changed."""
    from ctrctl.evaluation.evaluate import evaluate

    store = StateStore(folder / "frozen")
    name = f"day-{k + 1}"
    paths = {"checkpoint": folder / "days" / "day-1" / "train",
             "dataset": folder / "days" / name / "dataset"}
    inputs = store.hash_paths(paths)
    key = step_key(inputs, {"split": "test", "batch_size": cfg.eval.batch_size})
    state = store.load(name)
    if not force and state is not None and state.status == "completed" and state.key == key:
        return state.summary
    started = time.perf_counter()
    result = evaluate(folder / "frozen" / name, checkpoint=paths["checkpoint"],
                      dataset=paths["dataset"], split="test", overwrite=True,
                      batch_size=cfg.eval.batch_size, tracker=tracker, gates_raise=False)
    summary = {k2: v for k2, v in result.metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    summary["seconds"] = time.perf_counter() - started
    store.save(StepState(name, "completed", key, inputs, summary=summary))
    return summary


def run_schedule(
    cfg: PipelineConfig,
    source: str | None = None,
    *,
    workdir: str | Path | None = None,
    from_step: str | None = None,
    until_step: str | None = None,
    force: bool = False,
    tracker: Tracker | None = None,
    tracking_uri: str | None = None,
    progress: Progress | None = None,
    observer: RunObserver | None = None,
) -> ScheduleResult:
    """Run a schedule: one pipeline run per day, the comparison arms, the report.

    Arguments as :func:`ctrctl.runner.core.run_pipeline` (``from_step``/``until_step``
    and ``force`` apply to every day's run).

    Returns:
        A :class:`ScheduleResult`: the last day's outcomes and gates, every day's record.

    Raises:
        CtrctlError: the config is invalid, or a day's step failed (the message names the
            step; rerunning continues from it: the days before it are skipped).
    """
    from ctrctl.runner.schedule_report import day_record, write_report

    if not cfg.schedule.enabled:
        raise ConfigError("the pipeline has no schedule.days or schedule.synth",
                          where=source or "config")
    folder = Path(workdir or cfg.runner.workdir or Path("runs") / cfg.name)
    check_output_location(folder, option="--workdir (runner.workdir)")
    folder.mkdir(parents=True, exist_ok=True)
    tracker = tracker or Tracker()
    records: list[dict[str, Any]] = []
    with output_lock(folder, "ctrctl run (schedule)"), \
            tracker.run(f"schedule {cfg.name}", tags={"ctrctl.step": "schedule",
                                                      "ctrctl.pipeline": cfg.name}) as parent:
        files = day_files(cfg.schedule, folder)
        parent.log_params({"pipeline": source or "", "workdir": str(folder.resolve()),
                           "days": len(files), "train_window": cfg.schedule.train_window,
                           "compare": ",".join(cfg.schedule.compare)})
        child = tracker.child(parent.run_id)
        last: RunResult | None = None
        for k in range(len(files) - 1):
            logger.info("schedule: day %d of %d (%s), scored on %s", k + 1, len(files) - 1,
                        files[k].name, files[k + 1].name)
            last = run_pipeline(_day_config(cfg, files, k, folder),
                                workdir=folder / "days" / f"day-{k + 1}",
                                from_step=from_step, until_step=until_step, force=force,
                                tracker=child, tracking_uri=tracking_uri, progress=progress,
                                observer=observer)
            arms: dict[str, dict[str, Any]] = {name: {} for name in cfg.schedule.compare}
            if "full_retrain" in cfg.schedule.compare and k > 0:
                full = run_pipeline(_full_retrain_config(cfg, files, k, folder),
                                    workdir=folder / "full_retrain" / f"day-{k + 1}",
                                    force=force, tracker=child, tracking_uri=tracking_uri,
                                    progress=progress, observer=observer)
                arms["full_retrain"] = _arm_summary(full)
            if "frozen" in cfg.schedule.compare and k > 0:
                arms["frozen"] = _frozen(cfg, folder, k, force, child)
            records.append(day_record(k + 1, files, last, arms, folder, records))
        report = write_report(records, folder / "report", cfg.schedule.compare, parent)
    assert last is not None  # at least two days
    return ScheduleResult(workdir=folder, config=cfg, outcomes=last.outcomes,
                          parent_run_id=parent.run_id, model_uri=last.model_uri,
                          gates_passed=last.gates_passed, days=records, report=report)


def _arm_summary(result: RunResult) -> dict[str, Any]:
    evaluated = result.outcome("eval").summary
    return {**{k: v for k, v in evaluated.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)},
            "train_seconds": result.outcome("train").summary.get("seconds"),
            "rows_trained": result.outcome("preprocess").summary.get("rows.train")}
