"""A two-tower model trains through ``ctrctl train``: on one process, and sharded on gloo
at world size 2 with the same global batch, to the same towers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.distributed.processes import run_multiprocess
from ctrctl.models.scoring import load_model
from ctrctl.models.two_tower import embed, evaluation_queries, item_catalogue
from ctrctl.retrieval.synthetic import synthesize_two_tower
from ctrctl.testing.retrieval_ranks import two_tower_train_body
from ctrctl.training.loop import train

OVERRIDES = [
    "model.kind=two_tower", "model.embedding_dim=8", "model.query_tower.layers=[16,8]",
    "model.item_tower.layers=[16,8]", "model.softmax.temperature=0.1",
    "model.softmax.popularity_alpha=0.2", "training.batch_size=64", "training.max_steps=6",
    "training.val_every=3", "training.log_every=1", "training.num_workers=1",
    "training.device=cpu", "training.global_order=true",
    "training.early_stopping.restore_best=false",
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("two_tower")
    synthesize_two_tower(root / "logs", users=120, items=60, per_user=8, dim=4, seed=1)
    preprocess(root / "logs" / "schema.yaml", [str(root / "logs" / "interactions.tsv")],
               root / "ds")
    return root / "ds"


def towers(checkpoint: Path, dataset: Path) -> tuple[torch.Tensor, torch.Tensor]:
    model, manifest, _ = load_model(checkpoint)
    queries, _ = evaluation_queries(dataset, manifest, "val")
    return (embed(model, queries, "query"),
            embed(model, item_catalogue(dataset, manifest).features, "item"))


def test_one_process_trains_and_validates_by_recall(dataset: Path, tmp_path: Path) -> None:
    result = train(dataset, tmp_path / "one", load_config(None, OVERRIDES))
    validations = [h for h in result.history if "val.recall@10" in h]
    assert [h["step"] for h in validations] == [3, 6]
    assert result.metrics["val.rows"] == 120
    assert 0.0 <= result.metrics["val.recall@100"] <= 1.0
    losses = [h["train.loss"] for h in result.history if "train.loss" in h]
    assert losses[-1] < losses[0]


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_towers_on_two_ranks_equal_one_process(dataset: Path, tmp_path: Path) -> None:
    one = train(dataset, tmp_path / "one", load_config(None, OVERRIDES))
    ranks = run_multiprocess(two_tower_train_body, 2,
                             args=(str(dataset), str(tmp_path / "two"), OVERRIDES),
                             timeout_s=240)
    two = ranks[0]
    validations = [[h for h in r["history"] if "val.rows" in h] for r in ranks]
    assert validations[0] == validations[1]  # every rank validates the same
    q1, i1 = towers(one.checkpoint, dataset)
    q2, i2 = towers(Path(two["checkpoint"]), dataset)
    # sums over the global batch run in another order on two ranks: float32 rounding
    torch.testing.assert_close(i2, i1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(q2, q1, rtol=1e-4, atol=1e-5)
    # a rank's loss is the mean over its half of the global batch
    one_loss = [h["train.loss"] for h in one.history if "train.loss" in h]
    halves = [[h["train.loss"] for h in r["history"] if "train.loss" in h] for r in ranks]
    assert [(a + b) / 2 for a, b in zip(*halves, strict=True)] == pytest.approx(one_loss,
                                                                                rel=1e-4)
