"""``model.interaction: auto`` (the default): dcn for a few features, dot otherwise, the same
choice wherever a model is built (training, a checkpoint's reload, the planner's estimate)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from ctrctl.config import load_config
from ctrctl.config.sections import ModelConfig
from ctrctl.data.dataset import BatchLoader
from ctrctl.models.scoring import load_model
from ctrctl.modules.interaction import DCNInteraction, DotInteraction
from ctrctl.planning.request import dense_model_bytes
from ctrctl.testing.datasets import make_dataset
from ctrctl.training.loop import train

OVERRIDES = ["training.batch_size=64", "training.epochs=1", "training.num_workers=1",
             "training.device=cpu", "training.val_every=0"]


@pytest.mark.parametrize(("dense", "sparse", "dim", "first_order", "expected"), [
    (0, 2, 16, True, "dcn"),     # MovieLens: user, film and the first-order vector: 3 pairs
    (0, 5, 16, True, "dcn"),     # 6 vectors, 15 pairs < 16
    (0, 6, 16, True, "dot"),     # 7 vectors, 21 pairs
    (0, 6, 16, False, "dcn"),    # no first-order vector: 6 vectors, 15 pairs
    (0, 10, 16, True, "dot"),    # Frappe
    (0, 22, 16, True, "dot"),    # Avazu
    (13, 26, 16, True, "dot"),   # Criteo
    (13, 3, 16, True, "dcn"),    # the dense vector and 3 embeddings: 6 pairs
    (0, 6, 32, True, "dcn"),     # 21 pairs < 32: a wider embedding holds more than the dots
])
def test_auto_picks_dcn_where_the_dots_hold_less_than_one_embedding(
        dense: int, sparse: int, dim: int, first_order: bool, expected: str) -> None:
    model = ModelConfig(embedding_dim=dim, dense_arch=(64, dim), first_order=first_order)
    assert model.interaction == "auto"
    assert model.resolved_interaction(dense, sparse) == expected
    for chosen in ("dot", "dcn"):  # a setting is kept whatever the data
        fixed = ModelConfig(embedding_dim=dim, dense_arch=(64, dim), interaction=chosen)
        assert fixed.resolved_interaction(dense, sparse) == chosen


@pytest.mark.parametrize(("sparse", "kind"), [(2, DCNInteraction), (8, DotInteraction)])
def test_training_builds_reloads_and_reports_the_resolved_interaction(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, sparse: int, kind: type) -> None:
    ds = make_dataset(tmp_path / "ds", {"train": 600, "val": 100, "test": 100}, num_dense=0,
                      num_sparse=sparse, num_embeddings=30, seed=3)
    with caplog.at_level(logging.INFO, logger="ctrctl.training.loop"):
        result = train(ds.path, tmp_path / "run", load_config(None, OVERRIDES))
    name = "dcn" if kind is DCNInteraction else "dot"
    assert f"interaction {name} (auto)" in caplog.text
    model, _, config = load_model(result.out)
    assert config.model.interaction == "auto"
    assert isinstance(model.interaction, kind)
    # the reload scores as an explicit setting of the same interaction does
    explicit = train(ds.path, tmp_path / "explicit",
                     load_config(None, [*OVERRIDES, f"model.interaction={name}"]))
    again, _, _ = load_model(explicit.out)
    batch = next(iter(BatchLoader.for_scoring(ds.path, "test", 50, num_workers=0).epoch(0)))
    with torch.no_grad():
        assert torch.equal(model(batch.dense, batch.sparse), again(batch.dense, batch.sparse))


def test_the_planner_prices_the_resolved_interaction() -> None:
    auto = load_config(None, [])
    for dense, tables, name in ((0, 2, "dcn"), (13, 26, "dot")):
        fixed = load_config(None, [f"model.interaction={name}"])
        assert dense_model_bytes(auto, dense, tables, 64) == \
            dense_model_bytes(fixed, dense, tables, 64)
    other = load_config(None, ["model.interaction=dot"])
    assert dense_model_bytes(auto, 0, 2, 64) != dense_model_bytes(other, 0, 2, 64)


@pytest.mark.parametrize(("sparse", "fits"), [(8, True), (2, False)])
def test_a_warm_start_compares_the_interactions_the_models_have(
        tmp_path: Path, sparse: int, fits: bool) -> None:
    """A parent that named ``dot`` (as every model before ``auto`` did) warm-starts an
    ``auto`` child where auto also means dot, and is refused, naming both, where it does not."""
    from ctrctl.errors import ConfigError

    ds = make_dataset(tmp_path / "ds", {"train": 400, "val": 100}, num_dense=0,
                      num_sparse=sparse, num_embeddings=30, seed=4)
    parent = train(ds.path, tmp_path / "parent",
                   load_config(None, [*OVERRIDES, "model.interaction=dot"]))
    child = load_config(None, [*OVERRIDES, f"training.init_from={parent.out}"])
    if fits:
        assert train(ds.path, tmp_path / "child", child).step > 0
    else:
        with pytest.raises(ConfigError, match='model.interaction: "dot" -> "dcn"'):
            train(ds.path, tmp_path / "child", child)
