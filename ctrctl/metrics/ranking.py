"""Full-ranking metrics of retrieval: recall@K and NDCG@K with one held-out item per query.

Every query has one target item; its rank is the number of catalogue items scored above
it, the items the query's user has already interacted with excluded (``-inf``). Recall@K
is the share of queries whose target ranks below K; NDCG@K with one relevant item is
``1 / log2(rank + 2)`` when the rank is below K, else 0, averaged.

Example:
    >>> ranks = target_ranks(scores, targets)        # scores (Q, N), targets (Q,) columns
    >>> ranking_metrics(ranks, (10, 100))             # {"recall@10": ..., "ndcg@10": ...}
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["RANKING_KS", "ranking_metrics", "target_ranks"]

#: The cut-offs reported by default.
RANKING_KS = (10, 50, 100)


def target_ranks(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(Q,) the 0-based rank of each query's target column among its row's scores.

    Args:
        scores: (Q, N); excluded items hold ``-inf``.
        targets: (Q,) the target's column in ``scores``.

    Ties count against the target (an item scored equal to it ranks above it), so a
    constant scorer earns nothing.
    """
    target = scores.gather(1, targets[:, None])                    # (Q, 1)
    above = (scores >= target).sum(dim=1) - 1                      # the target itself
    return above


def ranking_metrics(ranks: torch.Tensor, ks: Sequence[int] = RANKING_KS,
                    prefix: str = "") -> dict[str, float]:
    """``{prefix}recall@K`` and ``{prefix}ndcg@K`` for each K, from :func:`target_ranks`."""
    if len(ranks) == 0:
        return {}
    out: dict[str, float] = {}
    ranks = ranks.double()
    for k in ks:
        hit = ranks < k
        out[f"{prefix}recall@{k}"] = float(hit.double().mean())
        out[f"{prefix}ndcg@{k}"] = float((hit / torch.log2(ranks + 2)).mean())
    return out
