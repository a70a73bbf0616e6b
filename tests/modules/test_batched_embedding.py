"""BatchedEmbeddingBag: FBGEMM's TBE against the plain-torch kernel and a hand-written oracle."""

from __future__ import annotations

import pytest
import torch

from ctrctl.errors import CheckpointError, ConfigError
from ctrctl.modules import BatchedEmbeddingBag, EmbeddingOptimizerConfig, batched_embedding
from ctrctl.modules.optimizers import CPU_OPTIMIZERS
from ctrctl.sparse.ops import use_fbgemm_ops

needs_fbgemm = pytest.mark.skipif(not use_fbgemm_ops(), reason="fbgemm_gpu is not installed")

# Three tables of two dims; table 0 serves features 0 and 1 (one kernel, shared table).
TABLES = [(20, 8), (15, 4), (30, 8)]
FEATURE_TABLE_MAP = [0, 0, 1, 2]
BATCH = 5


@pytest.fixture
def no_native(monkeypatch: pytest.MonkeyPatch) -> None:
    """As where the native CPU kernel was not built: "auto" chooses between the others."""
    monkeypatch.setattr(batched_embedding, "native_cannot_run", lambda *a: "not built")


def make_batch(seed: int, weighted: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Ids with repeats inside bags and across the batch, and empty bags."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(FEATURE_TABLE_MAP), BATCH), generator=gen)
    lengths[0, 1] = 0  # an empty bag in every batch
    lengths[3, 3] = 3
    ids = []
    for f, t in enumerate(FEATURE_TABLE_MAP):
        rows = TABLES[t][0]
        # Draw from a few rows only, so repeats are certain.
        ids.append(torch.randint(0, min(rows, 4), (int(lengths[f].sum()),), generator=gen))
    indices = torch.cat(ids)
    if indices.numel() >= 2:
        indices[1] = indices[0]  # a repeat inside one bag when bag 0 has two ids
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    offsets[1:] = lengths.reshape(-1).cumsum(0)
    weights = torch.rand(indices.numel(), generator=gen) + 0.5 if weighted else None
    return indices, offsets, weights


def initial_weights(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, dim, generator=gen) * 0.1 for rows, dim in TABLES]


def run_steps(
    backend: str,
    kind: str,
    pooling: str,
    weighted: bool,
    steps: int,
    weight_decay_mode: str = "none",
) -> dict[str, list[torch.Tensor]]:
    """Forward, a dense head, backward (fused update), for a few batches; return everything."""
    wd = 0.1 if weight_decay_mode != "none" else 0.0
    optimizer = EmbeddingOptimizerConfig(
        kind=kind, lr=0.1, eps=1e-3, weight_decay=wd, weight_decay_mode=weight_decay_mode
    )
    bag = BatchedEmbeddingBag(
        TABLES,
        FEATURE_TABLE_MAP,
        optimizer=optimizer,
        pooling=pooling,
        backend=backend,
        weights=initial_weights(),
    )
    assert bag.backend == backend
    head = torch.nn.Linear(sum(bag.feature_dims), 1)
    with torch.no_grad():
        head.weight.copy_(torch.linspace(-1, 1, sum(bag.feature_dims)))
        head.bias.zero_()
    outputs, head_grads, weights_after, states_after = [], [], [], []
    for step in range(steps):
        indices, offsets, per_sample = make_batch(seed=step, weighted=weighted)
        out = bag(indices, offsets, per_sample)  # (B, 28)
        loss = (head(out).squeeze(1) ** 2).sum()
        head.zero_grad()
        loss.backward()
        outputs.append(out.detach().clone())
        head_grads.append(head.weight.grad.clone())
        weights_after.append(
            torch.cat([w.detach().clone().reshape(-1) for w in bag.split_weights()])
        )
        states_after.append(
            torch.cat([s.clone().reshape(-1) for st in bag.optimizer_state() for s in st.values()])
            if bag.optimizer.state_names
            else torch.zeros(0)
        )
    return {
        "out": outputs,
        "head_grad": head_grads,
        "weights": weights_after,
        "state": states_after,
    }


