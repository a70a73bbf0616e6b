"""MovieLens-100k on TensorFlow Recommenders' retrieval protocol, with ctrctl's two-tower.

The protocol of TFRS' basic retrieval tutorial: every rating is a positive, the ratings are
divided 80/20 at random, and a test rating counts when its movie is among the user's top
100 of every movie (train movies not excluded): top-100 categorical accuracy, which is
recall@100 over the test ratings. Popularity and BPR are ranked on the same rows.

    python scripts/movielens_tfrs.py --data ../shared/data/movielens-100k --out /tmp/tfrs
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.data.schema import Schema, load_schema
from ctrctl.retrieval.evaluate import evaluate_retrieval
from ctrctl.training.loop import train

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/movielens-100k")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    args = parse_args(argv)
    data = load_schema(ROOT / "schemas" / "movielens_retrieval.yaml").to_dict()
    data["interactions"]["positives"] = "all"
    dataset = args.out / "dataset"
    preprocess(Schema.from_dict(data), [str(args.data / "u.data")], dataset,
               split_ratio="0.8,0,0.2", seed=args.seed, overwrite=True)
    config = load_config(ROOT / "pipelines" / "movielens_two_tower.yaml", [
        f"training.epochs={args.epochs}", f"training.seed={args.seed}",
        "training.val_every=0"])
    result = train(dataset, args.out / "run", config, overwrite=True)
    metrics = evaluate_retrieval(result.checkpoint, args.out / "eval", split="test",
                                 exclude_seen=False, overwrite=True)
    print(json.dumps({k: v for k, v in metrics.items() if "@" in k or k == "queries"},
                     indent=1))
    return metrics


if __name__ == "__main__":
    main()
