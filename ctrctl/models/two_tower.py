"""The two-tower model a pipeline config describes (``model.kind: two_tower``), the item
catalogue of a retrieval dataset, and full-ranking recall of a model on one split.

Both towers' tables are embedding bag collections (one table per feature, named as the
feature), so the sharding, the planner, the fused optimizers and the checkpoints treat
them as a DLRM's. A sharded model runs collectives in its towers' forward: every function
here that embeds makes every rank take the same steps on the same rows.

Example:
    >>> model = build_two_tower(config, manifest, torch.device("cpu"))
    >>> catalogue = item_catalogue("dataset", manifest)
    >>> retrieval_metrics(model, "dataset", manifest, "val")   # {"recall@10": ..., ...}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import torch
from torch import nn

from ctrctl.config import PipelineConfig
from ctrctl.data.interactions import interaction_columns, read_split_frame, user_history
from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import ConfigError
from ctrctl.metrics.ranking import RANKING_KS, ranking_metrics, target_ranks
from ctrctl.modules import EmbeddingBagCollection, EmbeddingBagConfig
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.modules.two_tower import TwoTower
from ctrctl.sparse import KeyedJaggedTensor

__all__ = ["Catalogue", "build_two_tower", "embed", "item_catalogue", "kjt_from_frame",
           "retrieval_metrics", "two_tower_of"]

#: Rows embedded per forward call (the same on every rank).
EMBED_BATCH = 4096


def build_two_tower(config: PipelineConfig, manifest: DatasetManifest, device: torch.device,
                    optimizer: EmbeddingOptimizerConfig | None = None) -> TwoTower:
    """A :class:`TwoTower` over the dataset's ``role: query`` and ``item``/``item_id``
    features, tables sized by the manifest and initialised from ``training.seed``."""
    m = config.model
    _, item_id, towers = interaction_columns(manifest)
    sizes = manifest.table_sizes()

    def ebc(features: list[str], seed: int) -> EmbeddingBagCollection:
        tables = [EmbeddingBagConfig(name=f, num_embeddings=sizes[f],
                                     embedding_dim=m.embedding_dim, feature_names=[f])
                  for f in features]
        return EmbeddingBagCollection(tables, optimizer=optimizer, device=device, seed=seed)

    if not towers["query"]:
        raise ConfigError("the dataset has no role: query feature", where="manifest.json")
    seed = config.training.seed
    model = TwoTower(
        ebc(towers["query"], seed), ebc(towers["item"], seed + 1),
        query_layers=m.query_tower.layers, item_layers=m.item_tower.layers, item_id=item_id,
        temperature=m.softmax.temperature, uniform_negatives=m.softmax.uniform_negatives,
        popularity_alpha=m.softmax.popularity_alpha, logq=m.softmax.logq, seed=seed)
    return model.to(device)


def two_tower_of(model: nn.Module) -> TwoTower:
    """The :class:`TwoTower` inside wrappers (DMP, DDP) that keep it as ``.module``."""
    inner = model
    while not isinstance(inner, TwoTower):
        wrapped = getattr(inner, "module", None)
        if not isinstance(wrapped, nn.Module):
            break
        inner = wrapped
    if not isinstance(inner, TwoTower):
        raise ConfigError(f"the model is a {type(inner).__name__}, not a two-tower model",
                          hint="train it with model.kind: two_tower")
    return inner


def kjt_from_frame(frame: pl.DataFrame, keys: Sequence[str]) -> KeyedJaggedTensor:
    """A KJT of ``keys`` from a frame of id columns (int64, or lists of int64: multi-hot)."""
    values, lengths = [], []
    for key in keys:
        column = frame[key]
        if isinstance(column.dtype, pl.List):  # multi-hot
            lengths.append(torch.from_numpy(column.list.len().to_numpy().astype("int64")))
            values.append(torch.from_numpy(column.explode().drop_nulls().to_numpy()
                                           .astype("int64")))
        else:
            lengths.append(torch.ones(len(frame), dtype=torch.int64))
            values.append(torch.from_numpy(column.to_numpy().astype("int64")))
    return KeyedJaggedTensor(list(keys), torch.cat(values), lengths=torch.cat(lengths))


@dataclass(frozen=True)
class Catalogue:
    """Every item of a retrieval dataset: ids (ascending) and the item tower's features.

    Attributes:
        ids: (N,) item ids, ascending.
        features: one row per item: the item tower's feature columns (the first row the
            item appears in).
    """

    ids: torch.Tensor
    features: pl.DataFrame

    def __len__(self) -> int:
        return len(self.ids)

    def columns(self, items: torch.Tensor) -> torch.Tensor:
        """The catalogue positions of item ids (all must be in the catalogue)."""
        return torch.searchsorted(self.ids, items)


def item_catalogue(folder: str | Path, manifest: DatasetManifest) -> Catalogue:
    """The items with an interaction in any split of the dataset (id 0, the missing or
    out-of-vocabulary row, excluded)."""
    _, item_id, towers = interaction_columns(manifest)
    frames = [read_split_frame(folder, manifest, s, towers["item"]) for s in manifest.splits]
    items = (pl.concat(frames).unique(item_id, keep="first", maintain_order=True)
             .filter(pl.col(item_id) != 0).sort(item_id))
    return Catalogue(torch.from_numpy(items[item_id].to_numpy().astype("int64")), items)


@torch.no_grad()
def embed(model: nn.Module, frame: pl.DataFrame, tower: str,
          batch: int = EMBED_BATCH) -> torch.Tensor:
    """(len(frame), E) unit vectors of the ``query`` or ``item`` tower, in frame order."""
    inner = two_tower_of(model)
    keys = inner.query_tower.features if tower == "query" else inner.item_tower.features
    fn = inner.query_embeddings if tower == "query" else inner.item_embeddings
    was_training = inner.training
    inner.eval()
    try:
        parts = [fn(kjt_from_frame(frame.slice(start, batch), keys))
                 for start in range(0, len(frame), batch)]
    finally:
        inner.train(was_training)
    return torch.cat(parts) if parts else torch.zeros((0, inner.width))


def history_mask_rows(users: Sequence[int], history: dict[int, list[int]], targets: Sequence[int],
                      catalogue: Catalogue) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) pairs of the catalogue items each query's user has seen before (its
    target excluded: an item seen again stays rankable)."""
    rows: list[int] = []
    cols: list[int] = []
    for row, (user, target) in enumerate(zip(users, targets, strict=True)):
        seen = [i for i in history.get(user, ()) if i != target and i != 0]
        rows.extend([row] * len(seen))
        cols.extend(seen)
    if not cols:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return torch.tensor(rows), catalogue.columns(torch.tensor(cols))


