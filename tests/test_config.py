"""Pipeline configs: every shipped YAML validates; unknown keys and bad overrides are errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ctrctl.config import (
    PipelineConfig,
    TrainingConfig,
    apply_overrides,
    defaults_path,
    load_config,
    parse_config,
)
from ctrctl.errors import ConfigError
from ctrctl.training.sizes import resolve_sizes

ROOT = Path(__file__).resolve().parents[1]
PIPELINES = sorted((ROOT / "pipelines").glob("*.yaml"))


def test_pipelines_exist() -> None:
    assert any(p.name == "default.yaml" for p in PIPELINES)


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.name)
def test_every_shipped_pipeline_loads(path: Path) -> None:
    cfg = load_config(path)
    assert isinstance(cfg, PipelineConfig)
    first = path.read_text().splitlines()[0]
    assert first.startswith("#") and "ctrctl " in first, "a pipeline opens with its command"


def test_defaults_without_a_file_are_the_shipped_default_yaml() -> None:
    cfg = load_config(None)
    assert cfg.model.dense_arch[-1] == cfg.model.embedding_dim
    assert cfg.training.batch_size is None  # chosen from the data
    assert cfg == load_config(ROOT / "pipelines" / "default.yaml")
    assert (ROOT / "pipelines" / "default.yaml").resolve() == defaults_path().resolve()
    # The sections' own defaults agree with the file, so a YAML leaving a key out gets the
    # file's value.
    own, shipped = PipelineConfig().to_dict(), cfg.to_dict()
    own.pop("description"), shipped.pop("description")
    assert own == shipped


def test_default_yaml_sets_every_key() -> None:
    data = yaml.safe_load(defaults_path().read_text())

    def keys(node: object, prefix: str = "") -> set[str]:
        if not isinstance(node, dict):
            return {prefix}
        return {k for key, v in node.items() for k in keys(v, f"{prefix}{key}.")}

    written = keys(data)
    for section in ("model", "embedding_optimizer", "dense_optimizer", "training"):
        expected = keys(PipelineConfig().to_dict()[section], f"{section}.")
        assert expected <= written, sorted(expected - written)


@pytest.mark.parametrize(("rows", "batch", "epochs"), [
    (7_200, 64, 18), (57_721, 512, 18), (1_000_000, 4096, 9), (10_000_000, 4096, 1)])
def test_sizes_follow_the_row_count(rows: int, batch: int, epochs: int) -> None:
    sizes = resolve_sizes(TrainingConfig(), rows)
    assert (sizes.batch_size, sizes.epochs) == (batch, epochs)
    assert sizes.steps_per_epoch == -(-rows // batch)
    # four times an epoch (at most every 25 steps), and at least four times a run
    assert sizes.val_every == min(sizes.steps_per_epoch, sizes.total_steps // 4,
                                  max(25, sizes.steps_per_epoch // 4))
    assert set(sizes.chosen) == {"batch_size", "epochs", "val_every"}


def test_explicit_sizes_win_and_are_not_reported_as_chosen() -> None:
    sizes = resolve_sizes(TrainingConfig(batch_size=100, epochs=2, val_every=0), 1000)
    assert (sizes.batch_size, sizes.epochs, sizes.val_every, sizes.total_steps) == (
        100, 2, 0, 20)
    assert sizes.chosen == ()
    capped = resolve_sizes(TrainingConfig(max_steps=7), 7_200)
    assert capped.total_steps == 7 and capped.val_every == 1
    assert resolve_sizes(TrainingConfig(), 7_200, world_size=3).batch_size % 3 == 0


def test_overrides_are_typed_and_win(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "pipelines" / "default.yaml", [
        "training.batch_size=1024", "dense_optimizer.kind=adam", "dense_optimizer.lr=1e-3",
        "model.embedding_dim=8", "model.dense_arch=[32,8]", "training.max_steps=7",
    ])
    assert cfg.training.batch_size == 1024
    assert cfg.dense_optimizer.kind == "adam"
    assert cfg.dense_optimizer.lr == pytest.approx(1e-3)
    assert cfg.model.dense_arch == (32, 8)
    assert cfg.training.max_steps == 7


def test_config_is_frozen() -> None:
    cfg = load_config(None)
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError
        cfg.training.epochs = 5  # type: ignore[misc]


def test_unknown_key_in_file_names_key_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  embedding_dim: 16\ntraining:\n  epochs: 2\n  batch_sise: 64\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    text = str(info.value)
    assert "training.batch_sise" in text
    assert f"{path}:5" in text


def test_unknown_section(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("trainig:\n  epochs: 2\n")
    with pytest.raises(ConfigError, match="unknown key 'trainig'"):
        load_config(path)


@pytest.mark.parametrize("override, needle", [
    ("training.batch_sise=3", "training.batch_sise"),
    ("training.batch_size=abc", "training.batch_size"),
    ("training.batch_size=-4", "training.batch_size"),
    ("model.interaction=attention", "model.interaction"),
    ("training", "key=value"),
    ("model.embedding_dim=8", "dense_arch must end at embedding_dim"),
])
def test_bad_overrides(override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "pipelines" / "default.yaml", [override])
    assert needle in str(info.value)


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)


def test_apply_overrides_does_not_touch_input() -> None:
    data = {"training": {"epochs": 1}}
    out = apply_overrides(data, ["training.epochs=3", "model.embedding_dim=4"])
    assert data == {"training": {"epochs": 1}}
    assert out == {"training": {"epochs": 3}, "model": {"embedding_dim": 4}}


def test_round_trip_through_dict() -> None:
    cfg = load_config(ROOT / "pipelines" / "dcn.yaml")
    again = PipelineConfig.model_validate(cfg.to_dict())
    assert again == cfg


def test_plan_constraints_are_typed(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text("plan:\n  constraints:\n"
                    "    C1: {sharding_types: [row_wise], ranks: [0, 1], min_col_block: 8}\n"
                    "    C2: {compute_kernels: [fused_uvm_caching], cache_load_factor: 0.2}\n")
    cons = load_config(path).plan.constraints
    assert cons["C1"].sharding_types == ("row_wise",) and cons["C1"].ranks == (0, 1)
    assert cons["C2"].as_dict() == {"compute_kernels": ["fused_uvm_caching"],
                                    "cache_load_factor": 0.2}
    assert load_config(None).plan.constraints == {}


@pytest.mark.parametrize("entry, needle", [
    ("{sharding_type: [row_wise]}", "unknown key 'plan.constraints.C1.sharding_type'"),
    ("{sharding_types: [diagonal]}", "diagonal"),
    ("{compute_kernels: [magic]}", "magic"),
    ("{cache_load_factor: 1.5}", "plan.constraints.C1.cache_load_factor"),
    ("{min_col_block: 0}", "plan.constraints.C1.min_col_block"),
    ("{ranks: [-1]}", "ranks must be >= 0"),
])
def test_bad_plan_constraints_name_the_key_and_line(tmp_path: Path, entry: str,
                                                     needle: str) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(f"plan:\n  constraints:\n    C1: {entry}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert needle in str(info.value)
    assert f"{path}:" in str(info.value)


def test_empty_dense_arch_is_allowed_for_datasets_without_dense_features() -> None:
    cfg = load_config(None, ["model.dense_arch=[]", "model.embedding_dim=8"])
    assert cfg.model.dense_arch == ()
    with pytest.raises(ConfigError, match="positive"):
        load_config(None, ["model.dense_arch=[0, 16]"])


def test_removed_keys_of_older_checkpoints_are_ignored() -> None:
    old = {"preprocess": {"schema_path": "s.yaml", "inputs": ["a"], "out": "ds"},
           "eval": {"splits": ["test"], "gates": {"auc": 0.7}}}
    cfg = parse_config(old)
    assert cfg.preprocess.out == "ds" and cfg.eval.gates == {"auc": 0.7}
    with pytest.raises(ConfigError, match="unknown key"):
        parse_config({"eval": {"split": ["test"]}})
