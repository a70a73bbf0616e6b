"""ctrctl train -> index -> eval on a planted-factor log: the commands and their files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from ctrctl.cli.app import app
from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.errors import CtrctlError
from ctrctl.metrics.ranking import ranking_metrics, target_ranks
from ctrctl.retrieval.baselines import popularity_scores
from ctrctl.retrieval.synthetic import synthesize_two_tower
from ctrctl.training.loop import train

OVERRIDES = [
    "model.kind=two_tower", "model.embedding_dim=16", "model.query_tower.layers=[16]",
    "model.item_tower.layers=[16]", "model.softmax.temperature=0.1",
    "training.batch_size=128", "training.epochs=4", "training.val_every=0",
    "training.num_workers=1", "training.device=cpu",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tt")
    synthesize_two_tower(root / "logs", users=300, items=200, per_user=10, dim=4,
                         temperature=0.2, seed=3)
    preprocess(root / "logs" / "schema.yaml", [str(root / "logs" / "interactions.tsv")],
               root / "ds")
    train(root / "ds", root / "run", load_config(None, OVERRIDES))
    return root


@pytest.mark.slow  # trains a model first (about 20 s on a quiet core)
def test_index_then_eval_report_the_model_index_and_baselines(run: Path) -> None:
    cli = CliRunner()
    done = cli.invoke(app, ["index", "--checkpoint", str(run / "run"), "--out",
                            str(run / "index"), "--kind", "flat"])
    assert done.exit_code == 0, done.output
    manifest = json.loads((run / "index" / "manifest.json").read_text())
    assert manifest["kind"] == "flat" and manifest["recall@100"] == 1.0
    assert 190 <= manifest["items"] <= 200  # the items some user picked
    assert len(manifest["checkpoint_sha256"]) == 64
    done = cli.invoke(app, ["eval", "--checkpoint", str(run / "run"), "--index",
                            str(run / "index"), "--out", str(run / "eval"), "--no-track"])
    assert done.exit_code == 0, done.output
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert metrics["queries"] == 300 and metrics["items"] == manifest["items"]
    for prefix in ("", "index.", "popularity.", "bpr."):
        for k in (10, 50, 100):
            assert 0.0 <= metrics[f"{prefix}recall@{k}"] <= 1.0
            assert metrics[f"{prefix}ndcg@{k}"] <= metrics[f"{prefix}recall@{k}"]
    # an exact (flat) index ranks as exact search does
    assert metrics["index.recall@10"] == pytest.approx(metrics["recall@10"], abs=0.01)
    # the planted factors are learnable: the model beats chance (100 of 190 unseen: ~0.53)
    assert metrics["recall@100"] > 0.6
    done = cli.invoke(app, ["quantize", "--checkpoint", str(run / "run"), "--out",
                            str(run / "export"), "--no-track"])
    assert done.exit_code == 1 and "two-tower" in str(done.exception or done.output)


def test_index_of_a_folder_without_a_checkpoint_is_one_clean_error(tmp_path: Path) -> None:
    done = CliRunner().invoke(app, ["index", "--checkpoint", str(tmp_path), "--out",
                                    str(tmp_path / "i")])
    # a library error (the CLI's entry point prints it as one line), not a crash
    assert isinstance(done.exception, CtrctlError), done.exception


def test_ranks_and_metrics_by_hand() -> None:
    scores = torch.tensor([[0.9, 0.5, 0.1], [0.2, 0.2, float("-inf")]])
    ranks = target_ranks(scores, torch.tensor([1, 0]))
    assert ranks.tolist() == [1, 1]  # a tie counts against the target
    metrics = ranking_metrics(ranks, (1, 2))
    assert metrics["recall@1"] == 0.0 and metrics["recall@2"] == 1.0
    assert metrics["ndcg@2"] == pytest.approx(1 / torch.log2(torch.tensor(3.0)).item())
    pop = popularity_scores(torch.tensor([5, 5, 7, 9, 9]), torch.tensor([5, 7, 9]))
    assert pop.argsort(descending=True).tolist() == [0, 2, 1]  # 5 and 9 tie: lower id first
