"""DLRM: shapes, the interactions against hand-written references, overfitting a tiny batch."""

from __future__ import annotations

import pytest
import torch

from ctrctl.data.manifest import DatasetManifest, DenseFeature, SparseFeature, SplitInfo
from ctrctl.errors import ConfigError
from ctrctl.models.build import dlrm_from_manifest
from ctrctl.modules import (
    DLRM,
    DotInteraction,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingOptimizerConfig,
    LowRankCrossNet,
    dlrm_loss,
)
from ctrctl.modules.mlp import MLP
from ctrctl.sparse import KeyedJaggedTensor

DIM = 8


def tiny_model(interaction: str = "dot", backend: str = "auto", lr: float = 0.1) -> DLRM:
    tables = [EmbeddingBagConfig(f"t_{i}", 50, DIM, [f"C{i}"]) for i in range(3)]
    ebc = EmbeddingBagCollection(
        tables,
        optimizer=EmbeddingOptimizerConfig(kind="exact_rowwise_adagrad", lr=lr),
        backend=backend,
        seed=0,
    )
    return DLRM(
        ebc, 4, [16, DIM], [16, 1], interaction=interaction, dcn_num_layers=2, dcn_low_rank_dim=4
    )


def tiny_batch(batch: int, seed: int = 0) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    dense = torch.randn(batch, 4, generator=gen)
    lengths = torch.randint(0, 3, (3 * batch,), generator=gen)
    values = torch.randint(0, 50, (int(lengths.sum()),), generator=gen)
    kjt = KeyedJaggedTensor.from_lengths_sync(["C0", "C1", "C2"], values, lengths)
    labels = torch.randint(0, 2, (batch,), generator=gen)
    return dense, kjt, labels


def test_dot_interaction_against_loops() -> None:
    gen = torch.Generator().manual_seed(0)
    dense, sparse = torch.randn(3, 5, generator=gen), torch.randn(3, 4, 5, generator=gen)
    out = DotInteraction(num_sparse_features=4)(dense, sparse)
    assert out.shape == (3, 5 + 10)
    expected = []
    for b in range(3):
        x = [dense[b], *sparse[b]]
        pairs = [torch.dot(x[i], x[j]) for i in range(5) for j in range(i + 1, 5)]
        expected.append(torch.cat([dense[b], torch.stack(pairs)]))
    torch.testing.assert_close(out, torch.stack(expected))


