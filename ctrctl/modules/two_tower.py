"""Two-tower retrieval: a query tower and an item tower on embedding bag collections,
trained with a sampled softmax over in-batch negatives and a logQ correction.

    query features (KJT) --EBC--> (B, Fq * D) --MLP--> (B, E) --L2--> u
    item features  (KJT) --EBC--> (B, Fi * D) --MLP--> (B, E) --L2--> v
    score(q, i) = <u_q, v_i> / temperature                           (cosine / tau)

Training (Yi et al., RecSys 2019, "Sampling-bias-corrected neural modeling"): the items of
the batch (gathered over every rank, so the candidates are the global batch) are each
query's candidates; each candidate's score is lowered by ``log Q(i)``, the log of its
probability to be in a batch, estimated on the stream of batches
(:class:`StreamingFrequency`). A candidate with the query's own item id (its positive, or
an accidental hit) is masked, and the positive's score goes first, so the loss is a
cross-entropy with target 0 (:class:`SampledSoftmaxLoss`)::

    logits (B, 1 + C):   [ s(q, pos) - log Q(pos) | s(q, c) - log Q(c) for c in candidates ]
                           target 0                   -inf where id(c) == id(pos)

Optionally ``uniform_negatives`` item ids drawn uniformly from the table join the
candidates (mixed negative sampling, Yang et al. 2020); their Q mixes both proposals.

Example:
    >>> model = TwoTower(query_ebc, item_ebc, [64, 32], [64, 32], item_id="item")
    >>> logits = model(dense, kjt)                       # training: (B, 1 + B)
    >>> loss = SampledSoftmaxLoss()(logits, labels)
    >>> model.eval(); scores = model(dense, kjt)         # (B,) the pairs' scores
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ctrctl.errors import ConfigError
from ctrctl.modules.embedding_modules import EmbeddingBagCollection
from ctrctl.modules.mlp import MLP
from ctrctl.sparse import KeyedJaggedTensor

__all__ = ["SampledSoftmaxLoss", "StreamingFrequency", "Tower", "TwoTower"]


class StreamingFrequency(nn.Module):
    """The probability of each item id to appear in a batch, estimated on the stream.

    Per id: the step it was last seen and a moving average of the steps between two
    sightings (``interval``); ``probability = 1 / interval`` (Yi et al. 2019, algorithm 2,
    with one slot per id instead of hashed slots). Every rank sees the same (gathered) ids,
    so the estimates agree; they are buffers and travel in checkpoints.

    Args:
        num_ids: the id range (the item table's rows).
        alpha: the moving average's weight of a new interval.
    """

    def __init__(self, num_ids: int, alpha: float = 0.01) -> None:
        super().__init__()
        self.alpha = alpha
        self.step: torch.Tensor
        self.last_seen: torch.Tensor
        self.interval: torch.Tensor
        self.register_buffer("step", torch.zeros((), dtype=torch.float64))
        self.register_buffer("last_seen", torch.zeros(num_ids, dtype=torch.float64))
        # unseen ids start at one sighting per num_ids batches: a uniform prior
        self.register_buffer("interval", torch.full((num_ids,), float(num_ids),
                                                    dtype=torch.float64))

    @torch.no_grad()
    def update(self, ids: torch.Tensor) -> None:
        """Count one batch holding ``ids`` (duplicates count once)."""
        self.step += 1
        seen = ids.unique()
        gap = self.step - self.last_seen[seen]
        self.interval[seen] = (1 - self.alpha) * self.interval[seen] + self.alpha * gap
        self.last_seen[seen] = self.step

    def probability(self, ids: torch.Tensor) -> torch.Tensor:
        """(N,) float32: the estimated probability of each id to be in a batch."""
        return (1.0 / self.interval[ids].clamp(min=1.0)).float()


class Tower(nn.Module):
    """An EBC over the tower's features, an MLP and an L2-normalised output.

    Args:
        ebc: the tower's tables (one per feature).
        layer_sizes: the MLP's widths; the last is the output's width (no ReLU after it).
    """

    def __init__(self, ebc: EmbeddingBagCollection, layer_sizes: Sequence[int]) -> None:
        super().__init__()
        self.ebc = ebc
        width = sum(t.embedding_dim for t in ebc.embedding_bag_configs())
        self.features = [f for t in ebc.embedding_bag_configs() for f in t.feature_names]
        self.mlp = MLP(width, list(layer_sizes), final_activation=False, kernel="torch")

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.ebc(features).values()              # (B, F * D)
        return F.normalize(self.mlp(pooled), dim=-1)      # (B, E), unit rows


class TwoTower(nn.Module):
    """Query and item towers; see the module docstring.

    Args:
        query_ebc, item_ebc: each tower's tables; the item tower's include ``item_id``.
        query_layers, item_layers: the towers' MLP widths (the same last width).
        item_id: the item tower's feature naming the item (one id per row).
        temperature: divides the cosine scores.
        uniform_negatives: item ids drawn uniformly per step beside the in-batch ones (the
            item tower must then hold ``item_id`` only).
        popularity_alpha: the weight of a new interval in :class:`StreamingFrequency`.
        logq: subtract log Q (False: plain in-batch softmax).
        seed: seeds the uniform draws (the same on every rank).
    """

    #: The model splits its input between two EBCs, so a train pipeline cannot run one
    #: EBC's input distribution ahead of the forward (``choose_pipeline`` reads this).
    splits_features = True

    def __init__(self, query_ebc: EmbeddingBagCollection, item_ebc: EmbeddingBagCollection,
                 query_layers: Sequence[int], item_layers: Sequence[int], item_id: str,
                 temperature: float = 0.05, uniform_negatives: int = 0,
                 popularity_alpha: float = 0.01, logq: bool = True, seed: int = 0) -> None:
        super().__init__()
        if query_layers[-1] != item_layers[-1]:
            raise ConfigError(
                f"the towers' outputs differ in width ({query_layers[-1]} vs "
                f"{item_layers[-1]})", where="model.query_tower / model.item_tower",
                hint="end both towers' layers with the same embedding width")
        if temperature <= 0:
            raise ConfigError(f"temperature must be positive, not {temperature}",
                              where="model.temperature")
        self.query_tower = Tower(query_ebc, query_layers)
        self.item_tower = Tower(item_ebc, item_layers)
        if item_id not in self.item_tower.features:
            raise ConfigError(f"the item tower has no feature {item_id!r}",
                              where="model.item_tower", hint="give it the item_id feature")
        if uniform_negatives and self.item_tower.features != [item_id]:
            raise ConfigError(
                "uniform negatives need an item tower over the item id alone (a drawn id "
                "has no other features)", where="model.uniform_negatives")
        self.item_id = item_id
        self.width = query_layers[-1]
        self.temperature = temperature
        self.uniform_negatives = uniform_negatives
        self.logq = logq
        self.seed = seed
        rows = next(t.num_embeddings for t in item_ebc.embedding_bag_configs()
                    if item_id in t.feature_names)
        self.num_items = rows
        self.popularity = StreamingFrequency(rows, popularity_alpha)

    # ---- towers ---------------------------------------------------------------------------
    def _split(self, features: KeyedJaggedTensor) -> tuple[KeyedJaggedTensor, KeyedJaggedTensor]:
        query, item = self.query_tower.features, self.item_tower.features
        parts = _select(features, query + item).split([len(query), len(item)])
        return parts[0], parts[1]

    def query_embeddings(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """(B, E) unit query vectors; ``features`` may hold other keys too."""
        return self.query_tower(_select(features, self.query_tower.features))

    def item_embeddings(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """(B, E) unit item vectors; ``features`` holds the item tower's keys."""
        return self.item_tower(_select(features, self.item_tower.features))

    def item_ids(self, items: KeyedJaggedTensor) -> torch.Tensor:
        """(B,) the item id of each row (the first value of its ``item_id`` bag)."""
        jt = items.to_dict()[self.item_id]
        offsets = jt.offsets()
        if bool((offsets[1:] == offsets[:-1]).any()):
            raise ConfigError(f"a row has no {self.item_id!r} value", where="TwoTower")
        return jt.values()[offsets[:-1]]

    def ids_features(self, ids: torch.Tensor) -> KeyedJaggedTensor:
        """The item tower's input for bare item ids (an item tower over the id alone)."""
        return KeyedJaggedTensor([self.item_id], ids, lengths=torch.ones_like(ids))

    # ---- forward ----------------------------------------------------------------------------
    def forward(self, dense: torch.Tensor, features: KeyedJaggedTensor) -> torch.Tensor:
        """Training: (B, 1 + C) corrected logits, the positive first; eval: (B,) scores."""
        del dense  # the towers read sparse features only
        query, item = self._split(features)
        u = self.query_tower(query)                           # (B, E)
        v = self.item_tower(item)                             # (B, E)
        if not self.training:
            return (u * v).sum(-1) / self.temperature         # (B,)
        ids = self.item_ids(item)                             # (B,)
        cand_v, cand_ids = _gather(v), _gather(ids)           # (C, E), (C,) the global batch
        self.popularity.update(cand_ids)
        log_q = torch.log(self.popularity.probability(cand_ids))          # (C,)
        own_q = torch.log(self.popularity.probability(ids))               # (B,)
        if self.uniform_negatives:
            drawn = self._draw(ids.device)                                 # (M,)
            cand_v = torch.cat([cand_v, self.item_tower(self.ids_features(drawn))])
            cand_ids = torch.cat([cand_ids, drawn])
            # mixed proposal: an item is in the batch (Q) or among the M uniform draws
            share = len(ids) * dist_world() / (len(ids) * dist_world() + len(drawn))
            uniform = len(drawn) / max(self.num_items - 1, 1)
            log_q = torch.log(share * self.popularity.probability(cand_ids)
                              + (1 - share) * uniform)
            own_q = torch.log(share * self.popularity.probability(ids) + (1 - share) * uniform)
        positive = (u * v).sum(-1, keepdim=True) / self.temperature       # (B, 1)
        negatives = u @ cand_v.T / self.temperature                       # (B, C)
        if self.logq:
            positive = positive - own_q[:, None]
            negatives = negatives - log_q[None, :]
        hits = ids[:, None] == cand_ids[None, :]                          # own item, or
        negatives = negatives.masked_fill(hits, float("-inf"))             # accidental hit
        return torch.cat([positive, negatives], dim=1)                    # (B, 1 + C)

    def _draw(self, device: torch.device) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + int(
            self.popularity.step.item()))
        # id 0 is the missing / out-of-vocabulary row: never a candidate
        drawn = torch.randint(1, self.num_items, (self.uniform_negatives,),
                              generator=generator)
        return drawn.to(device)

    def dense_parameters(self) -> Iterator[nn.Parameter]:
        """Everything but the fused tables: the towers' MLPs."""
        yield from self.query_tower.mlp.parameters()
        yield from self.item_tower.mlp.parameters()

    def extra_repr(self) -> str:
        return (f"item_id={self.item_id!r}, temperature={self.temperature}, "
                f"uniform_negatives={self.uniform_negatives}, logq={self.logq}")


