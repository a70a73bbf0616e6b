"""KeyedJaggedTensor / JaggedTensor / KeyedTensor: layout, transforms, validation."""

from __future__ import annotations

import random

import pytest
import torch

from ctrctl.errors import SparseInputError
from ctrctl.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor, ops
from ctrctl.sparse.validation import validate_keyed_jagged

# The batch drawn in the module docstring of ctrctl/sparse/jagged_tensor.py.
KEYS = ["f1", "f2"]
VALUES = [7, 2, 5, 1, 4, 4, 9, 3]
LENGTHS = [2, 0, 1, 1, 3, 1]


def docstring_kjt(weighted: bool = False) -> KeyedJaggedTensor:
    weights = torch.arange(len(VALUES), dtype=torch.float32) / 10 if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(
        KEYS, torch.tensor(VALUES), torch.tensor(LENGTHS), weights=weights
    )


def random_bags(num_keys: int, batch: int, seed: int) -> dict[str, list[list[int]]]:
    """Pure-python batch: key -> list of bags (lists of ids), empty bags included."""
    rng = random.Random(seed)
    return {
        f"k{k}": [[rng.randrange(100) for _ in range(rng.randrange(4))] for _ in range(batch)]
        for k in range(num_keys)
    }


def kjt_from_bags(bags: dict[str, list[list[int]]], weighted: bool = False) -> KeyedJaggedTensor:
    keys = list(bags)
    values = [v for k in keys for bag in bags[k] for v in bag]
    lengths = [len(bag) for k in keys for bag in bags[k]]
    weights = torch.tensor([v / 7 for v in values], dtype=torch.float32) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(
        keys, torch.tensor(values, dtype=torch.long), torch.tensor(lengths), weights=weights
    )


def bags_of(kjt: KeyedJaggedTensor) -> dict[str, list[list[int]]]:
    return {k: [b.tolist() for b in jt.to_dense()] for k, jt in kjt.to_dict().items()}


def test_layout_matches_the_docstring_picture() -> None:
    kjt = docstring_kjt()
    assert kjt.keys() == KEYS
    assert kjt.stride() == 3
    assert kjt.offsets().tolist() == [0, 2, 2, 3, 4, 7, 8]
    assert kjt.length_per_key() == [3, 5]
    assert kjt.offset_per_key() == [0, 3, 8]
    assert [b.tolist() for b in kjt["f1"].to_dense()] == [[7, 2], [], [5]]
    assert [b.tolist() for b in kjt["f2"].to_dense()] == [[1], [4, 4, 9], [3]]


def test_from_offsets_equals_from_lengths() -> None:
    a = docstring_kjt()
    b = KeyedJaggedTensor.from_offsets_sync(KEYS, torch.tensor(VALUES), a.offsets())
    assert torch.equal(b.lengths(), a.lengths())
    assert b.length_per_key() == a.length_per_key()
    assert b.stride() == 3


def test_lazy_construction_computes_per_key_counts_on_demand() -> None:
    kjt = KeyedJaggedTensor(KEYS, torch.tensor(VALUES), lengths=torch.tensor(LENGTHS))
    assert kjt.offsets_or_none() is None
    assert kjt.length_per_key() == [3, 5]


def test_weights_ride_with_values() -> None:
    kjt = docstring_kjt(weighted=True)
    jt = kjt["f2"]
    torch.testing.assert_close(jt.weights(), torch.tensor([0.3, 0.4, 0.5, 0.6, 0.7]))
    assert docstring_kjt().weights_or_none() is None


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("weighted", [False, True])
def test_permute_matches_python_reference(seed: int, weighted: bool) -> None:
    bags = random_bags(num_keys=5, batch=6, seed=seed)
    kjt = kjt_from_bags(bags, weighted)
    rng = random.Random(seed)
    order = [rng.randrange(5) for _ in range(7)]  # repeats and omissions allowed
    permuted = kjt.permute(order)
    keys = list(bags)
    assert permuted.keys() == [keys[i] for i in order]
    expected_values = [v for i in order for bag in bags[keys[i]] for v in bag]
    assert permuted.values().tolist() == expected_values
    assert permuted.lengths().tolist() == [len(b) for i in order for b in bags[keys[i]]]
    assert permuted.length_per_key() == [sum(map(len, bags[keys[i]])) for i in order]
    if weighted:
        torch.testing.assert_close(
            permuted.weights(), torch.tensor([v / 7 for v in expected_values], dtype=torch.float32)
        )