def evaluation_queries(folder: str | Path, manifest: DatasetManifest,
                       split: str) -> tuple[pl.DataFrame, dict[int, list[int]]]:
    """The split's rows whose target item is in the catalogue (not id 0), and each user's
    earlier items: train, plus val when scoring test."""
    user, item_id, towers = interaction_columns(manifest)
    columns = list(dict.fromkeys([*towers["query"], item_id]))
    queries = read_split_frame(folder, manifest, split, columns).filter(pl.col(item_id) != 0)
    earlier = ["train"] + (["val"] if split == "test" else [])
    return queries, user_history(folder, manifest, user, item_id, earlier)


def rank_queries(query_vectors: torch.Tensor, item_vectors: torch.Tensor,
                 users: Sequence[int], targets: Sequence[int], catalogue: Catalogue,
                 history: dict[int, list[int]], chunk: int = 1024) -> torch.Tensor:
    """(Q,) each target's rank among the catalogue by <query, item>, seen items excluded."""
    ranks = []
    target_cols = catalogue.columns(torch.as_tensor(list(targets), dtype=torch.long))
    for start in range(0, len(users), chunk):
        stop = min(start + chunk, len(users))
        scores = query_vectors[start:stop] @ item_vectors.T                 # (q, N)
        rows, cols = history_mask_rows(users[start:stop], history, targets[start:stop],
                                       catalogue)
        scores[rows, cols] = float("-inf")
        ranks.append(target_ranks(scores, target_cols[start:stop]))
    return torch.cat(ranks) if ranks else torch.zeros(0, dtype=torch.long)


def retrieval_metrics(model: nn.Module, folder: str | Path, manifest: DatasetManifest,
                      split: str, ks: Sequence[int] = RANKING_KS,
                      catalogue: Catalogue | None = None) -> dict[str, float]:
    """Recall@K and NDCG@K of the model on ``split`` by exact full ranking of the catalogue.

    Every rank embeds every query and item (the same steps everywhere, as the sharded
    towers need), so every rank returns the same numbers.
    """
    user, item_id, _ = interaction_columns(manifest)
    catalogue = catalogue or item_catalogue(folder, manifest)
    queries, history = evaluation_queries(folder, manifest, split)
    items = embed(model, catalogue.features, "item")
    vectors = embed(model, queries, "query")
    ranks = rank_queries(vectors.float().cpu(), items.float().cpu(), queries[user].to_list(),
                         queries[item_id].to_list(), catalogue, history)
    return {"rows": float(len(queries)), **ranking_metrics(ranks, ks)}
