"""Background tracking: a run logged to a journal file, sent to MLflow by another process.

Importing MLflow and opening its store cost a short command most of its time. A
:class:`JournalTracker` run writes what it logs, in order, to an append-only journal of JSON
lines in the URI's spool folder (:func:`ctrctl.tracking.uri.spool_folder`); files it logs as
artifacts are copied beside the journal (what commands that track in the background log is
small: manifests, metrics, plots), so a later change of the originals does not reach the
run. When the run ends the journal is fsync'd and renamed from
``NAME.jsonl.part`` to ``NAME.jsonl`` (complete), and a detached replayer
(``python -m ctrctl.tracking.replay``) sends it (:mod:`ctrctl.tracking.replay`).

A journal line is one JSON object with an ``op``: ``start`` (URI, working folder, experiment,
run name, tags, parent run, time), ``params``, ``metrics`` (``[key, value, timestamp_ms,
step]`` rows), ``tags``, ``artifact`` (a path under the journal's ``.files`` folder),
``dict``, ``dataset``, ``end`` (status, time).

Nothing here imports MLflow. What needs an answer from MLflow now (finding runs, registering
a model, logging into an existing run) goes to a synchronous tracker.
"""

from __future__ import annotations

import contextlib
import datetime
import getpass
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from ctrctl.errors import TrackingError
from ctrctl.tracking import (
    DEFAULT_EXPERIMENT,
    PARENT_RUN_ENV,
    DatasetRef,
    MlflowTracker,
    Run,
    Tracker,
    _flatten,
    git_commit,
)
from ctrctl.tracking.uri import absolute_uri, spool_folder

logger = logging.getLogger(__name__)

#: Journal format version (the ``v`` of a ``start`` line).
VERSION = 1
#: A journal being written; renamed to ``.jsonl`` once its run has ended.
PART_SUFFIX = ".jsonl.part"
DONE_SUFFIX = ".jsonl"
#: The tag that ties an MLflow run to its journal: a replay retried after a crash finds the
#: run it already created instead of creating a second one.
JOURNAL_TAG = "ctrctl.journal"
#: What the replayer's output is appended to, in the spool folder.
REPLAY_LOG = "replay.log"
#: Past this size the replay log is moved to ``replay.log.1`` and a new one started.
REPLAY_LOG_BYTES = 1 << 20


def context_tags() -> dict[str, str]:
    """MLflow's default context tags (user, source name and type) and the ctrctl checkout's
    commit, computed as MLflow's ``DefaultRunContext`` does without importing MLflow."""
    try:
        user = getpass.getuser()
    except (ImportError, KeyError, OSError):
        user = "unknown"
    tags = {"mlflow.user": os.environ.get("MLFLOW_TRACKING_USERNAME") or user,
            "mlflow.source.name": sys.argv[0] if sys.argv and sys.argv[0] else "<console>",
            "mlflow.source.type": "LOCAL"}
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


