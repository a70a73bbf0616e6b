"""``ctrctl eval`` of a two-tower checkpoint: full ranking of every item, beside baselines.

For each row of the split (a user and the item held out for it), every catalogue item is
scored; the items the user interacted with earlier (train, and val when scoring test) are
excluded; the target's rank gives recall@K and NDCG@K (:mod:`ctrctl.metrics.ranking`).
In the same run, on the same rows:

* ``recall@K``, ``ndcg@K``: the model, exact (every item scored);
* ``index.recall@K``, ``index.ndcg@K``: the model through an index (``--index``): the
  index's top ``K + seen`` items, the seen ones dropped;
* ``popularity.recall@K``: items by train interactions;
* ``bpr.recall@K``: BPR matrix factorisation trained here on the train split.

Example:
    >>> metrics = evaluate_retrieval("runs/tt", "eval", split="test", index="index")
    >>> metrics["recall@100"], metrics["popularity.recall@100"], metrics["bpr.recall@100"]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrctl import checkpoint as ckpt
from ctrctl.data.interactions import interaction_columns, read_split_frame
from ctrctl.io import staged_folder, write_json_atomic
from ctrctl.metrics.ranking import RANKING_KS, ranking_metrics, target_ranks
from ctrctl.models.scoring import load_model
from ctrctl.models.two_tower import (
    Catalogue,
    embed,
    evaluation_queries,
    history_mask_rows,
    item_catalogue,
    rank_queries,
)
from ctrctl.retrieval.baselines import BPRConfig, popularity_scores, train_bpr
from ctrctl.retrieval.index import load_index
from ctrctl.retrieval.indexing import trained_dataset
from ctrctl.tracking import Tracker

__all__ = ["evaluate_retrieval", "is_two_tower"]

logger = logging.getLogger(__name__)


def is_two_tower(checkpoint: str | Path) -> bool:
    """Whether a checkpoint holds a two-tower model (``model.kind: two_tower``)."""
    meta = ckpt.read_metadata(checkpoint)
    return (meta.config or {}).get("model", {}).get("kind") == "two_tower"


def evaluate_retrieval(checkpoint: str | Path, out: str | Path, *,
                       dataset: str | Path | None = None, split: str = "test",
                       index: str | Path | None = None, ks: Sequence[int] = RANKING_KS,
                       baselines: bool = True, bpr: BPRConfig = BPRConfig(),
                       exclude_seen: bool = True,
                       overwrite: bool = False,
                       tracker: Tracker | None = None) -> dict[str, Any]:
    """Evaluate a two-tower checkpoint on ``split`` and write ``out/metrics.json``.

    Args:
        checkpoint: the training run or a checkpoint in it.
        out: the folder to create.
        dataset: default: the one the model was trained on.
        split: the split whose rows are the queries.
        index: an index folder (``ctrctl index``) to rank through as well.
        ks: the cut-offs.
        baselines: also popularity and BPR.
        exclude_seen: drop the user's earlier items from the ranking (False: TensorFlow
            Recommenders' protocol, every item ranked).
        bpr: BPR's settings.
        overwrite: replace an existing ``out``.
        tracker: MLflow tracking (one run "eval"); None tracks nothing.

    Returns:
        The metrics (also in ``metrics.json``).
    """
    tracker = tracker or Tracker()
    started = time.perf_counter()
    model, _, _ = load_model(checkpoint)
    folder, manifest = trained_dataset(checkpoint, dataset)
    user, item_id, _ = interaction_columns(manifest)
    catalogue = item_catalogue(folder, manifest)
    queries, history = evaluation_queries(folder, manifest, split)
    if not exclude_seen:
        history = {}
    users, targets = queries[user].to_list(), queries[item_id].to_list()
    item_vectors = embed(model, catalogue.features, "item")
    query_vectors = embed(model, queries, "query")
    ranks = rank_queries(query_vectors, item_vectors, users, targets, catalogue, history)
    metrics: dict[str, Any] = {"split": split, "queries": len(users),
                               "exclude_seen": exclude_seen,
                               "items": len(catalogue), **ranking_metrics(ranks, ks)}
    if index is not None:
        metrics.update(_index_metrics(index, query_vectors, users, targets, history, ks))
    if baselines:
        train = read_split_frame(folder, manifest, "train", [user, item_id])
        train_users = torch.from_numpy(train[user].to_numpy().astype("int64"))
        train_items = torch.from_numpy(train[item_id].to_numpy().astype("int64"))
        popular = popularity_scores(train_items, catalogue.ids)
        metrics.update(_baseline(lambda u: popular.expand(len(u), -1), users, targets,
                                 catalogue, history, ks, "popularity."))
        sizes = manifest.table_sizes()
        fitted = train_bpr(train_users, train_items, sizes[user], sizes[item_id],
                           catalogue.ids, bpr)
        metrics.update(_baseline(lambda u: fitted.scores(u, catalogue.ids), users, targets,
                                 catalogue, history, ks, "bpr."))
        metrics["bpr.config"] = asdict(bpr)
    metrics["seconds"] = time.perf_counter() - started
    meta = ckpt.read_metadata(checkpoint)
    metrics["checkpoint"] = str(meta.path)
    with tracker.run("eval") as run:
        run.log_params({"checkpoint": str(meta.path), "split": split,
                        "index": str(index) if index else None, "kind": "two_tower"})
        run.log_metrics({k: float(v) for k, v in metrics.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)})
        with staged_folder(out, overwrite=overwrite) as stage:
            write_json_atomic(stage / "metrics.json", metrics)
        run.log_artifact(Path(out) / "metrics.json")
    return metrics


def _baseline(scorer: Any, users: list[int], targets: list[int], catalogue: Catalogue,
              history: dict[int, list[int]], ks: Sequence[int], prefix: str,
              chunk: int = 1024) -> dict[str, float]:
    """Rank with ``scorer(user ids) -> (q, N)`` as the model is ranked."""
    ranks = []
    target_cols = catalogue.columns(torch.as_tensor(targets, dtype=torch.long))
    for start in range(0, len(users), chunk):
        stop = min(start + chunk, len(users))
        scores = scorer(torch.as_tensor(users[start:stop], dtype=torch.long)).clone()
        rows, cols = history_mask_rows(users[start:stop], history, targets[start:stop],
                                       catalogue)
        scores[rows, cols] = float("-inf")
        ranks.append(target_ranks(scores, target_cols[start:stop]))
    return ranking_metrics(torch.cat(ranks) if ranks else torch.zeros(0), ks, prefix)


def _index_metrics(folder: str | Path, query_vectors: torch.Tensor, users: list[int],
                   targets: list[int], history: dict[int, list[int]],
                   ks: Sequence[int]) -> dict[str, float]:
    """Rank through the index: its top ``max(ks) + seen`` items, seen items dropped; a
    target not returned is a miss."""
    loaded = load_index(folder)
    most_seen = max((len(history.get(u, ())) for u in users), default=0)
    depth = min(max(ks) + most_seen, int(loaded.index.ntotal))
    _, found = loaded.search(query_vectors.numpy().astype(np.float32), depth)
    ranks = torch.empty(len(users), dtype=torch.float64)
    for row, (user, target) in enumerate(zip(users, targets, strict=True)):
        seen = set(history.get(user, ())) - {target}
        kept = [i for i in found[row].tolist() if i not in seen and i >= 0]
        ranks[row] = kept.index(target) if target in kept[:max(ks)] else float("inf")
    return ranking_metrics(ranks, ks, "index.")
