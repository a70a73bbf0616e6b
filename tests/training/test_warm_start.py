"""Warm starts: a new run from a previous run's weights and optimizer state on new data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ctrctl import checkpoint as ckpt
from ctrctl.config import load_config
from ctrctl.data.manifest import DatasetManifest
from ctrctl.distributed.processes import run_multiprocess
from ctrctl.errors import ConfigError
from ctrctl.models import build as model_io
from ctrctl.testing.datasets import SyntheticDataset, make_dataset
from ctrctl.testing.training_ranks import _saved_tables
from ctrctl.testing.warm_start_ranks import continued_body, warm_body
from ctrctl.training.loop import train
from ctrctl.training.optimizers import dense_optimizer
from ctrctl.training.warm_start import resolve_parent, warm_start

OVERRIDES = [
    "model.embedding_dim=8", "model.dense_arch=[16,8]", "model.over_arch=[16,1]",
    "training.batch_size=64", "training.epochs=1", "training.val_every=0",
    "training.log_every=3", "training.num_workers=1", "training.shuffle_buffer=300",
    "training.device=cpu", "training.early_stopping.enabled=false",
    "dense_optimizer.kind=adam",
]
SIZES = [40, 50, 60, 30]


def _data(path: Path, seed: int, sizes: list[int] = SIZES, dense: int = 3) -> SyntheticDataset:
    return make_dataset(path, {"train": 640, "val": 128}, num_dense=dense, num_sparse=4,
                        num_embeddings=sizes, row_group_size=128, seed=seed)


@pytest.fixture(scope="module")
def days(tmp_path_factory: pytest.TempPathFactory) -> tuple[SyntheticDataset, SyntheticDataset]:
    root = tmp_path_factory.mktemp("days")
    return _data(root / "day1", seed=3), _data(root / "day2", seed=4)


@pytest.fixture(scope="module")
def day1_run(days: tuple[SyntheticDataset, SyntheticDataset],
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "day1"
    train(days[0].path, out, load_config(None, OVERRIDES))
    return out


def _assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


def test_warm_start_equals_continuing_the_run_on_new_data(
        days: tuple[SyntheticDataset, SyntheticDataset], day1_run: Path, tmp_path: Path) -> None:
    parent = ckpt.resolve_checkpoint(day1_run)
    warm = warm_body(0, 1, str(days[1].path), str(tmp_path / "warm"),
                     [*OVERRIDES, f"training.init_from={day1_run}"], None)
    continued = continued_body(0, 1, str(parent), str(days[1].path), str(tmp_path / "cont"),
                               OVERRIDES, None)
    _assert_bitwise(warm, continued)
    # and it did start from the parent: a run from scratch on day 2 ends elsewhere
    scratch = _saved_tables(train(days[1].path, tmp_path / "scratch",
                                  load_config(None, OVERRIDES)).checkpoint)
    assert not torch.equal(scratch["C1"], warm["C1"])
    # step counter, schedule and lineage: fresh steps, the parent recorded
    meta = ckpt.read_metadata(tmp_path / "warm")
    assert meta.step == 10 and meta.epoch == 0
    assert meta.extra["parent"]["checkpoint"] == str(parent)
    assert meta.extra["parent"]["step"] == ckpt.read_metadata(parent).step == 10
    assert meta.extra["parent"]["resized"] == {}


def test_a_grown_hashed_table_keeps_its_old_rows_bitwise(
        days: tuple[SyntheticDataset, SyntheticDataset], day1_run: Path, tmp_path: Path) -> None:
    grown = _data(tmp_path / "grown", seed=5, sizes=[40, 80, 60, 30])  # C2: 50 -> 80 rows
    cfg = load_config(None, OVERRIDES)
    torch.manual_seed(cfg.training.seed)
    fresh = model_io.build_model(cfg, grown.manifest, torch.device("cpu"))
    torch.manual_seed(cfg.training.seed)
    model = model_io.build_model(cfg, grown.manifest, torch.device("cpu"))
    optimizer = dense_optimizer(model_io.dense_parameters(model), cfg.dense_optimizer)
    parent = warm_start(model, optimizer, resolve_parent(str(day1_run)), grown.manifest, cfg)
    assert parent.resized == {"C2": [50, 80]}
    saved = _saved_tables(ckpt.resolve_checkpoint(day1_run))
    ebc, ebc0 = model.sparse_arch, fresh.sparse_arch  # type: ignore[union-attr]
    weights, weights0 = ebc.embedding_bag_weights(), ebc0.embedding_bag_weights()
    states, states0 = ebc.optimizer_state(), ebc0.optimizer_state()
    assert torch.equal(weights["C2"][:50], saved["C2"])        # the parent's rows, bitwise
    assert torch.equal(weights["C2"][50:], weights0["C2"][50:])  # new rows: as a fresh run's
    for name, value in states["C2"].items():
        assert torch.equal(value.view(80, -1)[:50], saved[f"C2.{name}"].view(50, -1))
        assert torch.equal(value.view(80, -1)[50:], states0["C2"][name].view(80, -1)[50:])
    assert not torch.equal(weights["C2"][:50], weights0["C2"][:50])
    assert torch.equal(weights["C1"], saved["C1"])
    # and training on the grown dataset runs from it
    result = train(grown.path, tmp_path / "run", load_config(
        None, [*OVERRIDES, f"training.init_from={day1_run}"]))
    assert ckpt.read_metadata(result.checkpoint).extra["parent"]["resized"] == {"C2": [50, 80]}


@pytest.mark.parametrize(("change", "named"), [
    ({"sizes": [40, 50, 60, 20]}, "table C4: 30 rows -> 20"),
    ({"dense": 2}, "dense features"),
    ({"overrides": ["model.embedding_dim=4", "model.dense_arch=[16,4]"]},
     "setting model.embedding_dim: 8 -> 4"),
])
def test_a_model_that_does_not_fit_is_refused_naming_the_difference(
        day1_run: Path, tmp_path: Path, change: dict, named: str) -> None:  # type: ignore[type-arg]
    data = _data(tmp_path / "d", seed=6, sizes=change.get("sizes", SIZES),
                 dense=change.get("dense", 3))
    cfg = load_config(None, [*OVERRIDES, *change.get("overrides", []),
                             f"training.init_from={day1_run}"])
    with pytest.raises(ConfigError, match=named) as info:
        train(data.path, tmp_path / "run", cfg)
    assert str(day1_run) in str(info.value)


def test_a_vocabulary_table_that_changed_size_is_refused(day1_run: Path) -> None:
    from dataclasses import replace

    from ctrctl.training.warm_start import check_compatible

    manifest = DatasetManifest.load(ckpt.read_metadata(day1_run).extra["dataset"])
    vocab = replace(manifest, sparse=(replace(manifest.sparse[0], mode="vocab"),
                                      *manifest.sparse[1:]))
    with pytest.raises(ConfigError, match="mode hash -> vocab"):
        check_compatible(ckpt.read_metadata(day1_run), vocab, load_config(None, OVERRIDES))


def _plan(ds: SyntheticDataset, world: int) -> dict:  # type: ignore[type-arg]
    from ctrctl.distributed.default_plan import forced_plan

    cfg = load_config(None, OVERRIDES)
    model = model_io.build_model(cfg, ds.manifest, torch.device("cpu"))
    tables = model.sparse_arch.embedding_bag_configs()  # type: ignore[operator]
    # no data_parallel table: its state lives in the dense optimizer, so only a run planned
    # the same way continues it exactly (refused otherwise, see warm_start._load_tables)
    return forced_plan(tables, world, {"C1": "row_wise", "C2": "table_wise",
                                       "C3": "column_wise", "C4": "table_row_wise"}).to_dict()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_warm_start_across_world_sizes_equals_continuing(
        days: tuple[SyntheticDataset, SyntheticDataset], tmp_path: Path,
        before: int, after: int) -> None:
    day1, day2 = days
    if before == 1:
        train(day1.path, tmp_path / "day1", load_config(None, OVERRIDES))
    else:
        run_multiprocess(warm_body, 2, args=(str(day1.path), str(tmp_path / "day1"),
                                             OVERRIDES, _plan(day1, 2)), timeout_s=300)
    parent = ckpt.resolve_checkpoint(tmp_path / "day1")
    assert ckpt.read_metadata(parent).world_size == before
    plan = _plan(day2, after) if after > 1 else None
    warm_args = (str(day2.path), str(tmp_path / "warm"),
                 [*OVERRIDES, f"training.init_from={parent}"], plan)
    cont_args = (str(parent), str(day2.path), str(tmp_path / "cont"), OVERRIDES, plan)
    if after == 1:
        warm, cont = warm_body(0, 1, *warm_args), continued_body(0, 1, *cont_args)
    else:
        warm = run_multiprocess(warm_body, 2, args=warm_args, timeout_s=300)[0]
        cont = run_multiprocess(continued_body, 2, args=cont_args, timeout_s=300)[0]
    _assert_bitwise(warm, cont)


def test_cli_warm_starts_from_a_registered_version_and_tags_the_parent(
        days: tuple[SyntheticDataset, SyntheticDataset], day1_run: Path, tmp_path: Path) -> None:
    import shutil

    from mlflow.tracking import MlflowClient
    from typer.testing import CliRunner

    from ctrctl.cli.app import app
    from ctrctl.io import tree_sha256

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    parent = ckpt.resolve_checkpoint(shutil.copytree(day1_run, tmp_path / "day1"))
    client.create_registered_model("ctr")
    version = client.create_model_version("ctr", str(tmp_path), tags={
        "ctrctl.checkpoint": str(parent), "ctrctl.checkpoint.sha256": tree_sha256(parent)})
    client.set_registered_model_alias("ctr", "champion", version.version)
    result = CliRunner().invoke(app, [
        "train", "--dataset", str(days[1].path), "--out", str(tmp_path / "warm"),
        "--init-from", "models:/ctr@champion", "--tracking-uri", uri, *OVERRIDES])
    assert result.exit_code == 0, result.output
    meta = ckpt.read_metadata(tmp_path / "warm")
    assert meta.extra["parent"]["model_version"] == "1"
    assert meta.extra["parent"]["source"] == "models:/ctr@champion"
    run = client.get_run(meta.extra["mlflow_run_id"])
    assert run.data.tags["ctrctl.parent.checkpoint"] == str(parent)
    assert run.data.tags["ctrctl.parent.model_version"] == "1"
    # a checkpoint changed after it was registered is refused
    (parent / "metadata.json").write_text((parent / "metadata.json").read_text() + " ")
    result = CliRunner().invoke(app, [
        "train", "--dataset", str(days[1].path), "--out", str(tmp_path / "again"),
        "--init-from", "models:/ctr/1", "--tracking-uri", uri, *OVERRIDES])
    assert "changed since it was registered" in str(result.exception)