def test_dot_interaction_gradients() -> None:
    """The written-out backward against autograd through the plain cat + bmm formulation."""
    gen = torch.Generator().manual_seed(1)
    dense = torch.randn(6, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    sparse = torch.randn(6, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    interaction = DotInteraction(num_sparse_features=5)
    torch.autograd.gradcheck(lambda d, s: interaction(d, s), (dense, sparse))

    x = torch.cat([dense.unsqueeze(1), sparse], dim=1)
    rows, cols = torch.triu_indices(6, 6, offset=1)
    reference = torch.cat([dense, torch.bmm(x, x.transpose(1, 2))[:, rows, cols]], dim=1)
    upstream = torch.randn(reference.shape, generator=gen, dtype=torch.float64)
    expected = torch.autograd.grad(reference, (dense, sparse), upstream)
    out = interaction(dense, sparse)
    torch.testing.assert_close(out, reference)
    got = torch.autograd.grad(out, (dense, sparse), upstream)
    torch.testing.assert_close(got, expected)


def test_interaction_padding_keeps_the_model() -> None:
    """Zero columns (415 -> 416 in the benchmark's shape) change neither logits nor training."""
    padded, plain = tiny_model(), tiny_model()
    plain_model = DLRM(plain.sparse_arch, 4, [16, DIM], [16, 1], interaction_pad_to=1)
    assert (
        padded.interaction.output_dim(DIM) == 16 and plain_model.interaction.output_dim(DIM) == 14
    )
    with torch.no_grad():
        plain_model.dense_arch.load_state_dict(padded.dense_arch.state_dict())
        for (name, p_plain), p_padded in zip(
            plain_model.over_arch.named_parameters(), padded.over_arch.parameters(), strict=True
        ):
            p_plain.copy_(p_padded[:, :14] if name == "layers.0.weight" else p_padded)
    dense, kjt, labels = tiny_batch(batch=8)
    torch.testing.assert_close(padded(dense, kjt), plain_model(dense, kjt))
    optimizer = torch.optim.Adagrad(padded.dense_parameters(), lr=0.1)
    for _ in range(3):
        loss = dlrm_loss(padded(dense, kjt), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert torch.count_nonzero(padded.over_arch.layers[0].weight[:, 14:]) == 0


def test_low_rank_cross_net_against_formula() -> None:
    net = LowRankCrossNet(in_features=6, num_layers=2, low_rank_dim=3)
    x0 = torch.randn(4, 6)
    x = x0
    for v, u in zip(net.V, net.U, strict=True):
        x = x0 * (x @ v.weight.T @ u.weight.T + u.bias) + x
    torch.testing.assert_close(net(x0), x)


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_shapes_and_dense_parameters(interaction: str) -> None:
    model = tiny_model(interaction)
    dense, kjt, _ = tiny_batch(batch=5)
    logits = model(dense, kjt)
    assert logits.shape == (5,) and logits.dtype == torch.float32
    dense_names = [name for name, _ in model.dense_named_parameters()]
    assert dense_names and not any(n.startswith("sparse_arch") for n in dense_names)
    all_names = {name for name, _ in model.named_parameters()}
    assert len(list(model.dense_parameters())) == len(dense_names) <= len(all_names)


def test_embeddings_train_in_backward_and_dense_by_the_optimizer() -> None:
    model = tiny_model(backend="torch")
    dense, kjt, labels = tiny_batch(batch=6)
    before = {k: v.clone() for k, v in model.sparse_arch.embedding_bag_weights().items()}
    loss = dlrm_loss(model(dense, kjt), labels)
    loss.backward()
    after = model.sparse_arch.embedding_bag_weights()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is not None for p in model.dense_parameters())


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_tiny_model_overfits_a_tiny_batch(interaction: str) -> None:
    torch.manual_seed(0)
    model = tiny_model(interaction, lr=0.1)
    dense, kjt, labels = tiny_batch(batch=16, seed=1)
    optimizer = torch.optim.Adagrad(model.dense_parameters(), lr=0.1)
    first = None
    for _ in range(40):
        loss = dlrm_loss(model(dense, kjt), labels)
        first = float(loss.detach()) if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert first > 0.5
    assert float(loss) < 0.01
    predictions = (model(dense, kjt) > 0).long()
    assert torch.equal(predictions, labels)


def test_dense_autocast_flag_is_inert_on_a_cpu_without_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ctrctl.modules import dlrm

    monkeypatch.setattr(dlrm, "bf16_autocast_supported", lambda device: False)
    plain, flagged = tiny_model(), tiny_model()
    flagged.dense_autocast = True
    flagged.load_state_dict(plain.state_dict())
    dense, kjt, _ = tiny_batch(batch=4)
    with torch.no_grad():
        torch.testing.assert_close(flagged(dense, kjt), plain(dense, kjt))


def test_config_errors() -> None:
    tables = [EmbeddingBagConfig("t", 10, 4, ["f"])]
    ebc = EmbeddingBagCollection(tables)
    with pytest.raises(ConfigError, match="ends with width 8 but embedding dims are \\[4\\]"):
        DLRM(ebc, 3, [8], [4, 1])
    with pytest.raises(ConfigError, match="must end with 1"):
        DLRM(ebc, 3, [4], [4, 2])
    with pytest.raises(ConfigError, match="unknown interaction"):
        DLRM(ebc, 3, [4], [4, 1], interaction="cat")


def test_model_from_manifest() -> None:
    manifest = DatasetManifest(
        label="label",
        dense=tuple(DenseFeature(f"I{i}") for i in range(2)),
        sparse=(SparseFeature("C1", "hash", 100), SparseFeature("C2", "vocab", 7)),
        splits={"train": SplitInfo(rows=10, label_rate=0.5)},
    )
    model = dlrm_from_manifest(manifest, 4, [8, 4], [8, 1])
    assert model.sparse_arch.feature_names() == ["C1", "C2"]
    sizes = {k: tuple(v.shape) for k, v in model.sparse_arch.embedding_bag_weights().items()}
    assert sizes == {"C1": (100, 4), "C2": (7, 4)}
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["C1", "C2"], torch.tensor([5, 99, 6, 0]), torch.tensor([1, 1, 1, 1])
    )
    assert model(torch.randn(2, 2), kjt).shape == (2,)


def sparse_only_model(interaction: str, pad_to: int = 8, first_order: bool = True) -> DLRM:
    tables = [EmbeddingBagConfig(f"t_{i}", 50, DIM, [f"C{i}"]) for i in range(3)]
    ebc = EmbeddingBagCollection(
        tables, optimizer=EmbeddingOptimizerConfig(kind="exact_sgd", lr=0.1), backend="torch", seed=0
    )
    return DLRM(ebc, 0, [], [16, 1], interaction=interaction, dcn_num_layers=2,
                dcn_low_rank_dim=4, interaction_pad_to=pad_to, first_order=first_order)


@pytest.mark.parametrize("interaction", ["dot", "dot-pairs-only", "dcn"])
def test_zero_dense_features_shapes_and_gradients(interaction: str) -> None:
    torch.manual_seed(0)
    pairs_only = interaction == "dot-pairs-only"
    model = sparse_only_model("dot" if pairs_only else interaction, first_order=not pairs_only)
    assert model.dense_arch is None
    # dot: the learned vector (8) and the 6 pairs of it and 3 embeddings (padded to 16);
    # pairs only: the 3 pairs of 3 embeddings (padded to 8); dcn: the 3 x 8 embeddings
    width = {"dot": 16, "dot-pairs-only": 8, "dcn": 3 * DIM}[interaction]
    assert (model.dense_anchor is not None) == (interaction == "dot")
    assert model.over_arch.layers[0].in_features == width
    _, kjt, labels = tiny_batch(batch=6)
    dense = torch.empty(6, 0)
    logits = model(dense, kjt)
    assert logits.shape == (6,) and logits.dtype == torch.float32 and logits.isfinite().all()
    before = {k: v.clone() for k, v in model.sparse_arch.embedding_bag_weights().items()}
    dlrm_loss(logits, labels).backward()
    grads = {name: p.grad for name, p in model.dense_named_parameters()}
    assert grads and all(g is not None for g in grads.values())
    assert all(not n.startswith("dense_arch") for n in grads)
    assert all(torch.count_nonzero(g) > 0 for n, g in grads.items() if "layers.0" in n)
    # the fused optimizer moved the rows the batch looked up
    after = model.sparse_arch.embedding_bag_weights()
    assert all(not torch.equal(before[k], after[k]) for k in before)


def test_without_dense_features_a_learned_vector_gives_first_order_terms() -> None:
    torch.manual_seed(0)
    model = sparse_only_model("dot", pad_to=1)
    assert model.dense_anchor is not None
    with torch.no_grad():
        model.dense_anchor.copy_(torch.randn(DIM))
    _, kjt, _ = tiny_batch(batch=5)
    pooled = model.sparse_arch(kjt).values().view(5, 3, DIM).detach()
    x = torch.cat([model.dense_anchor.detach().expand(5, 1, DIM), pooled], dim=1)  # (B, 4, D)
    expected = torch.cat([model.dense_anchor.detach().expand(5, DIM), torch.stack([
        torch.stack([torch.dot(s[i], s[j]) for i in range(4) for j in range(i + 1, 4)])
        for s in x])], dim=1)  # [c, c.e_1, c.e_2, c.e_3, e_1.e_2, e_1.e_3, e_2.e_3]
    torch.testing.assert_close(model.interaction(model.dense_anchor.expand(5, DIM), pooled),
                               expected)
    # it is the model's input to the over arch, and the vector learns
    torch.testing.assert_close(model(torch.empty(5, 0), kjt),
                               model.over_arch(expected).squeeze(1))
    model(torch.empty(5, 0), kjt).sum().backward()
    assert model.dense_anchor.grad is not None and model.dense_anchor.grad.abs().sum() > 0
    assert "dense_anchor" in dict(model.dense_named_parameters())


def test_zero_dense_dot_interaction_against_loops_and_autograd() -> None:
    model = sparse_only_model("dot", pad_to=1, first_order=False)
    gen = torch.Generator().manual_seed(2)
    sparse = torch.randn(4, 3, DIM, generator=gen, dtype=torch.float64, requires_grad=True)
    out = model.interaction(sparse)
    expected = torch.stack([
        torch.stack([torch.dot(s[i], s[j]) for i in range(3) for j in range(i + 1, 3)])
        for s in sparse])
    torch.testing.assert_close(out, expected)
    torch.autograd.gradcheck(model.interaction, (sparse,))


def test_zero_dense_model_matches_the_formula() -> None:
    """Logits = over arch(pairwise dots of the pooled embeddings), computed by hand."""
    model = sparse_only_model("dot", pad_to=1, first_order=False)
    _, kjt, _ = tiny_batch(batch=5, seed=3)
    with torch.no_grad():
        pooled = model.sparse_arch(kjt).values().view(5, 3, DIM)
        pairs = torch.stack([(pooled[:, i] * pooled[:, j]).sum(1)
                             for i in range(3) for j in range(i + 1, 3)], dim=1)
        expected = model.over_arch(pairs).squeeze(1)
        torch.testing.assert_close(model(torch.empty(5, 0), kjt), expected)


def test_zero_dense_model_from_manifest_and_errors() -> None:
    manifest = DatasetManifest(
        label="label", dense=(),
        sparse=(SparseFeature("C1", "hash", 100), SparseFeature("C2", "vocab", 7)),
        splits={"train": SplitInfo(rows=10, label_rate=0.5)},
    )
    # the dense arch of the config is ignored: there is nothing for it to read
    model = dlrm_from_manifest(manifest, 4, [8, 16], [8, 1])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["C1", "C2"], torch.tensor([5, 99, 6, 0]), torch.tensor([1, 1, 1, 1])
    )
    assert model(torch.empty(2, 0), kjt).shape == (2,)
    one = EmbeddingBagCollection([EmbeddingBagConfig("t", 10, 4, ["f"])])
    with pytest.raises(ConfigError, match="needs two sparse features"):
        DLRM(one, 0, [], [4, 1], interaction="dot", first_order=False)
    # with the learned vector one embedding has a pair: its dot with the vector
    alone = DLRM(one, 0, [], [4, 1], interaction="dot", interaction_pad_to=1)
    assert alone.over_arch.layers[0].in_features == 4 + 1
    assert DLRM(one, 0, [], [4, 1], interaction="dcn").over_arch.layers[0].in_features == 4
    mixed = EmbeddingBagCollection([EmbeddingBagConfig("a", 10, 4, ["f"]),
                                    EmbeddingBagConfig("b", 10, 8, ["g"])])
    with pytest.raises(ConfigError, match="one embedding dim"):
        DLRM(mixed, 0, [], [4, 1])