@needs_fbgemm
@pytest.mark.parametrize("kind", CPU_OPTIMIZERS)
@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_fbgemm_equals_plain_torch(kind: str, pooling: str, weighted: bool) -> None:
    fb = run_steps("fbgemm", kind, pooling, weighted, steps=3)
    pt = run_steps("torch", kind, pooling, weighted, steps=3)
    for name in ("out", "head_grad", "weights", "state"):
        for step, (a, b) in enumerate(zip(fb[name], pt[name], strict=True)):
            torch.testing.assert_close(a, b, msg=lambda m, n=name, s=step: f"{n} step {s}: {m}")


@pytest.mark.parametrize("mode", ["l2", "decoupled"])
def test_rowwise_adagrad_weight_decay_by_hand(mode: str, no_native: None) -> None:
    """FBGEMM's CPU kernel ignores weight decay, so "auto" takes the torch kernel; check it
    against FBGEMM's definition (codegen/genscript/optimizers.py) written out by hand."""
    lr, eps, wd = 0.5, 0.1, 0.2
    cfg = EmbeddingOptimizerConfig(
        kind="exact_rowwise_adagrad", lr=lr, eps=eps, weight_decay=wd, weight_decay_mode=mode
    )
    w0 = torch.tensor([[1.0, 2.0, 3.0, 4.0]]).repeat(3, 1)
    bag = BatchedEmbeddingBag([(3, 4)], optimizer=cfg, backend="auto", weights=[w0])
    assert bag.backend == "torch"
    if use_fbgemm_ops():
        with pytest.raises(ConfigError, match="ignore embedding weight decay"):
            BatchedEmbeddingBag([(3, 4)], optimizer=cfg, backend="fbgemm")
    bag(torch.tensor([1]), torch.tensor([0, 1])).backward(torch.ones(1, 4))
    g, w = torch.ones(4), w0[1]
    if mode == "l2":
        decayed = g + wd * w
        acc = (decayed * decayed).mean()
        m = lr / (acc.sqrt() + eps)
        expected = (1 - m * wd) * w - m * g
    else:
        acc = (g * g).mean()
        m = lr / (acc.sqrt() + eps)
        expected = (1 - lr * wd) * w - m * g
    torch.testing.assert_close(bag.split_weights()[0][1], expected)
    torch.testing.assert_close(bag.split_weights()[0][0], w0[0])
    torch.testing.assert_close(bag.optimizer_state()[0]["momentum1"], torch.tensor([0, acc, 0]))


@pytest.mark.parametrize("backend", ["torch", pytest.param("fbgemm", marks=needs_fbgemm)])
def test_one_step_matches_hand_written_rowwise_adagrad(backend: str) -> None:
    """Oracle written out by hand: one table, dim 4, one feature, batch 2, sum pooling."""
    w0 = torch.arange(24, dtype=torch.float32).view(6, 4) / 10
    lr, eps = 0.5, 1e-2
    bag = BatchedEmbeddingBag(
        [(6, 4)],
        optimizer=EmbeddingOptimizerConfig(kind="exact_rowwise_adagrad", lr=lr, eps=eps),
        backend=backend,
        weights=[w0],
    )
    # bag 0 = rows {1, 1, 3}, bag 1 = rows {3}
    out = bag(torch.tensor([1, 1, 3, 3]), torch.tensor([0, 3, 4]))
    torch.testing.assert_close(out, torch.stack([2 * w0[1] + w0[3], w0[3]]))
    upstream = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5, 0.5]])
    out.backward(upstream)
    g1 = 2 * upstream[0]  # row 1 appears twice in bag 0: gradients summed
    g3 = upstream[0] + upstream[1]
    expected = w0.clone()
    for row, g in ((1, g1), (3, g3)):
        acc = (g * g).mean()
        expected[row] -= lr * g / (acc.sqrt() + eps)
    torch.testing.assert_close(bag.split_weights()[0], expected)
    momentum = bag.optimizer_state()[0]["momentum1"]
    torch.testing.assert_close(
        momentum, torch.tensor([0, (g1 * g1).mean(), 0, (g3 * g3).mean(), 0, 0])
    )


