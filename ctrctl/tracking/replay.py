"""Send spooled journals to MLflow: ``python -m ctrctl.tracking.replay SPOOL``.

The replayer imports MLflow, opens the store once and replays the spool's journals (see
:mod:`ctrctl.tracking.journal`) oldest first. Each journal is replayed under its own lock
(``NAME.lock``, ``flock``): two replayers never replay one journal, and a lock dies with its
process, so a replay that crashed is taken up by the next. Progress is kept in ``NAME.state``
(the MLflow run id and how many lines were sent); the run carries the journal's id as a tag,
so a replay that crashed between creating the run and recording it finds that run rather than
making a second. A line sent twice after a crash changes nothing (params, tags and artifacts
are set again to the same values; MLflow's store drops a metric row identical to one it has).

A journal is deleted (with its files and state) only once its run has ended in MLflow. A store
that cannot be reached stops the pass and keeps everything for the next one; a journal MLflow
refuses is moved to ``failed/`` with the reason beside it, for a person to look at.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ctrctl.io import write_json_atomic
from ctrctl.tracking import (
    _HTTP_ENV_DEFAULTS,
    DatasetRef,
    MlflowTracker,
    _first_line,
    dataset_input,
    mlflow_key,
    unreachable,
)
from ctrctl.tracking.journal import DONE_SUFFIX, JOURNAL_TAG, PART_SUFFIX

logger = logging.getLogger(__name__)

#: Where journals MLflow refused are moved, in the spool folder.
FAILED_DIR = "failed"


@dataclasses.dataclass
class FlushReport:
    """What one pass over a spool did: journal names sent, busy (another replayer holds
    them), kept (the store did not answer) and failed (moved to ``failed/``)."""

    sent: list[str] = dataclasses.field(default_factory=list)
    busy: list[str] = dataclasses.field(default_factory=list)
    kept: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    error: str | None = None

    @property
    def complete(self) -> bool:
        return not (self.kept or self.failed or self.busy)


def _writer_alive(part: Path) -> bool:
    """Whether the process that writes ``part`` (its pid is in the name) still runs."""
    try:
        pid = int(part.name.split("-")[1])
        os.kill(pid, 0)
    except (IndexError, ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def pending(spool: Path) -> list[Path]:
    """The journals waiting in ``spool``, oldest first: complete ones, and those whose writer
    died before its run ended (replayed, then ended as KILLED)."""
    if not spool.is_dir():
        return []
    found = [p for p in spool.iterdir() if p.name.endswith(DONE_SUFFIX)]
    found += [p for p in spool.iterdir() if p.name.endswith(PART_SUFFIX)
              and not _writer_alive(p)]
    return sorted(found, key=lambda p: p.name)


def _stem(journal: Path) -> Path:
    name = journal.name.removesuffix(PART_SUFFIX).removesuffix(DONE_SUFFIX)
    return journal.with_name(name)


@contextlib.contextmanager
def journal_lock(journal: Path) -> Iterator[bool]:
    """Hold ``journal``'s replay lock; yields False when another replayer holds it."""
    path = _stem(journal).with_suffix(".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def read_journal(journal: Path) -> list[dict[str, Any]]:
    """The journal's lines; a last line cut short (its writer died mid-write) is dropped."""
    lines = journal.read_text(encoding="utf-8").splitlines()
    entries = []
    for number, line in enumerate(lines):
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines) - 1:
                break
            raise
    if not entries or entries[0].get("op") != "start":
        raise ValueError(f"{journal} does not open with a start line")
    return entries