@pytest.mark.parametrize("seed", range(3))
def test_plain_torch_permute_equals_fbgemm(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    if not ops.use_fbgemm_ops():
        pytest.skip("fbgemm_gpu is not installed")
    kjt = kjt_from_bags(random_bags(num_keys=4, batch=5, seed=seed), weighted=True)
    order = [3, 1, 1, 0]
    with_fbgemm = kjt.permute(order)
    monkeypatch.setattr(ops, "use_fbgemm_ops", lambda: False)
    plain = kjt.permute(order)
    assert torch.equal(plain.values(), with_fbgemm.values())
    assert torch.equal(plain.lengths(), with_fbgemm.lengths())
    assert torch.equal(plain.weights(), with_fbgemm.weights())
    assert torch.equal(ops.complete_cumsum(kjt.lengths()), kjt.offsets())


def test_split_and_concat_round_trip() -> None:
    bags = random_bags(num_keys=5, batch=4, seed=11)
    kjt = kjt_from_bags(bags, weighted=True)
    parts = kjt.split([2, 0, 3])
    assert [p.keys() for p in parts] == [["k0", "k1"], [], ["k2", "k3", "k4"]]
    assert bags_of(parts[0]) == {k: bags[k] for k in ["k0", "k1"]}
    assert bags_of(parts[2]) == {k: bags[k] for k in ["k2", "k3", "k4"]}
    assert all(p.stride() == 4 for p in parts)
    joined = KeyedJaggedTensor.concat([parts[2], parts[0]])
    assert joined.keys() == ["k2", "k3", "k4", "k0", "k1"]
    assert bags_of(joined) == {k: bags[k] for k in joined.keys()}
    assert torch.equal(joined.weights(), kjt.permute([2, 3, 4, 0, 1]).weights())
    with pytest.raises(SparseInputError, match="add up to 4 keys, not 5"):
        kjt.split([1, 3])


def test_concat_refuses_different_batch_sizes() -> None:
    a = kjt_from_bags(random_bags(2, 3, seed=1))
    b = kjt_from_bags(random_bags(2, 4, seed=2))
    with pytest.raises(SparseInputError, match="different batch sizes"):
        KeyedJaggedTensor.concat([a, b])


def test_to_dict_and_from_jt_dict() -> None:
    kjt = docstring_kjt(weighted=True)
    rebuilt = KeyedJaggedTensor.from_jt_dict(kjt.to_dict())
    assert torch.equal(rebuilt.values(), kjt.values())
    assert torch.equal(rebuilt.lengths(), kjt.lengths())
    assert torch.equal(rebuilt.weights(), kjt.weights())


def test_to_keeps_caches_and_data() -> None:
    kjt = docstring_kjt(weighted=True)
    moved = kjt.to("cpu")
    assert moved.length_per_key() == kjt.length_per_key()
    assert torch.equal(moved.values(), kjt.values())


def test_pin_memory() -> None:
    try:
        torch.zeros(1).pin_memory()
    except RuntimeError as exc:
        pytest.skip(f"pinned memory is not available here: {exc}")
    pinned = docstring_kjt(weighted=True).pin_memory()
    assert pinned.values().is_pinned() and pinned.lengths().is_pinned()
    assert pinned.values().tolist() == VALUES


def test_variable_batch_per_key_layout_and_permute() -> None:
    # k0 has 2 bags (1 from rank 0, 1 from rank 1), k1 has 3 bags.
    kjt = KeyedJaggedTensor(
        ["k0", "k1"],
        torch.tensor([1, 2, 3, 4, 5, 6]),
        lengths=torch.tensor([1, 2, 0, 2, 1]),
        stride_per_key_per_rank=[[1, 1], [2, 1]],
    )
    assert kjt.variable_stride_per_key()
    assert kjt.stride_per_key() == [2, 3]
    assert kjt.stride() == 3
    assert kjt.length_per_key() == [3, 3]
    assert [b.tolist() for b in kjt["k1"].to_dense()] == [[], [4, 5], [6]]
    swapped = kjt.permute([1, 0])
    assert swapped.values().tolist() == [4, 5, 6, 1, 2, 3]
    assert swapped.lengths().tolist() == [0, 2, 1, 1, 2]
    assert swapped.stride_per_key_per_rank() == [[2, 1], [1, 1]]
    first, second = kjt.split([1, 1])
    assert second.values().tolist() == [4, 5, 6]
    assert second.stride_per_key() == [3]


def test_keyed_tensor_to_dict_and_regroup() -> None:
    values = torch.arange(24, dtype=torch.float32).view(2, 12)
    kt = KeyedTensor(["a", "b"], [4, 8], values)
    parts = kt.to_dict()
    assert torch.equal(parts["a"], values[:, :4])
    assert torch.equal(kt["b"], values[:, 4:])
    other = KeyedTensor.from_tensor_list(["c"], [torch.ones(2, 3)])
    grouped = KeyedTensor.regroup([kt, other], [["c", "a"], ["b"]])
    assert torch.equal(grouped[0], torch.cat([torch.ones(2, 3), values[:, :4]], dim=1))
    assert torch.equal(grouped[1], values[:, 4:])
    with pytest.raises(SparseInputError, match="do not have 13 entries"):
        KeyedTensor(["a", "b"], [4, 9], values)


def test_jagged_tensor_padded_dense() -> None:
    jt = JaggedTensor(values=torch.tensor([1, 4, 4, 9]), lengths=torch.tensor([1, 0, 3]))
    assert jt.offsets().tolist() == [0, 1, 1, 4]
    assert jt.to_padded_dense(2).tolist() == [[1, 0], [0, 0], [4, 4]]


# ---- validation: each kind of error names the key and the position -----------------------


def test_construction_rejects_a_batch_that_does_not_split_into_keys() -> None:
    with pytest.raises(SparseInputError, match="5 bags do not split into 2 keys"):
        KeyedJaggedTensor(KEYS, torch.tensor(VALUES), lengths=torch.tensor([2, 0, 1, 1, 4]))


def test_lengths_that_do_not_sum_to_values() -> None:
    with pytest.raises(SparseInputError, match="lengths add up to 9 values but values has 8"):
        KeyedJaggedTensor.from_lengths_sync(
            KEYS, torch.tensor(VALUES), torch.tensor([2, 0, 1, 1, 4, 1])
        )
    lazy = KeyedJaggedTensor(KEYS, torch.tensor(VALUES), lengths=torch.tensor([2, 0, 1, 1, 2, 1]))
    with pytest.raises(SparseInputError, match="add up to 7 values"):
        validate_keyed_jagged(lazy)


def test_negative_length_names_key_and_sample() -> None:
    kjt = KeyedJaggedTensor(KEYS, torch.tensor(VALUES), lengths=torch.tensor([2, 0, 1, 1, 5, -1]))
    with pytest.raises(SparseInputError, match=r"key 'f2', sample 2: negative length -1"):
        validate_keyed_jagged(kjt)


def test_non_monotone_offsets_name_key_and_sample() -> None:
    kjt = KeyedJaggedTensor(KEYS, torch.tensor(VALUES), offsets=torch.tensor([0, 2, 2, 3, 4, 2, 8]))
    with pytest.raises(SparseInputError, match=r"key 'f2', sample 1: offsets decrease from 4 to 2"):
        validate_keyed_jagged(kjt)
    shifted = KeyedJaggedTensor(
        KEYS, torch.tensor(VALUES), offsets=torch.tensor([1, 2, 2, 3, 4, 7, 8])
    )
    with pytest.raises(SparseInputError, match="offsets start at 1"):
        validate_keyed_jagged(shifted)


def test_id_out_of_range_names_key_sample_and_value() -> None:
    kjt = docstring_kjt()
    validate_keyed_jagged(kjt, {"f1": 8, "f2": 10})
    with pytest.raises(
        SparseInputError, match=r"key 'f2', sample 1, value 6: id 9 is outside \[0, 9\)"
    ):
        validate_keyed_jagged(kjt, {"f1": 8, "f2": 9})
    with pytest.raises(
        SparseInputError, match=r"key 'f1', sample 0, value 0: id 7 is outside \[0, 7\)"
    ):
        validate_keyed_jagged(kjt, {"f1": 7})


def test_negative_id_names_key_sample_and_value() -> None:
    values = torch.tensor([7, 2, 5, 1, 4, -4, 9, 3])
    kjt = KeyedJaggedTensor.from_lengths_sync(KEYS, values, torch.tensor(LENGTHS))
    with pytest.raises(SparseInputError, match=r"key 'f2', sample 1, value 5: id -4 is outside"):
        validate_keyed_jagged(kjt)


def test_shape_and_dtype_errors() -> None:
    with pytest.raises(SparseInputError, match="lengths must be int32 or int64"):
        KeyedJaggedTensor(KEYS, torch.tensor(VALUES), lengths=torch.tensor([2.0, 0, 1, 1, 3, 1]))
    with pytest.raises(SparseInputError, match="weights .* differ in shape"):
        KeyedJaggedTensor(
            KEYS, torch.tensor(VALUES), weights=torch.ones(3), lengths=torch.tensor(LENGTHS)
        )
    with pytest.raises(SparseInputError, match="no key 'zz'"):
        docstring_kjt()["zz"]
    with pytest.raises(SparseInputError, match="permute index 5"):
        docstring_kjt().permute([5])