def test_no_update_without_backward_and_learning_rate_change() -> None:
    bag = BatchedEmbeddingBag(
        [(6, 4)],
        backend="torch",
        weights=[torch.ones(6, 4)],
        optimizer=EmbeddingOptimizerConfig(kind="exact_sgd", lr=1.0),
    )
    with torch.no_grad():
        bag(torch.tensor([0]), torch.tensor([0, 1]))
    torch.testing.assert_close(bag.split_weights()[0], torch.ones(6, 4))
    bag.set_learning_rate(0.25)
    assert bag.learning_rate == 0.25
    bag(torch.tensor([0]), torch.tensor([0, 1])).sum().backward()
    torch.testing.assert_close(bag.split_weights()[0][0], torch.full((4,), 0.75))


@pytest.mark.parametrize("backend", ["torch", pytest.param("fbgemm", marks=needs_fbgemm)])
def test_state_round_trip(backend: str) -> None:
    cfg = EmbeddingOptimizerConfig(kind="exact_adagrad", lr=0.1)
    a = BatchedEmbeddingBag(
        TABLES, FEATURE_TABLE_MAP, optimizer=cfg, backend=backend, weights=initial_weights()
    )
    indices, offsets, _ = make_batch(seed=1, weighted=False)
    a(indices, offsets).sum().backward()
    b = BatchedEmbeddingBag(TABLES, FEATURE_TABLE_MAP, optimizer=cfg, backend=backend)
    b.load_weights([w.clone() for w in a.split_weights()])
    b.load_optimizer_state([{k: v.clone() for k, v in s.items()} for s in a.optimizer_state()])
    assert b.optimizer_state()[0]["momentum1"].shape == (20, 8)
    indices, offsets, _ = make_batch(seed=2, weighted=False)
    a(indices, offsets).sum().backward()
    b(indices, offsets).sum().backward()
    for wa, wb in zip(a.split_weights(), b.split_weights(), strict=True):
        torch.testing.assert_close(wa, wb)
    with pytest.raises(CheckpointError, match=r"table 1: weight of shape \(15, 8\)"):
        b.load_weights([torch.zeros(20, 8), torch.zeros(15, 8), torch.zeros(30, 8)])


def test_unsupported_optimizer_names_the_alternatives() -> None:
    cfg = EmbeddingOptimizerConfig(kind="adam")
    with pytest.raises(ConfigError, match="'adam' does not run on cpu.*exact_rowwise_adagrad"):
        BatchedEmbeddingBag([(6, 4)], optimizer=cfg, backend="auto")


@needs_fbgemm
def test_auto_falls_back_to_torch_for_dims_fbgemm_cannot_take(no_native: None) -> None:
    assert BatchedEmbeddingBag([(6, 4)], backend="auto").backend == "fbgemm"
    assert BatchedEmbeddingBag([(6, 6)], backend="auto").backend == "torch"
    with pytest.raises(ConfigError, match="multiples of 4"):
        BatchedEmbeddingBag([(6, 6)], backend="fbgemm")


@needs_fbgemm
def test_rowwise_adagrad_with_unordered_features_avoids_fbgemm(no_native: None) -> None:
    cfg = EmbeddingOptimizerConfig(kind="exact_rowwise_adagrad")
    with pytest.raises(ConfigError, match="needs features ordered by table"):
        BatchedEmbeddingBag(TABLES, [0, 1, 2, 0], optimizer=cfg, backend="fbgemm")
    bag = BatchedEmbeddingBag(TABLES, [0, 1, 2, 0], optimizer=cfg, backend="auto")
    assert bag.backend == "torch"
