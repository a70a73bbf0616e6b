"""Every shipped pipeline YAML loads, opens with its command, and the runnable ones validate."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.config import load_config
from ctrctl.runner.validate import check_pipeline
from tests.runner.helpers import ROOT

PIPELINES = sorted((ROOT / "pipelines").glob("*.yaml"))
#: Pipelines ``ctrctl run`` runs (the others configure single commands).
RUNNABLE = {"demo", "criteo_dlrm", "avazu_dlrm"}


def test_the_pipelines_are_found() -> None:
    assert {p.stem for p in PIPELINES} >= RUNNABLE


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.stem)
def test_every_shipped_pipeline_loads_and_opens_with_its_command(path: Path) -> None:
    cfg = load_config(path)
    assert path.read_text().startswith("# Run:")
    if path.stem in RUNNABLE:
        assert "ctrctl run pipelines/" in path.read_text().splitlines()[0]
        assert cfg.register.model_name and cfg.eval.gates


@pytest.mark.parametrize("name", sorted(RUNNABLE - {"demo"}))
def test_the_data_pipelines_validate_with_their_inputs(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    path = ROOT / "pipelines" / f"{name}.yaml"
    with pytest.raises(Exception, match="no inputs"):
        check_pipeline(load_config(path), str(path))
    files = [tmp_path / f"{s}.log" for s in ("train", "val", "test")]
    for f in files:
        f.write_text("")
    inputs = ",".join(f"{f.stem}={f}" for f in files)
    check_pipeline(load_config(path, [f"data.inputs=[{inputs}]"]), str(path))


def test_the_demo_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    path = ROOT / "pipelines" / "demo.yaml"
    check_pipeline(load_config(path), str(path))