class Journal:
    """One run's journal file: lines appended and flushed to the OS as they come, fsync'd
    and published (renamed to ``.jsonl``) by :meth:`close`."""

    def __init__(self, spool: Path) -> None:
        spool.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
        self.id = f"{stamp}-{os.getpid()}-{secrets.token_hex(4)}"
        self.spool = spool
        self.path = spool / f"{self.id}{PART_SUFFIX}"
        self.files = spool / f"{self.id}.files"
        self._handle: TextIO | None = self.path.open("x", encoding="utf-8")
        self._artifacts = 0

    @property
    def done_path(self) -> Path:
        return self.spool / f"{self.id}{DONE_SUFFIX}"

    def write(self, op: str, **fields: Any) -> None:
        if self._handle is None:
            raise ValueError(f"journal {self.path} is closed")
        self._handle.write(json.dumps({"op": op, **fields}, default=str) + "\n")
        self._handle.flush()

    def keep(self, path: Path) -> str:
        """A copy of ``path`` (a file or a folder) beside the journal, as it is now (a hard
        link would see a later in-place write). Returns its path relative to the spool."""
        self._artifacts += 1
        target = self.files / str(self._artifacts) / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, target)
        else:
            shutil.copy2(path, target)
        return target.relative_to(self.spool).as_posix()

    def close(self) -> Path:
        """fsync the journal and publish it as complete; returns its final path."""
        if self._handle is None:
            return self.done_path
        handle, self._handle = self._handle, None
        os.fsync(handle.fileno())
        handle.close()
        os.replace(self.path, self.done_path)
        _fsync_folder(self.spool)
        return self.done_path


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system lets a folder be opened
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class JournalRun(Run):
    """A run that logs to its journal. Its MLflow id is not known until the replay, so
    ``run_id`` is None: code that needs the id (a model logged into the run) has to track
    synchronously."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._last_ms = 0

    def _timestamp(self) -> int:
        """Milliseconds, strictly increasing within the run (as :class:`MlflowRun`)."""
        self._last_ms = max(int(time.time() * 1000), self._last_ms + 1)
        return self._last_ms

    def log_params(self, params: Mapping[str, Any]) -> None:
        flat = {k: str(v)[:6000] for k, v in _flatten(params).items()}
        if flat:
            self.journal.write("params", params=flat)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        now = self._timestamp()
        rows = [[k, float(v), now, step or 0] for k, v in _flatten(metrics).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if rows:
            self.journal.write("metrics", metrics=rows)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        kept = self.journal.keep(Path(path).resolve())
        self.journal.write("artifact", path=kept, artifact_path=artifact_path,
                           folder=Path(path).is_dir())

    def log_dict(self, obj: Any, name: str) -> None:
        text = json.dumps(obj, indent=2, sort_keys=True, default=str)
        self.journal.write("dict", name=name, text=text)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if tags:
            self.journal.write("tags", tags={k: str(v) for k, v in tags.items()})

    def log_dataset(self, dataset: DatasetRef, context: str) -> None:
        self.journal.write("dataset", name=dataset.name, sha256=dataset.sha256,
                           source=dataset.source, schema=dict(dataset.schema),
                           profile=dict(dataset.profile), context=context)


class JournalTracker(Tracker):
    """Tracks to journals replayed into MLflow by a detached process.

    Args:
        tracking_uri: as :class:`~ctrctl.tracking.MlflowTracker`.
        experiment: experiment name, created by the replayer when missing.
        parent_run_id: an MLflow run the runs are nested under.
        spawn: start the replayer when a run ends (tests replay by hand).
        announce: told, in one line, where an ended run will appear (default: the log).
    """

    enabled = True

    def __init__(self, tracking_uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT,
                 parent_run_id: str | None = None, spawn: bool = True,
                 announce: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.cwd = Path.cwd()
        self.tracking_uri = absolute_uri(tracking_uri, self.cwd)
        self.experiment = experiment
        self.parent_run_id = parent_run_id
        self.spool = spool_folder(self.tracking_uri, self.cwd)
        self.spawn = spawn
        self.announce = announce or logger.info
        #: Journals this tracker wrote, in order.
        self.journals: list[Path] = []
        self._sync: MlflowTracker | None = None

    def synchronous(self) -> MlflowTracker:
        """The synchronous tracker for what needs MLflow's answer now (one, opened lazily)."""
        if self._sync is None:
            self._sync = MlflowTracker(self.tracking_uri, self.experiment, self.parent_run_id)
        return self._sync

    def child(self, parent_run_id: str | None) -> Tracker:
        child = JournalTracker(self.tracking_uri, self.experiment, parent_run_id, self.spawn,
                               self.announce)
        child.started, child.journals = self.started, self.journals
        return child

    def open(self, run_id: str | None) -> Run:
        return self.synchronous().open(run_id)

    def find_runs(self, parent_run_id: str, step: str) -> list[str]:
        return self.synchronous().find_runs(parent_run_id, step)

    def register_model(self, name: str, model_uri: str, run_id: str | None,
                       tags: Mapping[str, str], alias: str | None) -> str | None:
        return self.synchronous().register_model(name, model_uri, run_id, tags, alias)

    def where(self) -> str:
        return self.tracking_uri or f"the default store (sqlite mlflow.db in {self.cwd})"

    @contextlib.contextmanager
    def run(self, name: str, tags: Mapping[str, str] | None = None) -> Iterator[Run]:
        try:
            journal = Journal(self.spool)
        except OSError as exc:
            raise TrackingError(f"cannot write the {name} run's journal: {exc.strerror or exc}",
                                where=str(self.spool),
                                hint="make the folder writable, or track with "
                                     "CTRCTL_TRACKING_MODE=sync, or pass --no-track") from exc
        run_tags = {**context_tags(), "mlflow.runName": name, "ctrctl.step": name,
                    **(tags or {}), JOURNAL_TAG: journal.id}
        parent = self.parent_run_id or os.environ.get(PARENT_RUN_ENV)
        if parent:
            run_tags["mlflow.parentRunId"] = parent
        journal.write("start", v=VERSION, journal_id=journal.id, tracking_uri=self.tracking_uri,
                      cwd=str(self.cwd), experiment=self.experiment, name=name, tags=run_tags,
                      time_ms=int(time.time() * 1000), pid=os.getpid())
        status = "FAILED"
        try:
            yield JournalRun(journal)
            status = "FINISHED"
        finally:
            journal.write("end", status=status, time_ms=int(time.time() * 1000))
            done = journal.close()
            self.journals.append(done)
            self.announce(f"tracking: run {name!r} will appear in {self.where()}, experiment "
                          f"{self.experiment!r}, in a few seconds (sent in the background from "
                          f"{self.spool})")
            if self.spawn:
                spawn_replayer(self.spool)


def spawn_replayer(spool: Path) -> int | None:
    """Start ``python -m ctrctl.tracking.replay SPOOL`` detached from this process (its own
    session, no terminal, output appended to the spool's ``replay.log``); returns its pid.

    A replayer that cannot start leaves the journals for the next command or a flush."""
    env = {**os.environ}
    package_root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if package_root not in paths:  # the replayer imports the ctrctl that wrote the journal
        env["PYTHONPATH"] = os.pathsep.join([package_root, *paths])
    log_path = spool / REPLAY_LOG
    try:
        if log_path.is_file() and log_path.stat().st_size > REPLAY_LOG_BYTES:
            os.replace(log_path, log_path.with_name(REPLAY_LOG + ".1"))  # the last one kept
        with log_path.open("a") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "ctrctl.tracking.replay", str(spool)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=spool,
                env=env, start_new_session=True, close_fds=True)
    except OSError as exc:
        logger.warning("could not start the tracking replayer (%s): the journals in %s are "
                       "sent by the next tracked command or `ctrctl tracking flush`", exc,
                       spool)
        return None
    return child.pid
