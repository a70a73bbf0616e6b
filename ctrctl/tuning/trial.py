"""One trial of a search: a training run on the train split, judged and pruned on val.

The trial trains into ``DIR/trials/NNNN/`` with the base config plus the trial's values.
Every validation the trainer already makes is reported to the Optuna trial; when the pruner
gives up on it, the run stops there (``stop_reason: pruned``) and the trial is PRUNED. A
loss that turns non-finite (a learning rate far too high) prunes the trial too.

Training sees the dataset through :func:`training_view`: a folder holding the dataset's own
manifest and links to the train and val splits only, so no file of the test split can be
opened by a trial (the manifest is unchanged, so its hash and the checkpoints' are the
dataset's own).

With several processes per trial (``nproc_per_node > 1``) the ranks run
:mod:`ctrctl.tuning.rank` through the training launcher; rank 0 reports to the study's
storage and broadcasts the pruner's answer to the others.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ctrctl.config import PipelineConfig
from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import ConfigError
from ctrctl.io import write_json_atomic
from ctrctl.tracking import Run, Tracker

__all__ = ["TrialOutcome", "TrialTarget", "TrialTracker", "run_trial", "storage_url",
           "read_manifest", "target_tracker", "training_view", "write_trial_config"]

logger = logging.getLogger(__name__)

#: The Optuna study's name inside DIR/study.db.
STUDY_NAME = "ctrctl-tune"


@dataclass(frozen=True)
class TrialTarget:
    """Where a trial trains and how it is judged (what a parallel worker needs, as JSON).

    Attributes:
        view: the training view of the dataset (:func:`training_view`).
        out: the tune output folder (trials train in ``out/trials/NNNN``).
        metric: ``val.logloss`` or ``val.auc``.
        nproc_per_node: processes per trial (1: in this process).
        track, tracking_uri, experiment, parent_run_id: the MLflow parent run of the study.
    """

    view: str
    out: str
    metric: str
    nproc_per_node: int = 1
    track: bool = False
    tracking_uri: str | None = None
    experiment: str = "ctrctl"
    parent_run_id: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> TrialTarget:
        return cls(**json.loads(text))

    @property
    def storage(self) -> str:
        return storage_url(Path(self.out))


def storage_url(out: Path) -> str:
    """The study's RDB storage: sqlite in the tune folder, so it survives a kill."""
    return f"sqlite:///{(out / 'study.db').resolve()}"


@dataclass(frozen=True)
class TrialOutcome:
    """What a trial's training did: its kept val metrics and how it ended."""

    number: int
    folder: Path
    metrics: dict[str, float]
    step: int
    best_step: int | None
    stop_reason: str | None
    seconds: float


def read_manifest(dataset: str | Path) -> DatasetManifest:
    """The dataset's manifest, read without opening any split's files
    (:meth:`DatasetManifest.load` also checks every split's Parquet footers, the test
    split's included, which a search must not touch)."""
    from ctrctl.data.manifest import MANIFEST_NAME
    from ctrctl.errors import DatasetError
    from ctrctl.io import read_json_file

    path = Path(dataset) / MANIFEST_NAME
    data = read_json_file(path, DatasetError("no manifest.json: not a dataset folder",
                                             where=str(dataset),
                                             hint="create one with `ctrctl preprocess`"))
    return DatasetManifest.from_dict(data, where=str(path))