class SampledSoftmaxLoss(nn.Module):
    """Cross-entropy of :meth:`TwoTower.forward`'s logits with the positive first.

    ``labels`` (1 for every interaction) are accepted, as the train pipelines pass them,
    and unused.
    """

    def forward(self, logits: torch.Tensor, labels: Any = None) -> torch.Tensor:
        del labels
        target = torch.zeros(len(logits), dtype=torch.long, device=logits.device)
        return F.cross_entropy(logits, target)


def dist_world() -> int:
    """The default group's size (1 without torch.distributed)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class _GatherRows(torch.autograd.Function):
    """All-gather rows over the default group; the gradient of each rank's rows sums the
    gradients every rank's loss sends them (all-reduce, then the own slice)."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        rank = dist.get_rank()
        ctx.start, ctx.stop = sum(sizes[:rank]), sum(sizes[:rank + 1])
        width = max(sizes)
        padded = rows.new_zeros((width, *rows.shape[1:]))
        padded[:len(rows)] = rows
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous())
        return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad[ctx.start:ctx.stop], None


def _gather(rows: torch.Tensor) -> torch.Tensor:
    """The rows of every rank in rank order (one process: ``rows`` itself)."""
    if dist_world() == 1:
        return rows
    size = torch.tensor([len(rows)], device=rows.device)
    sizes = [torch.zeros_like(size) for _ in range(dist_world())]
    dist.all_gather(sizes, size)
    counts = [int(s.item()) for s in sizes]
    if rows.requires_grad:
        out: torch.Tensor = _GatherRows.apply(rows, counts)
        return out
    width = max(counts)
    padded = rows.new_zeros((width, *rows.shape[1:]))
    padded[:len(rows)] = rows
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded)
    return torch.cat([p[:n] for p, n in zip(parts, counts, strict=True)])


def _select(features: KeyedJaggedTensor, keys: list[str]) -> KeyedJaggedTensor:
    """``features`` with exactly ``keys``, in that order."""
    have = features.keys()
    if have == keys:
        return features
    missing = sorted(set(keys) - set(have))
    if missing:
        raise ConfigError(f"the features lack {missing}", where="TwoTower",
                          hint="give the tower every feature it was built with")
    return features.permute([have.index(k) for k in keys])  # a subset of keys selects