def test_dropout_drops_hidden_activations_in_training_only() -> None:
    torch.manual_seed(0)
    plain, dropped = MLP(6, [32, 16, 1], final_activation=False), MLP(
        6, [32, 16, 1], final_activation=False, dropout=0.25)
    dropped.load_state_dict(plain.state_dict())  # the same parameters, the same keys
    x = torch.randn(64, 6)
    dropped.eval()
    assert torch.equal(dropped(x), plain(x))  # no dropout outside training
    dropped.train()
    torch.manual_seed(3)
    got = dropped(x)
    # The reference: torch's dropout after each hidden ReLU only (not after the logit layer),
    # drawn in the same order from the same seed.
    torch.manual_seed(3)
    linears = [m for m in plain.layers if isinstance(m, torch.nn.Linear)]
    h = x
    for i, linear in enumerate(linears):
        h = linear(h)
        if i + 1 < len(linears):
            h = torch.relu(h)
            h = torch.nn.functional.dropout(h, 0.25, training=True)
    torch.testing.assert_close(got, h)
    assert (got != plain(x)).any()
    with pytest.raises(ConfigError, match="dropout"):
        MLP(6, [4], dropout=1.0)


def test_dlrm_dropout_trains_and_scores_as_without_it_in_eval() -> None:
    torch.manual_seed(0)
    base = tiny_model()
    tables = [EmbeddingBagConfig(f"t_{i}", 50, DIM, [f"C{i}"]) for i in range(3)]
    ebc = EmbeddingBagCollection(tables, optimizer=EmbeddingOptimizerConfig(
        kind="exact_rowwise_adagrad", lr=0.1), seed=0)
    model = DLRM(ebc, 4, [16, DIM], [16, 1], dropout=0.5)
    model.load_state_dict(base.state_dict())
    dense, kjt, _ = tiny_batch(32)
    base.eval()
    model.eval()
    assert torch.equal(model(dense, kjt), base(dense, kjt))
    model.train()
    assert not torch.equal(model(dense, kjt), base(dense, kjt))
