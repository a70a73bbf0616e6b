"""The ``ctrctl`` entry points and how they report errors, run as real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
CTRCTL = str(VENV_BIN / "ctrctl")


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["COLUMNS"] = "80"  # a narrow terminal: long error lines must still be one line
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.fixture
def existing(tmp_path: Path) -> Path:
    out = tmp_path / "logs"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    return out


def test_a_user_error_is_one_line_on_stderr_and_exit_code_1(tmp_path: Path, existing: Path) -> None:
    done = run([CTRCTL, "synth", "--out", str(existing), "--rows", "100", "--no-track"], tmp_path)
    assert done.returncode == 1
    lines = error_lines(done.stderr)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error:")
    assert str(existing) in lines[0] and "--overwrite" in lines[0]  # what, where, what to do
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]  # untouched


def test_verbose_adds_the_traceback(tmp_path: Path, existing: Path) -> None:
    args = [CTRCTL, "--verbose", "synth", "--out", str(existing), "--rows", "100", "--no-track"]
    done = run(args, tmp_path)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "OutputExistsError" in done.stderr
    assert any(line.startswith("error:") for line in done.stderr.splitlines())


def test_a_bad_option_value_is_one_clean_line(tmp_path: Path) -> None:
    args = [CTRCTL, "synth", "--out", str(tmp_path / "x"), "--split", "train=0.5", "--no-track"]
    done = run(args, tmp_path)
    assert done.returncode == 1
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith("error:") and "sum to 0.5" in lines[0]
    assert not (tmp_path / "x").exists()


def test_usage_errors_exit_2_without_a_traceback(tmp_path: Path) -> None:
    for args in (["synth", "--rows", "many", "--out", "x"], ["no-such-command"]):
        done = run([CTRCTL, *args], tmp_path)
        assert done.returncode == 2, args
        assert "Traceback" not in done.stderr
        assert "Usage:" in done.stderr


def test_python_dash_m_and_the_console_script_show_help(tmp_path: Path) -> None:
    for args in ([sys.executable, "-m", "ctrctl", "--help"], [CTRCTL, "--help"]):
        done = run(args, tmp_path)
        assert done.returncode == 0, done.stderr
        assert "synth" in done.stdout and "--verbose" in done.stdout
    done = run([CTRCTL, "synth", "--help"], tmp_path)
    assert done.returncode == 0 and "--overwrite" in done.stdout and "--tracking-uri" in done.stdout


def test_console_script_runs_synth(tmp_path: Path) -> None:
    out = tmp_path / "logs"
    args = [CTRCTL, "synth", "--out", str(out), "--rows", "1000", "--format", "avazu", "--no-track"]
    done = run(args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # human output goes to stderr; stdout stays for machine output
    assert "best AUC" in done.stderr
    assert (out / "train.csv").read_text().startswith("id,click,hour,")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]  # no tracking store


def test_version_short_help_and_completion(tmp_path: Path) -> None:
    from ctrctl import __version__

    done = run([CTRCTL, "--version"], tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == f"ctrctl {__version__}"
    for args in (["-h"], ["train", "-h"], ["eval", "-h"]):
        done = run([CTRCTL, *args], tmp_path)
        assert done.returncode == 0 and "Usage:" in done.stdout, args
    done = run([CTRCTL, "--help"], tmp_path)
    assert "--install-completion" in done.stdout


def test_choices_are_listed_and_checked(tmp_path: Path) -> None:
    done = run([CTRCTL, "preprocess", "--help"], tmp_path)
    assert "error|skip" in done.stdout
    done = run([CTRCTL, "synth", "--format", "parquet", "--out", "x"], tmp_path)
    assert done.returncode == 2 and "criteo" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x").exists()


def test_config_has_a_short_flag_everywhere(tmp_path: Path) -> None:
    for command in (["train"], ["plan"], ["eval"], ["config", "show"]):
        done = run([CTRCTL, *command, "--help"], tmp_path)
        line = next(line for line in done.stdout.splitlines()
                    if line.lstrip("│ ").startswith("--config"))
        assert " -c " in line, (command, line)


def test_experiment_and_tracking_uri_from_the_environment(tmp_path: Path) -> None:
    done = run([CTRCTL, "synth", "--help"], tmp_path)
    assert "MLFLOW_EXPERIMENT_NAME" in done.stdout and "MLFLOW_TRACKING_URI" in done.stdout