def training_view(dataset: Path, folder: Path, val_split: str) -> Path:
    """A dataset folder with only the train and ``val_split`` splits reachable.

    Holds a copy of the dataset's manifest (byte for byte) and a link to each of those two
    split folders; the other splits' files are absent, so they cannot be opened.

    Raises:
        ConfigError: the dataset has no ``val_split`` to judge trials on.
    """
    manifest = read_manifest(dataset)
    if val_split not in manifest.splits or manifest.splits[val_split].rows == 0:
        raise ConfigError(
            f"the dataset has no {val_split!r} split to judge trials on (it has "
            f"{', '.join(sorted(manifest.splits))})", where=str(dataset),
            hint="preprocess again without --val-fraction 0: by default 10% of train is "
            "carved into val (or pass a val= input)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_bytes((dataset / "manifest.json").read_bytes())
    for split in ("train", val_split):
        tops = {Path(f).parts[0] for f in manifest.splits[split].files}
        for top in tops:
            link = folder / top
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to((dataset / top).resolve(), target_is_directory=True)
    return folder


class TrialTracker(Tracker):
    """The study's tracker with each training run named ``trial N`` and tagged, so the
    parent run lists one child per trial."""

    def __init__(self, inner: Tracker, number: int) -> None:
        super().__init__()
        self.inner, self.number = inner, number
        self.enabled = inner.enabled
        self.run_id: str | None = None

    @contextlib.contextmanager
    def run(self, name: str, tags: Mapping[str, str] | None = None) -> Iterator[Run]:
        extra = {**(tags or {}), "ctrctl.step": "tune.trial", "ctrctl.trial": str(self.number)}
        with self.inner.run(f"trial {self.number}", extra) as run:
            self.run_id = run.run_id if isinstance(run.run_id, str) else None
            yield run


def target_tracker(target: TrialTarget) -> Tracker:
    """The tracker a trial's run goes to: a child of the study's parent run."""
    if not target.track:
        return Tracker()
    from ctrctl.tracking import make_tracker

    return make_tracker(True, target.tracking_uri, target.experiment).child(
        target.parent_run_id)


def _pruned(trial: Any, metric: str) -> Any:
    """The callback that reports each validation to ``trial``; True: prune."""
    key = metric.removeprefix("val.")

    def on_validation(step: int, values: dict[str, float]) -> bool:
        value = values.get(key)
        if value is None or not math.isfinite(value):
            return False
        trial.report(value, step)
        return bool(trial.should_prune())

    return on_validation


def run_trial(trial: Any, target: TrialTarget, config: PipelineConfig,
              config_file: Path, study_tracker: Tracker | None = None) -> TrialOutcome:
    """Train one trial and return what it did; raise ``optuna.TrialPruned`` when pruned.

    ``config_file`` holds the trial's resolved config (the multi-process ranks load it);
    ``study_tracker`` nests the trial's run under the study's (None: from ``target``).
    """
    import optuna

    folder = Path(target.out) / "trials" / f"{trial.number:04d}"
    tracker = TrialTracker(study_tracker if study_tracker is not None else target_tracker(target),
                           trial.number)
    started = time.perf_counter()
    try:
        if target.nproc_per_node > 1:
            result = _run_ranks(trial, target, folder, config_file)
        else:
            from ctrctl.training.loop import train

            res = train(target.view, folder, config, overwrite=True, tracker=tracker,
                        on_validation=_pruned(trial, target.metric))
            result = {"metrics": res.metrics, "step": res.step, "best_step": res.best_step,
                      "stop_reason": res.stop_reason}
    except ConfigError as exc:
        if not exc.message.startswith("the loss is"):
            raise
        logger.info("trial %d diverged (%s): pruned", trial.number, exc.message)
        trial.set_user_attr("diverged", exc.message)
        raise optuna.TrialPruned(exc.message) from None
    outcome = TrialOutcome(trial.number, folder, dict(result["metrics"]), int(result["step"]),
                           result["best_step"], result["stop_reason"],
                           time.perf_counter() - started)
    trial.set_user_attr("folder", str(folder))
    trial.set_user_attr("seconds", outcome.seconds)
    trial.set_user_attr("steps", outcome.step)
    trial.set_user_attr("best_step", outcome.best_step)
    if tracker.run_id:
        tracker.inner.open(tracker.run_id).set_tags({"ctrctl.trial_state": "pruned" if
                                                     outcome.stop_reason == "pruned" else
                                                     "complete"})
    if outcome.stop_reason == "pruned":
        raise optuna.TrialPruned(f"pruned at step {outcome.step}")
    value = outcome.metrics.get(target.metric)
    if value is None or not math.isfinite(value):
        raise ConfigError(f"trial {trial.number} has no {target.metric}", where=str(folder))
    return outcome


def _run_ranks(trial: Any, target: TrialTarget, folder: Path,
               config_file: Path) -> dict[str, Any]:
    """Train through the launcher; rank 0 reports to the study (see :mod:`.rank`)."""
    from ctrctl.distributed.launch import launch
    from ctrctl.training.launch import TrainSpec

    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS",
                   str(max(1, (os.cpu_count() or 1) // target.nproc_per_node)))
    env.update(target.env)
    spec = TrainSpec(dataset=target.view, out=str(folder), config=str(config_file),
                     overwrite=True, track=target.track, tracking_uri=target.tracking_uri,
                     experiment=target.experiment,
                     env={"CTRCTL_PARENT_RUN_ID": target.parent_run_id}
                     if target.parent_run_id else {})
    env.update(spec.env)
    program = ["-m", "ctrctl.tuning.rank", "--spec", spec.to_json(), "--storage",
               target.storage, "--trial-id", str(trial._trial_id), "--metric", target.metric]
    launch(program, target.nproc_per_node, 1, 0, None, env=env)
    data = json.loads((folder / "metrics.json").read_text())
    return {"metrics": data.get("metrics", {}), "step": data.get("step", 0),
            "best_step": data.get("best_step"), "stop_reason": data.get("stop_reason")}


def write_trial_config(folder: Path, number: int, config: PipelineConfig) -> Path:
    """The trial's resolved config as YAML under the tune folder (what its ranks load)."""
    from ctrctl.config import dump_config
    from ctrctl.io import write_text_atomic

    path = folder / "configs" / f"{number:04d}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, dump_config(config))
    write_json_atomic(path.with_suffix(".json"), config.to_dict())
    return path
