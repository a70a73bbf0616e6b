"""Output into a pipe or a file: tables at their content's width, plain progress lines whose
counts read right, no MLflow download bars, counts printed as counts."""

from __future__ import annotations

import logging
import os

import pytest
from rich.table import Table

from ctrctl.cli import common
from ctrctl.progress import LogProgress, format_value


def test_counts_print_whole_and_metrics_with_decimals() -> None:
    assert format_value("val.rows", 2000.0) == "2000"
    assert format_value("step", 12) == "12"
    assert format_value("val.auc", 0.712345) == "0.7123"
    assert format_value("val.logloss", 1.0) == "1.0000"  # a metric, not a count
    assert format_value("val.auc", 0.5, digits=5) == "0.50000"


def test_an_estimated_total_gives_way_to_the_count(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("piped-progress-test")
    progress = LogProgress(interval=1e9, log=log)
    with caplog.at_level(logging.INFO, logger=log.name):
        progress.start("preprocess", total=20_020, unit="rows", estimate=True)
        progress.advance(20_000)
        progress.finish()
    assert "20,000/20,000 rows" in caplog.text and "20,020" not in caplog.text


def test_a_piped_console_is_as_wide_as_its_content(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    console = common._console(stderr=True)  # stderr is captured: not a terminal
    assert not console.is_terminal and console.width == common.PIPED_WIDTH
    table = Table(title="plan")
    for name in ("table", "sharding", "compute kernel", "ranks", "rows", "bytes"):
        table.add_column(name)
    table.add_row("table_with_a_long_name_" * 3, "table_wise", "fused", "0,1,2,3",
                  "1,000,000,000", "128,000,000,000")
    console.print(table)
    text = capsys.readouterr().err
    assert "…" not in text and "table_with_a_long_name_" * 3 in text
    assert "1,000,000,000" in text and max(len(line) for line in text.splitlines()) < 300


def test_mlflow_download_bars_are_off_in_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    from ctrctl.tracking import ARTIFACT_BAR_ENV, make_tracker

    monkeypatch.delenv(ARTIFACT_BAR_ENV, raising=False)
    make_tracker(enabled=True, tracking_uri=None, check=False)  # stderr is captured: a pipe
    assert os.environ[ARTIFACT_BAR_ENV] == "false"
    monkeypatch.setenv(ARTIFACT_BAR_ENV, "true")  # a user's choice stands
    make_tracker(enabled=True, tracking_uri=None, check=False)
    assert os.environ[ARTIFACT_BAR_ENV] == "true"
