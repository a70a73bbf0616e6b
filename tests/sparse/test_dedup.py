"""Deduplicated bags (ctrctl.sparse.dedup) against a pure-Python reference."""

from __future__ import annotations

import random

import pytest
import torch

from ctrctl.errors import SparseInputError
from ctrctl.sparse import KeyedJaggedTensor
from ctrctl.sparse.dedup import deduplicate, distinct_share, expand, restore, unique_bags


def _batch(keys: list[str], batch: int, seed: int, weighted: bool
           ) -> tuple[KeyedJaggedTensor, dict[str, list[tuple[tuple[int, float], ...]]]]:
    """A batch with repeats (few distinct ids, bags of 0-3 ids) and its bags in Python."""
    rng = random.Random(seed)
    bags: dict[str, list[tuple[tuple[int, float], ...]]] = {}
    lengths, values, weights = [], [], []
    for _ in keys:
        pool = [tuple((rng.randrange(5), rng.choice([0.5, 1.0]) if weighted else 1.0)
                      for _ in range(rng.randrange(4))) for _ in range(4)]
        per_key = [rng.choice(pool) for _ in range(batch)]
        bags[_] = per_key
        for bag in per_key:
            lengths.append(len(bag))
            values.extend(i for i, _ in bag)
            weights.extend(w for _, w in bag)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys, torch.tensor(values, dtype=torch.long), torch.tensor(lengths, dtype=torch.int32),
        weights=torch.tensor(weights) if weighted else None)
    return kjt, bags


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_distinct_bags_match_python(weighted: bool, seed: int) -> None:
    keys = ["user", "item", "ctx"]
    kjt, bags = _batch(keys, 17, seed, weighted)
    d = deduplicate(kjt)
    names, inverse = d.inverse_indices()
    assert names == keys and tuple(inverse.shape) == (3, 17)
    for k, key in enumerate(keys):
        expected = bags[key]
        assert d.stride_per_key()[k] == len(set(expected))
        jt = d[key]
        got = []
        ids = jt.to_dense()
        wts = jt.to_dense_weights() if weighted else None
        for u in range(len(ids)):
            got.append(tuple(zip(ids[u].tolist(),
                                 wts[u].tolist() if wts is not None else [1.0] * len(ids[u]),
                                 strict=True)))
        assert len(set(got)) == len(got), "a bag kept twice"
        for b, bag in enumerate(expected):
            assert got[int(inverse[k, b])] == bag
    total = sum(len(set(bags[k])) for k in keys)
    assert distinct_share(d) == pytest.approx(total / (3 * 17))


@pytest.mark.parametrize("weighted", [False, True])
def test_restore_gives_the_batch_back(weighted: bool) -> None:
    kjt, _ = _batch(["a", "b"], 11, 3, weighted)
    back = restore(deduplicate(kjt))
    assert back.stride() == 11 and not back.variable_stride_per_key()
    assert torch.equal(back.lengths(), kjt.lengths())
    assert torch.equal(back.values(), kjt.values())
    if weighted:
        assert torch.equal(back.weights(), kjt.weights())


def test_one_id_per_bag_and_expand() -> None:
    # the module docstring's picture
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["user", "item"], torch.tensor([7, 7, 9, 7, 3, 4, 5, 6]), torch.ones(8, dtype=torch.long))
    d = deduplicate(kjt)
    assert d.stride_per_key() == [2, 4]
    assert d.values().tolist() == [7, 9, 3, 4, 5, 6]
    assert d.inverse_indices()[1].tolist() == [[0, 0, 1, 0], [0, 1, 2, 3]]
    assert distinct_share(d) == 0.75
    pooled = torch.tensor([[1.0], [2.0]], requires_grad=True)
    out = expand(pooled, d.inverse_indices()[1][0])
    assert out.squeeze(1).tolist() == [1.0, 1.0, 2.0, 1.0]
    out.sum().backward()
    assert pooled.grad is not None and pooled.grad.squeeze(1).tolist() == [3.0, 1.0]


def test_empty_bags_and_twice() -> None:
    kjt = KeyedJaggedTensor.from_lengths_sync(["a"], torch.zeros(0, dtype=torch.long),
                                              torch.zeros(5, dtype=torch.long))
    d = deduplicate(kjt)
    assert d.stride_per_key() == [1] and d.inverse_indices()[1].tolist() == [[0] * 5]
    with pytest.raises(SparseInputError, match="already has a variable batch"):
        deduplicate(d)


@pytest.mark.parametrize("keep_above", [1.0, 0.5])
def test_one_id_per_bag_path_matches_the_general_one(keep_above: float) -> None:
    gen = torch.Generator().manual_seed(0)
    batch = 40
    # key a: 4 distinct ids (share 0.1), key b: all distinct, key c: 30 of 40 ids
    ids = torch.cat([torch.randint(0, 4, (batch,), generator=gen),
                     torch.randperm(1000, generator=gen)[:batch],
                     torch.randperm(30, generator=gen).repeat(2)[:batch] + 500])
    kjt = KeyedJaggedTensor.from_lengths_sync(["a", "b", "c"], ids, torch.ones(3 * batch,
                                                                              dtype=torch.long))
    fast = deduplicate(kjt, keep_above=keep_above)
    for k, key in enumerate(["a", "b", "c"]):
        lengths = torch.ones(batch, dtype=torch.long)
        two = torch.full((batch,), 2, dtype=torch.long)    # force the general path's rows
        _, u_val, _, inv = unique_bags(lengths, ids[k * batch:(k + 1) * batch])
        _, _, _, inv2 = unique_bags(two, ids[k * batch:(k + 1) * batch].repeat_interleave(2))
        assert torch.equal(inv, inv2)
        kept = u_val.numel() >= keep_above * batch
        got = fast[key].values()
        if kept:
            assert torch.equal(got, ids[k * batch:(k + 1) * batch])
            assert torch.equal(fast.inverse_indices()[1][k], torch.arange(batch))
        else:
            assert torch.equal(got, u_val)
            assert torch.equal(fast.inverse_indices()[1][k], inv)
    assert fast.stride_per_key()[1] == batch                       # never deduplicated
    assert fast.stride_per_key()[0] == 4                           # always
    assert fast.stride_per_key()[2] == (40 if keep_above == 0.5 else 30)
    assert torch.equal(restore(fast).values(), ids)
