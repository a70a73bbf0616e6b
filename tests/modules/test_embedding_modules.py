"""EmbeddingBagCollection: KJT in, KeyedTensor out; FBGEMM against plain torch; state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ctrctl.errors import CheckpointError, ConfigError, SparseInputError
from ctrctl.modules import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingOptimizerConfig
from ctrctl.modules.optimizers import CPU_OPTIMIZERS
from ctrctl.sparse import KeyedJaggedTensor
from ctrctl.sparse.ops import use_fbgemm_ops

needs_fbgemm = pytest.mark.skipif(not use_fbgemm_ops(), reason="fbgemm_gpu is not installed")

# Two sum tables of different dims (one kernel), one mean table (a second kernel) between
# them in config order, and a table that serves two features.
CONFIGS = [
    EmbeddingBagConfig("t_a", 30, 8, ["a"]),
    EmbeddingBagConfig("t_m", 12, 4, ["m"], pooling="mean"),
    EmbeddingBagConfig("t_b", 20, 4, ["b1", "b2"]),
]
ROWS = {"a": 30, "m": 12, "b1": 20, "b2": 20, "zz": 1000}
TABLE_OF = {"a": "t_a", "m": "t_m", "b1": "t_b", "b2": "t_b"}
BATCH = 4


def make_kjt(seed: int, keys: list[str], weighted: bool) -> KeyedJaggedTensor:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(keys), BATCH), generator=gen)
    lengths[0, 0] = 0  # an empty bag
    values = torch.cat(
        [
            torch.randint(0, min(ROWS[k], 5), (int(n),), generator=gen)
            for k, n in zip(keys, lengths.sum(1), strict=True)
        ]
    )  # few distinct rows: repeats in bags and across the batch
    weights = torch.rand(values.numel(), generator=gen) + 0.5 if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys, values, lengths.reshape(-1), weights)


def reference_pool(weights: dict[str, torch.Tensor], kjt: KeyedJaggedTensor) -> torch.Tensor:
    """Independent oracle: one F.embedding_bag per feature, in config order."""
    blocks = []
    for cfg in CONFIGS:
        for feature in cfg.feature_names:
            jt = kjt[feature]
            blocks.append(
                F.embedding_bag(
                    jt.values(),
                    weights[cfg.name],
                    jt.offsets(),
                    mode=cfg.pooling,
                    per_sample_weights=jt.weights_or_none() if cfg.pooling == "sum" else None,
                    include_last_offset=True,
                )
            )
    return torch.cat(blocks, dim=1)


def test_output_layout_and_order() -> None:
    ebc = EmbeddingBagCollection(CONFIGS, backend="torch")
    # Keys in another order, plus a key no table reads.
    kjt = make_kjt(0, ["b2", "zz", "m", "a", "b1"], weighted=False)
    kt = ebc(kjt)
    assert kt.keys() == ["a", "m", "b1", "b2"]
    assert kt.length_per_key() == [8, 4, 4, 4]
    assert kt.values().shape == (BATCH, 20)
    weights = {k: v.clone() for k, v in ebc.embedding_bag_weights().items()}
    torch.testing.assert_close(kt.values(), reference_pool(weights, kjt))
    assert len(ebc.bags) == 2  # sum tables share one kernel, the mean table has its own


@needs_fbgemm
@pytest.mark.parametrize("kind", CPU_OPTIMIZERS)
@pytest.mark.parametrize("weighted", [False, True])
def test_fbgemm_collection_equals_plain_torch(kind: str, weighted: bool) -> None:
    """Forward, the gradient reaching a dense layer on top, and three fused steps."""
    results = {}
    for backend in ("fbgemm", "torch"):
        optimizer = EmbeddingOptimizerConfig(kind=kind, lr=0.1, eps=1e-3)
        ebc = EmbeddingBagCollection(CONFIGS, optimizer=optimizer, backend=backend, seed=3)
        assert ebc.backends() == [backend, backend]
        dense = torch.nn.Linear(20, 1)
        with torch.no_grad():
            dense.weight.copy_(torch.linspace(-1, 1, 20))
            dense.bias.zero_()
        trace = []
        for step in range(3):
            kjt = make_kjt(step, ["a", "m", "b1", "b2"], weighted)
            pooled = ebc(kjt).values()
            loss = torch.sigmoid(dense(pooled)).sum()
            dense.zero_grad()
            loss.backward()
            trace.append(pooled.detach().clone())
            trace.append(dense.weight.grad.clone())
            trace += [w.detach().clone() for w in ebc.embedding_bag_weights().values()]
            trace += [s.clone() for st in ebc.optimizer_state().values() for s in st.values()]
        results[backend] = trace
    for a, b in zip(results["fbgemm"], results["torch"], strict=True):
        torch.testing.assert_close(a, b)


def test_weights_and_optimizer_state_by_table_name() -> None:
    ebc = EmbeddingBagCollection(CONFIGS, backend="torch", seed=1)
    weights = ebc.embedding_bag_weights()
    assert {k: tuple(v.shape) for k, v in weights.items()} == {
        "t_a": (30, 8),
        "t_m": (12, 4),
        "t_b": (20, 4),
    }
    bound = (1 / 30) ** 0.5
    assert float(weights["t_a"].abs().max()) <= bound
    states = ebc.optimizer_state()
    assert states["t_b"]["momentum1"].shape == (20,)
    ebc(make_kjt(0, ["a", "m", "b1", "b2"], False)).values().sum().backward()
    other = EmbeddingBagCollection(CONFIGS, backend="torch", seed=2)
    other.load_embedding_bag_weights({k: v.clone() for k, v in ebc.embedding_bag_weights().items()})
    other.load_optimizer_state(
        {k: {n: t.clone() for n, t in s.items()} for k, s in ebc.optimizer_state().items()}
    )
    for name, w in ebc.embedding_bag_weights().items():
        torch.testing.assert_close(other.embedding_bag_weights()[name], w)
    torch.testing.assert_close(
        other.optimizer_state()["t_a"]["momentum1"], ebc.optimizer_state()["t_a"]["momentum1"]
    )
    with pytest.raises(CheckpointError, match=r"tables \['t_m'\] are missing"):
        other.load_embedding_bag_weights({"t_a": torch.zeros(30, 8), "t_b": torch.zeros(20, 4)})


@pytest.mark.parametrize("backend", ["torch", pytest.param("fbgemm", marks=needs_fbgemm)])
def test_state_dict_has_one_weight_per_table(backend: str) -> None:
    # One pooling only, so FBGEMM can take every table.
    configs = [EmbeddingBagConfig("t_x", 10, 4, ["x"]), EmbeddingBagConfig("t_y", 6, 8, ["y"])]
    ebc = EmbeddingBagCollection(configs, backend=backend, seed=0)
    state = ebc.state_dict()
    assert sorted(state) == ["embedding_bags.t_x.weight", "embedding_bags.t_y.weight"]
    fresh = EmbeddingBagCollection(configs, backend=backend, seed=5)
    fresh.load_state_dict({k: v.clone() for k, v in state.items()})
    for name, w in ebc.embedding_bag_weights().items():
        torch.testing.assert_close(fresh.embedding_bag_weights()[name], w)
    with pytest.raises(RuntimeError, match="embedding_bags.t_y.weight"):
        fresh.load_state_dict({"embedding_bags.t_x.weight": torch.zeros(10, 4)})


def test_missing_feature_and_duplicate_names() -> None:
    ebc = EmbeddingBagCollection(CONFIGS, backend="torch")
    with pytest.raises(SparseInputError, match=r"features \['b2'\] are missing"):
        ebc(make_kjt(0, ["a", "m", "b1"], weighted=False))
    with pytest.raises(ConfigError, match="served by more than one table"):
        EmbeddingBagCollection(
            [EmbeddingBagConfig("t1", 5, 4, ["f"]), EmbeddingBagConfig("t2", 5, 4, ["f"])]
        )


def test_learning_rate_reaches_every_kernel() -> None:
    ebc = EmbeddingBagCollection(CONFIGS, backend="torch")
    ebc.set_learning_rate(0.5)
    assert [bag.learning_rate for bag in ebc.bags] == [0.5, 0.5]
