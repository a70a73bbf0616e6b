"""Progress reports: counts are the units done, and an estimated total gives way to them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ctrctl.cli.common import RichProgress
from ctrctl.progress import LogProgress


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_log_progress_replaces_an_estimate_that_the_count_passed(
        caplog: pytest.LogCaptureFixture) -> None:
    progress = LogProgress(interval=1e9, log=logging.getLogger("ctrctl.test"))
    with caplog.at_level(logging.INFO, logger="ctrctl.test"):
        progress.start("preprocess", total=999_393, unit="rows")  # estimated from bytes
        progress.advance(600_000)
        progress.advance(400_000)
        progress.finish()
        progress.start("train", total=8_800_000, unit="samples")  # stopped early
        progress.advance(413_696)
        progress.finish()
    done, stopped = _lines(caplog)
    assert done.startswith("preprocess: 1,000,000/1,000,000 rows (") and done.endswith(" done")
    assert stopped.startswith("train: 413,696/8,800,000 samples (")


def test_rich_progress_replaces_an_estimate_that_the_count_passed() -> None:
    progress = RichProgress(embedded=True)
    progress.start("preprocess", total=10_003, unit="rows")
    bar = progress.renderable
    assert bar is not None
    progress.advance(10_000)
    progress.finish()
    assert bar.tasks[0].total == 10_003  # short of the estimate: left as it was
    progress.start("preprocess", total=999_393, unit="rows")
    bar = progress.renderable
    assert bar is not None
    progress.advance(1_000_000)
    progress.finish()
    assert (bar.tasks[0].completed, bar.tasks[0].total) == (1_000_000, 1_000_000)


def test_a_task_an_error_stopped_is_not_reported_done(caplog: pytest.LogCaptureFixture) -> None:
    progress = LogProgress(interval=1e9, log=logging.getLogger("ctrctl.test"))
    with caplog.at_level(logging.INFO, logger="ctrctl.test"):
        progress.start("eval test", total=6000, unit="rows")
        progress.advance(8192)  # past the total, but not finished: the total stays
        progress.finish(completed=False)
    (line,) = _lines(caplog)
    assert line.startswith("eval test: 8,192/6,000 rows (") and line.endswith(" stopped")


def test_eval_of_a_missing_checkpoint_fails_before_scoring(tmp_path: Path) -> None:
    from ctrctl.testing.datasets import make_dataset
    from tests.cli.test_app import CTRCTL, error_lines, run

    make_dataset(tmp_path / "ds", rows=256, num_sparse=3, seed=0)
    done = run([CTRCTL, "eval", "--checkpoint", "nowhere", "--dataset", "ds", "--out", "o",
                "--no-track"], tmp_path)
    errors = [line for line in error_lines(done.stderr) if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1 and "nowhere" in errors[0], done.stderr
    assert "rows" not in done.stderr and not (tmp_path / "o").exists()
