"""The two-tower model and its sampled softmax against brute force."""

from __future__ import annotations

import math

import pytest
import torch

from ctrctl.errors import ConfigError
from ctrctl.modules import EmbeddingBagCollection, EmbeddingBagConfig
from ctrctl.modules.two_tower import SampledSoftmaxLoss, StreamingFrequency, TwoTower
from ctrctl.sparse import KeyedJaggedTensor


def make_model(uniform: int = 0, logq: bool = True, extra_item: bool = False) -> TwoTower:
    torch.manual_seed(0)
    query = EmbeddingBagCollection([EmbeddingBagConfig("user", 20, 8, ["user"])], seed=1)
    items = [EmbeddingBagConfig("item", 30, 8, ["item"])]
    if extra_item:
        items.append(EmbeddingBagConfig("genre", 5, 8, ["genre"]))
    item = EmbeddingBagCollection(items, seed=2)
    return TwoTower(query, item, [16, 8], [16, 8], item_id="item", temperature=0.2,
                    uniform_negatives=uniform, logq=logq)


def batch(users: list[int], items: list[int]) -> KeyedJaggedTensor:
    n = len(users)
    return KeyedJaggedTensor(["item", "user"], torch.tensor(items + users),
                             lengths=torch.ones(2 * n, dtype=torch.long))


def brute_force_loss(u: torch.Tensor, v: torch.Tensor, ids: list[int], q: torch.Tensor,
                     tau: float) -> float:
    """Mean over queries of -log softmax of the positive, candidates = the batch's items
    with another id, every score lowered by log Q of its item."""
    total = 0.0
    def score(j: int, k: int) -> float:
        return float(u[j] @ v[k]) / tau - math.log(float(q[k]))

    for j in range(len(ids)):
        denominator = math.exp(score(j, j)) + sum(
            math.exp(score(j, k)) for k in range(len(ids)) if ids[k] != ids[j])
        total += -(score(j, j) - math.log(denominator))
    return total / len(ids)


def test_loss_equals_a_brute_force_softmax_with_logq() -> None:
    model = make_model()
    users, items = [1, 2, 3, 4, 5], [7, 9, 7, 11, 3]  # item 7 twice: an accidental hit
    model.popularity.alpha = 0.5  # a short memory: the two batches move the estimate
    model.popularity.update(torch.tensor([7, 9, 7]))  # an earlier batch: 7 and 9 are popular
    model.train()
    logits = model(torch.empty(5, 0), batch(users, items))
    assert logits.shape == (5, 6)
    loss = SampledSoftmaxLoss()(logits, torch.ones(5))
    with torch.no_grad():
        u = model.query_embeddings(batch(users, items))
        v = model.item_embeddings(batch(users, items))
        q = model.popularity.probability(torch.tensor(items))  # after this batch's update
    expected = brute_force_loss(u, v, items, q, 0.2)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert torch.allclose(u.norm(dim=1), torch.ones(5), atol=1e-5)
    assert not math.isclose(float(loss), brute_force_loss(u, v, items, torch.ones(5), 0.2),
                            rel_tol=1e-3), "the logQ correction changes the loss"


def test_without_logq_the_loss_is_the_plain_in_batch_softmax() -> None:
    model = make_model(logq=False)
    model.train()
    users, items = [1, 2, 3], [4, 5, 6]
    loss = SampledSoftmaxLoss()(model(torch.empty(3, 0), batch(users, items)))
    with torch.no_grad():
        u = model.query_embeddings(batch(users, items))
        v = model.item_embeddings(batch(users, items))
    expected = torch.nn.functional.cross_entropy(u @ v.T / 0.2, torch.arange(3))
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)


def test_streaming_frequency_tracks_how_often_an_id_appears() -> None:
    freq = StreamingFrequency(10, alpha=0.2)
    for step in range(200):
        ids = [1] if step % 4 else [1, 2]  # id 1 every batch, id 2 every 4th
        freq.update(torch.tensor(ids))
    p = freq.probability(torch.tensor([1, 2, 3]))
    assert p[0] == pytest.approx(1.0, rel=0.02)
    assert p[1] == pytest.approx(0.25, rel=0.05)
    assert p[2] == pytest.approx(0.1)  # never seen: the uniform prior 1 / num_ids


def test_uniform_negatives_join_the_candidates_and_train() -> None:
    model = make_model(uniform=4)
    model.train()
    logits = model(torch.empty(3, 0), batch([1, 2, 3], [4, 5, 6]))
    assert logits.shape == (3, 1 + 3 + 4)
    SampledSoftmaxLoss()(logits).backward()
    assert model.query_tower.mlp.parameters().__next__().grad is not None
    with pytest.raises(ConfigError, match="item id alone"):
        make_model(uniform=4, extra_item=True)


def test_eval_scores_the_pairs() -> None:
    model = make_model().eval()
    kjt = batch([1, 2], [4, 5])
    with torch.no_grad():
        scores = model(torch.empty(2, 0), kjt)
        u, v = model.query_embeddings(kjt), model.item_embeddings(kjt)
    torch.testing.assert_close(scores, (u * v).sum(1) / 0.2)
