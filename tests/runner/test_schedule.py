"""The ``schedule:`` section and the day loop's pieces that need no training."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.config import PipelineConfig, ScheduleConfig, load_config
from ctrctl.errors import ConfigError
from ctrctl.runner.schedule import _day_config, day_files
from ctrctl.runner.schedule_report import markdown_table
from tests.runner.helpers import ROOT

CONTINUAL = ROOT / "pipelines" / "continual-demo.yaml"


def test_the_section_refuses_days_and_synth_together_and_a_repeated_arm() -> None:
    with pytest.raises(ValueError, match="exclude each other"):
        ScheduleConfig.model_validate({"days": ["a.csv"], "synth": {"days": 3}})
    with pytest.raises(ValueError, match="twice"):
        ScheduleConfig.model_validate({"days": ["a.csv"], "compare": ["frozen", "frozen"]})
    with pytest.raises(ValueError):
        ScheduleConfig.model_validate({"days": ["a.csv"], "eval": "same_day"})
    assert not ScheduleConfig().enabled
    assert ScheduleConfig.model_validate({"synth": {}}).enabled


def test_day_files_expand_globs_in_order_and_need_two_days(tmp_path: Path) -> None:
    for day in (2, 10, 1, 3):
        (tmp_path / f"day_{day}.csv").write_text("x\n")
    schedule = ScheduleConfig.model_validate({"days": [str(tmp_path / "day_*.csv")]})
    assert [p.name for p in day_files(schedule, tmp_path)] == [
        "day_1.csv", "day_2.csv", "day_3.csv", "day_10.csv"]
    with pytest.raises(ConfigError, match="matches no file"):
        day_files(ScheduleConfig.model_validate(
            {"days": [str(tmp_path / "day_1.csv"), str(tmp_path / "day_9.csv")]}), tmp_path)
    with pytest.raises(ConfigError, match="at least two"):
        day_files(ScheduleConfig.model_validate({"days": [str(tmp_path / "day_1.csv")]}),
                  tmp_path)


def test_a_day_trains_on_its_window_and_tests_on_the_next_day(tmp_path: Path) -> None:
    cfg = load_config(CONTINUAL, ["schedule.train_window=2", "schedule.promote.min_gain=0.01"])
    files = [tmp_path / f"day_{d}.csv" for d in range(1, 5)]
    first = _day_config(cfg, files, 0, tmp_path)
    assert first.data.inputs == (f"train={files[0]}", f"test={files[1]}")
    assert first.training.init_from is None and not first.schedule.enabled
    assert first.synth.format is None and first.runner.eval_split == "test"
    assert first.eval.gates == {"auc": 0.60}  # schedule.promote.gates
    assert (first.register.champion_metric, first.register.min_gain) == ("auc", 0.01)
    assert first.name == "continual-demo-day-1"


def test_the_shipped_schedule_loads() -> None:
    cfg = load_config(CONTINUAL)
    assert isinstance(cfg, PipelineConfig) and cfg.schedule.synth is not None
    assert cfg.schedule.synth.days == 7
    assert cfg.schedule.compare == ("full_retrain", "frozen")
    assert cfg.register.model_name


def test_the_table_shows_every_arm_and_the_champion() -> None:
    record = {"day": 2, "scored_on": "day_3.csv", "auc": 0.71, "logloss": 0.42,
              "calibration": 1.01, "train_seconds": 3.0, "version": "2",
              "decision": "kept", "champion": "1", "new_id_share": {"user": 0.25},
              "zch": {"user.occupancy": 0.5, "user.evictions": 12.0},
              "arms": {"full_retrain": {"auc": 0.715, "train_seconds": 6.0},
                       "frozen": {"auc": 0.66}}}
    table = markdown_table([record], ("full_retrain", "frozen"))
    header, _, row = table.splitlines()
    assert "full_retrain AUC" in header and "frozen AUC" in header
    assert "| 0.7150 | 6.0 | 0.6600 |" in row and "user 50%" in row
    assert row.endswith("| 2 | kept | 1 |")
