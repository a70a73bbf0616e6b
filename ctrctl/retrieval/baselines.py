"""Baselines beside a two-tower model in the same evaluation: popularity and BPR.

* popularity: every user gets the items ranked by their count of train interactions.
* BPR (Rendle et al. 2009): matrix factorisation (user and item vectors, an item bias)
  trained on the train interactions by Bayesian personalised ranking: for a user's item i
  and an item j drawn uniformly, maximise log sigmoid(s(u, i) - s(u, j)).

Both score the whole catalogue for each query user; the evaluation ranks as for the model.

Example:
    >>> pop = popularity_scores(train_items, catalogue_ids)          # (N,)
    >>> bpr = train_bpr(train_users, train_items, users=944, items=1683)
    >>> scores = bpr.scores(torch.tensor([1, 2]), catalogue_ids)     # (2, N)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["BPRConfig", "BPRModel", "popularity_scores", "train_bpr"]


def popularity_scores(train_items: torch.Tensor, catalogue: torch.Tensor) -> torch.Tensor:
    """(N,) the train interactions of each catalogue item (ties: a lower id first)."""
    counts = torch.bincount(train_items, minlength=int(catalogue.max()) + 1).double()
    # a tiny decreasing term breaks ties deterministically, never reorders counts
    return counts[catalogue] - catalogue.double() / (10.0 * (int(catalogue.max()) + 1))


@dataclass(frozen=True)
class BPRConfig:
    """BPR's settings (the defaults suit MovieLens-100k: about 50k positives).

    Attributes:
        dim: width of the user and item vectors.
        epochs: passes over the train interactions.
        batch_size: interactions per step.
        lr: Adam's learning rate.
        weight_decay: L2 on the vectors a step touches.
        seed: initialisation and sampling.
    """

    dim: int = 64
    epochs: int = 40
    batch_size: int = 1024
    lr: float = 0.005
    weight_decay: float = 1e-4
    seed: int = 0


@dataclass
class BPRModel:
    """Trained BPR factors; ``scores`` ranks items for users."""

    users: torch.Tensor   # (U, dim)
    items: torch.Tensor   # (I, dim)
    bias: torch.Tensor    # (I,)

    def scores(self, users: torch.Tensor, catalogue: torch.Tensor) -> torch.Tensor:
        """(len(users), N) scores of the catalogue items for each user."""
        return self.users[users] @ self.items[catalogue].T + self.bias[catalogue]


def train_bpr(users: torch.Tensor, items: torch.Tensor, num_users: int, num_items: int,
              candidates: torch.Tensor, config: BPRConfig = BPRConfig()) -> BPRModel:
    """Fit BPR on (user, item) interactions; negatives are drawn uniformly from
    ``candidates`` (the catalogue)."""
    generator = torch.Generator().manual_seed(config.seed)
    user_f = torch.nn.Parameter(torch.randn(num_users, config.dim, generator=generator) * 0.01)
    item_f = torch.nn.Parameter(torch.randn(num_items, config.dim, generator=generator) * 0.01)
    bias = torch.nn.Parameter(torch.zeros(num_items))
    optimizer = torch.optim.Adam([user_f, item_f, bias], lr=config.lr)
    rows = len(users)
    for _ in range(config.epochs):
        order = torch.randperm(rows, generator=generator)
        for start in range(0, rows, config.batch_size):
            pick = order[start:start + config.batch_size]
            u, i = users[pick], items[pick]
            j = candidates[torch.randint(len(candidates), (len(pick),), generator=generator)]
            pu, qi, qj = user_f[u], item_f[i], item_f[j]
            diff = (pu * (qi - qj)).sum(1) + bias[i] - bias[j]
            loss = -F.logsigmoid(diff).mean() + config.weight_decay * (
                pu.square().sum() + qi.square().sum() + qj.square().sum()) / len(pick)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return BPRModel(user_f.detach(), item_f.detach(), bias.detach())
