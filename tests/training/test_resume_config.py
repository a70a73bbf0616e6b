"""--resume continues with the run's own settings; settings that cannot resume are named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctrctl.config import load_config
from ctrctl.errors import ConfigError
from ctrctl.testing.datasets import make_dataset
from ctrctl.training.resume import resume_config
from tests.cli.test_app import CTRCTL, error_lines, run

SMALL = ["model.embedding_dim=8", "model.dense_arch=[16,8]", "training.batch_size=64",
         "training.val_max_rows=64"]


def _run_folder(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(load_config(None, SMALL).to_dict()))
    return out


def test_the_runs_settings_with_overrides_on_top(tmp_path: Path) -> None:
    out = _run_folder(tmp_path)
    cfg = resume_config(out, None, ["training.epochs=3"])
    assert cfg.model.embedding_dim == 8 and cfg.training.epochs == 3


@pytest.mark.parametrize("overrides,key", [
    (["model.embedding_dim=16", "model.dense_arch=[16,16]"], "model.embedding_dim"),
    (["embedding_optimizer.kind=sgd"], "embedding_optimizer.kind"),
])
def test_settings_that_cannot_resume(tmp_path: Path, overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=f"cannot change when resuming: .*{key}"):
        resume_config(_run_folder(tmp_path), None, overrides)


def test_a_fresh_run_without_config_json_takes_the_defaults(tmp_path: Path) -> None:
    assert resume_config(tmp_path / "new", None, []) == load_config(None, [])


def test_cli_resume_needs_no_flags(tmp_path: Path) -> None:
    make_dataset(tmp_path / "ds", rows=256, num_sparse=3, seed=0)
    args = [CTRCTL, "train", "--dataset", "ds", "--out", "run", "--no-track"]
    first = run([*args, *SMALL, "training.max_steps=2"], tmp_path)
    assert first.returncode == 0, first.stderr
    again = run([*args, "--resume", "training.max_steps=4"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["step"] == 4
    bad = run([*args, "--resume", "model.embedding_dim=16", "model.dense_arch=[16,16]"],
              tmp_path)
    errors = [line for line in error_lines(bad.stderr) if line.startswith("error:")]
    assert bad.returncode == 1 and len(errors) == 1 and "model.embedding_dim: 8 -> 16" in errors[0]
    assert "Traceback" not in bad.stderr


@pytest.mark.slow
def test_a_run_from_before_first_order_resumes_as_it_trained(tmp_path: Path) -> None:
    # A model without dense features trained before model.first_order existed has no
    # learned vector; its config.json does not name the setting (now true by default).
    make_dataset(tmp_path / "ds", rows=256, num_dense=0, num_sparse=3, seed=0)
    args = [CTRCTL, "train", "--dataset", "ds", "--out", "run", "--no-track"]
    first = run([*args, *SMALL, "model.first_order=false", "training.max_steps=2"], tmp_path)
    assert first.returncode == 0, first.stderr
    saved = tmp_path / "run" / "config.json"
    written = json.loads(saved.read_text())
    del written["model"]["first_order"]
    saved.write_text(json.dumps(written))
    assert resume_config(tmp_path / "run", None, []).model.first_order is False
    again = run([*args, "--resume", "training.max_steps=4"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["step"] == 4
