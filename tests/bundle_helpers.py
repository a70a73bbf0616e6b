"""A small recommendation bundle for tests: a two-tower model and a DLRM ranker trained on
one planted-factor log (300 users, 200 items), exported and bundled."""

from __future__ import annotations

import random
from pathlib import Path

import yaml

from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.inference.bundle import make_bundle
from ctrctl.inference.export import quantize_to_artifact
from ctrctl.inference.quantize import QuantizeConfig
from ctrctl.inference.retrieval import export_retrieval
from ctrctl.retrieval.indexing import index_checkpoint
from ctrctl.retrieval.synthetic import synthesize_two_tower
from ctrctl.training.loop import train

TWO_TOWER = [
    "model.kind=two_tower", "model.embedding_dim=16", "model.query_tower.layers=[16]",
    "model.item_tower.layers=[16]", "training.batch_size=128", "training.epochs=2",
    "training.val_every=0", "training.num_workers=1", "training.device=cpu",
]
RANKER = ["model.embedding_dim=8", "model.dense_arch=[8]", "model.over_arch=[16, 1]",
          "training.batch_size=128", "training.epochs=1", "training.val_every=0",
          "training.num_workers=1", "training.device=cpu"]
#: The ranker's schema: the same log as clicks (rating >= 4), user and item as raw ints.
RANKER_SCHEMA = {
    "name": "synthetic_ctr", "format": "tsv", "header": False, "label": {"threshold": 4.0},
    "columns": [{"name": "user", "role": "sparse", "type": "int", "hash_size": 301},
                {"name": "item", "role": "sparse", "type": "int", "hash_size": 201},
                {"name": "rating", "role": "label"},
                {"name": "timestamp", "role": "ignore"}]}


def build_bundle(root: Path) -> Path:
    """Train both models under ``root``, export them and bundle them into ``root/bundle``."""
    synthesize_two_tower(root / "logs", users=300, items=200, per_user=8, dim=4,
                         temperature=0.2, seed=3)
    preprocess(root / "logs" / "schema.yaml", [str(root / "logs" / "interactions.tsv")],
               root / "tt-ds")
    train(root / "tt-ds", root / "tt", load_config(None, TWO_TOWER))
    index_checkpoint(root / "tt", root / "index", kind="flat")
    export_retrieval(root / "tt", root / "index", root / "retrieval")
    # the ranker's log: the same interactions with ratings 1-5 (clicks and non-clicks)
    rng = random.Random(0)
    lines = (root / "logs" / "interactions.tsv").read_text().splitlines()
    (root / "ctr.tsv").write_text("".join(
        f"{u}\t{i}\t{rng.randint(1, 5)}\t{t}\n"
        for u, i, _, t in (line.split("\t") for line in lines)))
    (root / "ctr.yaml").write_text(yaml.safe_dump(RANKER_SCHEMA))
    preprocess(root / "ctr.yaml", [str(root / "ctr.tsv")], root / "ctr-ds",
               split_ratio=(0.8, 0.1, 0.1))
    train(root / "ctr-ds", root / "ctr", load_config(None, RANKER))
    quantize_to_artifact(root / "ctr", root / "ranker", QuantizeConfig(), log_model=False)
    make_bundle(root / "retrieval", root / "ranker", root / "bundle")
    return root / "bundle"