class Replayer:
    """Replays journals, with one open store per (URI, working folder, experiment)."""

    def __init__(self) -> None:
        self._trackers: dict[tuple[str | None, str, str], MlflowTracker] = {}

    def _tracker(self, start: dict[str, Any]) -> MlflowTracker:
        key = (start["tracking_uri"], start["cwd"], start["experiment"])
        if key not in self._trackers:
            self._trackers[key] = MlflowTracker(start["tracking_uri"], start["experiment"])
        return self._trackers[key]

    def replay(self, journal: Path) -> None:
        """Send one journal (its lock held by the caller), then delete it."""
        entries = read_journal(journal)
        start = entries[0]
        state_path = _stem(journal).with_suffix(".state")
        state: dict[str, Any] = (json.loads(state_path.read_text()) if state_path.is_file()
                                 else {"lines": 1})
        tracker = self._tracker(start)
        # MLflow's default store and ./mlruns are relative to the command's working folder.
        with contextlib.chdir(start["cwd"]):
            client = tracker._client()
            if not state.get("run_id"):
                state["run_id"] = self._start(client, tracker, start)
                write_json_atomic(state_path, state)
            run_id = state["run_id"]
            for number in range(state["lines"], len(entries)):
                self._apply(client, run_id, journal.parent, entries[number])
                state["lines"] = number + 1
                write_json_atomic(state_path, state)
            if entries[-1]["op"] != "end":  # its writer died: the run ends as killed
                client.set_terminated(run_id, status="KILLED",
                                      end_time=int(journal.stat().st_mtime * 1000))
        shutil.rmtree(_stem(journal).with_suffix(".files"), ignore_errors=True)
        journal.unlink()
        state_path.unlink(missing_ok=True)

    def _start(self, client: Any, tracker: MlflowTracker, start: dict[str, Any]) -> str:
        """The run of this journal: found by its journal tag (a replay that crashed after
        creating it) or created with the command's start time and tags."""
        experiment_id = tracker._experiment(client)
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`{JOURNAL_TAG}` = '{start['journal_id']}'")
        if found:
            return str(found[0].info.run_id)
        run = client.create_run(experiment_id, start_time=start["time_ms"], tags=start["tags"],
                                run_name=start["name"])
        return str(run.info.run_id)

    def _apply(self, client: Any, run_id: str, spool: Path, entry: dict[str, Any]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        op = entry["op"]
        if op == "params":
            params = [Param(k, v) for k, v in entry["params"].items()]
            for first in range(0, len(params), 100):
                client.log_batch(run_id, params=params[first:first + 100])
        elif op == "metrics":
            metrics = [Metric(mlflow_key(k), v, ts, step) for k, v, ts, step in entry["metrics"]]
            for first in range(0, len(metrics), 500):
                client.log_batch(run_id, metrics=metrics[first:first + 500])
        elif op == "tags":
            client.log_batch(run_id, tags=[RunTag(mlflow_key(k), v)
                                            for k, v in entry["tags"].items()])
        elif op == "artifact":
            path = spool / entry["path"]
            if entry.get("folder"):
                client.log_artifacts(run_id, str(path), entry.get("artifact_path"))
            else:
                client.log_artifact(run_id, str(path), entry.get("artifact_path"))
        elif op == "dict":
            with tempfile.TemporaryDirectory() as tmp:
                target = Path(tmp) / entry["name"]
                target.write_text(entry["text"])
                client.log_artifact(run_id, str(target))
        elif op == "dataset":
            ref = DatasetRef(entry["name"], entry["sha256"], entry["source"], entry["schema"],
                             entry["profile"])
            client.log_inputs(run_id, datasets=[dataset_input(ref, entry["context"])])
        elif op == "end":
            client.set_terminated(run_id, status=entry["status"], end_time=entry["time_ms"])
        else:
            raise ValueError(f"unknown journal line {op!r}")


def _fail(journal: Path, exc: BaseException) -> None:
    """Move a journal MLflow refused (and its files and state) to ``failed/``."""
    failed = journal.parent / FAILED_DIR
    failed.mkdir(exist_ok=True)
    stem = _stem(journal)
    for path in (journal, stem.with_suffix(".files"), stem.with_suffix(".state")):
        if path.exists():
            os.replace(path, failed / path.name)
    (failed / f"{stem.name}.error").write_text(f"{type(exc).__name__}: {exc}\n")


def flush(spool: str | Path, replayer: Replayer | None = None) -> FlushReport:
    """One pass over ``spool``: send every journal no other replayer holds."""
    for key, value in _HTTP_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    replayer = replayer or Replayer()
    report = FlushReport()
    journals = pending(Path(spool))
    for index, journal in enumerate(journals):
        with journal_lock(journal) as held:
            if not held:
                report.busy.append(journal.name)
                continue
            if not journal.exists():  # sent by the replayer that held it a moment ago
                _stem(journal).with_suffix(".lock").unlink(missing_ok=True)
                continue
            try:
                replayer.replay(journal)
            except Exception as exc:
                if unreachable(exc):
                    report.error = _first_line(exc)
                    report.kept += [j.name for j in journals[index:]]
                    return report
                logger.error("tracking journal %s refused: %s", journal, _first_line(exc))
                report.error = _first_line(exc)
                _fail(journal, exc)
                report.failed.append(journal.name)
                continue
            report.sent.append(journal.name)
            # Deleted while held: a replayer waiting on the old file finds no journal.
            _stem(journal).with_suffix(".lock").unlink(missing_ok=True)
    return report


def main(argv: list[str] | None = None) -> int:
    """Replay a spool until a pass finds nothing more to send; 0 when it is empty."""
    parser = argparse.ArgumentParser(prog="python -m ctrctl.tracking.replay",
                                     description="Send spooled tracking journals to MLflow.")
    parser.add_argument("spool", type=Path, help="the spool folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    replayer = Replayer()
    while True:
        started = time.perf_counter()
        report = flush(args.spool, replayer)
        for name in report.sent:
            logger.info("sent %s", name)
        if report.kept:
            logger.warning("store not reached (%s): %d journals kept", report.error,
                           len(report.kept))
            return 1
        if not report.sent:  # busy journals are another replayer's
            return 1 if report.failed else 0
        logger.info("pass done in %.2f s", time.perf_counter() - started)


if __name__ == "__main__":
    sys.exit(main())
