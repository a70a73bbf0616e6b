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


def test_the_quantize_section_carries_quantize_config(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """Per-table types, table memory per shard and the request size reach QuantizeConfig;
    a bad one is refused before any step runs, naming the quantize section's line."""
    from ctrctl.errors import ConfigError
    from ctrctl.inference.quantize import QuantizeConfig
    from ctrctl.inference.shard import DEFAULT_REQUEST_SIZE
    from ctrctl.runner.steps import quantize_settings
    from ctrctl.runner.validate import quantize_config

    monkeypatch.chdir(ROOT)
    path = ROOT / "pipelines" / "demo.yaml"
    plain = load_config(path)
    assert quantize_config(plain) == QuantizeConfig(
        dtype=plain.quantize.dtype, dense_dtype=plain.quantize.dense_dtype,
        num_shards=plain.quantize.num_shards, request_size=DEFAULT_REQUEST_SIZE)
    # an unchanged section keeps the step's key: the new keys appear only when set
    assert set(quantize_settings(plain)) == {"dtype", "dense_dtype", "num_shards"}
    cfg = load_config(path, ["quantize.per_table={C1: int4}",
                             "quantize.device_memory_bytes=1000000",
                             "quantize.request_size=64"])
    q = quantize_config(cfg)
    assert (q.table_dtype("C1"), q.table_dtype("C2")) == ("int4", plain.quantize.dtype)
    assert (q.device_memory_bytes, q.request_size) == (1_000_000, 64)
    assert quantize_settings(cfg)["per_table"] == {"C1": "int4"}
    check_pipeline(cfg, str(path))
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text() + "\nquantize:\n  per_table: {C1: int3}\n")
    with pytest.raises(ConfigError, match="int3"):
        check_pipeline(load_config(bad), str(bad))
