"""Background tracking: a journal replayed into MLflow gives the run synchronous logging
gives, and survives a crashed replayer, a second replayer and a store that is away."""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

import pytest

from ctrctl.tracking import MlflowTracker, make_tracker
from ctrctl.tracking.journal import JOURNAL_TAG, JournalTracker
from ctrctl.tracking.replay import FAILED_DIR, Replayer, flush, pending
from tests.tracking.helpers import log_everything, runs_of, snapshot


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite store for the module (MLflow opens a URI once per process: a store per
    test would cost seconds each); each test tracks to an experiment of its own."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


@pytest.fixture
def bg(request: pytest.FixtureRequest) -> str:
    """This test's experiment."""
    return str(request.node.name)[:60]


def _journal_tracker(uri: str, experiment: str) -> JournalTracker:
    return JournalTracker(uri, experiment, spawn=False)


def test_replay_gives_the_run_sync_logging_gives(store: str, bg: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    uri = store
    sync = MlflowTracker(uri, bg + "-sync")
    log_everything(sync, tmp_path / "a")
    background = _journal_tracker(uri, bg)
    log_everything(background, tmp_path / "b")
    assert runs_of(uri, bg) == []  # nothing reaches MLflow before the replay
    [journal] = background.journals
    assert pending(background.spool) == [journal]

    report = flush(background.spool)

    assert report.sent == [journal.name] and report.complete
    [replayed] = runs_of(uri, bg)
    assert replayed.data.tags[JOURNAL_TAG] == journal.name.removesuffix(".jsonl")
    expected = snapshot(uri, sync.started[0][1])
    got = snapshot(uri, replayed.info.run_id)
    assert got == expected
    assert got["metrics"]["loss"] == [(0, 0.3), (1, 0.5), (2, 0.4)]
    assert got["artifacts"]["notes.json"] == '{"kept": true}\n'
    stem = journal.name.removesuffix(".jsonl")
    assert pending(background.spool) == [] and not list(background.spool.glob(f"{stem}*"))


def test_a_failed_step_replays_as_failed(store: str, bg: str) -> None:
    uri = store
    tracker = _journal_tracker(uri, bg)
    with pytest.raises(RuntimeError), tracker.run("step") as run:
        run.log_metrics({"loss": 1.0})
        raise RuntimeError("the step failed")
    flush(tracker.spool)
    [replayed] = runs_of(uri, bg)
    assert replayed.info.status == "FAILED" and replayed.data.metrics == {"loss": 1.0}


class _Crash(BaseException):
    """Stands for the replayer's process dying (not an error a replay handles)."""


def test_a_crashed_replay_is_completed_by_the_next_without_duplicates(
        store: str, bg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = store
    tracker = _journal_tracker(uri, bg)
    with tracker.run("step") as run:
        for step in range(6):
            run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    [journal] = tracker.journals
    replayer = Replayer()
    applied = 0
    apply = Replayer._apply

    def dying(self: Replayer, *args: object) -> None:
        nonlocal applied
        apply(self, *args)
        applied += 1
        if applied == 3:
            raise _Crash

    monkeypatch.setattr(Replayer, "_apply", dying)
    with pytest.raises(_Crash):
        flush(tracker.spool, replayer)
    monkeypatch.setattr(Replayer, "_apply", apply)
    assert journal.exists()  # kept: its run has not ended
    # The worst moment: the run was created but its id never reached the state file.
    journal.with_name(journal.name.removesuffix(".jsonl") + ".state").unlink()

    report = flush(tracker.spool)

    assert report.sent == [journal.name] and not journal.exists()
    [replayed] = runs_of(uri, bg)
    history = make_tracker(True, uri, check=False)._client().get_metric_history(  # type: ignore[attr-defined]
        replayed.info.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(6))
    assert replayed.info.status == "FINISHED"


def test_a_journal_another_replayer_holds_is_left_to_it(store: str, bg: str) -> None:
    uri = store
    tracker = _journal_tracker(uri, bg)
    for name in ("one", "two"):
        with tracker.run(name) as run:
            run.log_params({"name": name})
    first, second = tracker.journals
    lock = first.with_name(first.name.removesuffix(".jsonl") + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another replayer is sending `one`
        report = flush(tracker.spool)
    finally:
        os.close(fd)
    assert report.busy == [first.name] and report.sent == [second.name]
    assert [r.info.run_name for r in runs_of(uri, bg)] == ["two"]
    assert flush(tracker.spool).sent == [first.name]
    assert sorted(r.info.run_name for r in runs_of(uri, bg)) == ["one", "two"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_server_keeps_the_journal(store: str, bg: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    uri = f"http://127.0.0.1:{_free_port()}"
    tracker = make_tracker(True, uri, bg, mode="background")  # no probe: the server is away
    assert isinstance(tracker, JournalTracker)
    tracker.spawn = False
    with tracker.run("step") as run:
        run.log_metrics({"loss": 1.0})
    [journal] = tracker.journals
    assert journal.is_relative_to(tmp_path / "cache" / "ctrctl" / "spool")

    report = flush(tracker.spool)

    assert report.kept == [journal.name] and report.error and not report.sent
    assert journal.exists() and pending(tracker.spool) == [journal]
    assert not (tracker.spool / FAILED_DIR).exists()


def test_a_journal_mlflow_refuses_is_set_aside(store: str, bg: str) -> None:
    uri = store
    tracker = _journal_tracker(uri, bg)
    with tracker.run("step") as run:
        run.log_params({"lr": 0.1})
        run.log_params({"lr": 0.2})  # MLflow refuses to change a param
    [journal] = tracker.journals
    report = flush(tracker.spool)
    assert report.failed == [journal.name] and not journal.exists()
    failed = tracker.spool / FAILED_DIR
    assert (failed / journal.name).is_file()
    assert "lr" in (failed / journal.name.replace(".jsonl", ".error")).read_text()


def test_a_journal_whose_writer_died_ends_as_killed(store: str, bg: str) -> None:
    uri = store
    tracker = _journal_tracker(uri, bg)
    with pytest.raises(_Crash), tracker.run("step") as run:
        run.log_metrics({"loss": 1.0})
        journal = run.journal  # type: ignore[attr-defined]
        raise _Crash
    # A writer that died leaves its .part journal with no end line and a dead pid.
    done = tracker.journals[0]
    lines = done.read_text().splitlines()[:-1]
    orphan = done.with_name(done.name.replace(f"-{os.getpid()}-", "-999999999-") + ".part")
    orphan.write_text("\n".join(lines) + '\n{"op": "metr')  # cut mid-line
    done.unlink()
    assert journal.id and pending(tracker.spool) == [orphan]
    assert flush(tracker.spool).sent == [orphan.name]
    [replayed] = runs_of(uri, bg)
    assert replayed.info.status == "KILLED" and replayed.data.metrics == {"loss": 1.0}


def test_a_spool_that_cannot_be_written_is_one_clear_error(tmp_path: Path) -> None:
    from ctrctl.errors import TrackingError

    (tmp_path / ".ctrctl").write_text("not a folder")
    tracker = JournalTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "x", spawn=False)
    with pytest.raises(TrackingError, match="journal") as caught, tracker.run("step"):
        pass
    assert "CTRCTL_TRACKING_MODE=sync" in str(caught.value.hint)


def test_tracking_flush_sends_what_waits_and_says_what_is_left(
        store: str, bg: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from ctrctl.cli.app import main

    tracker = _journal_tracker(store, bg)
    with tracker.run("step") as run:
        run.log_metrics({"loss": 1.0})
    assert main(["tracking", "flush", "--tracking-uri", store]) == 0
    assert "1 journals sent" in capsys.readouterr().err
    assert [r.info.run_name for r in runs_of(store, bg)] == ["step"]

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    away = f"http://127.0.0.1:{_free_port()}"
    waiting = _journal_tracker(away, bg)
    with waiting.run("step"):
        pass
    assert main(["tracking", "flush", "--tracking-uri", away]) == 1
    assert "1 journals kept: the store did not answer" in capsys.readouterr().err
    assert pending(waiting.spool) == waiting.journals
