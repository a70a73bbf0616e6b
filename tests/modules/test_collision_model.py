"""A DLRM with managed-collision tables: remapping in the forward, rows reset on reassignment."""

from __future__ import annotations

import pytest
import torch

from ctrctl.modules import (
    DLRM,
    CollisionConfig,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingOptimizerConfig,
    ManagedCollisionCollection,
    dlrm_loss,
)
from ctrctl.modules.collisions import DEFAULT_ROW
from ctrctl.sparse import KeyedJaggedTensor

DIM, CAPACITY = 8, 6


def zch_model(backend: str, kind: str = "exact_rowwise_adagrad") -> DLRM:
    tables = [EmbeddingBagConfig("user", CAPACITY, DIM, ["user"]),
              EmbeddingBagConfig("item", 20, DIM, ["item"])]
    ebc = EmbeddingBagCollection(tables, optimizer=EmbeddingOptimizerConfig(kind=kind, lr=0.5),
                                 backend=backend, seed=0)
    mc = ManagedCollisionCollection({"user": CollisionConfig(CAPACITY, eviction="lru")}, tables)
    return DLRM(ebc, 2, [8, DIM], [8, 1], collisions=mc)


def batch(users: list[int], seed: int = 0) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = len(users)
    items = torch.randint(0, 20, (n,), generator=gen)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["user", "item"], torch.cat([torch.tensor(users), items]), torch.ones(2 * n, dtype=torch.int64))
    return torch.randn(n, 2, generator=gen), kjt, torch.randint(0, 2, (n,), generator=gen)


def step(model: DLRM, users: list[int], seed: int = 0) -> torch.Tensor:
    dense, kjt, labels = batch(users, seed)
    loss = dlrm_loss(model(dense, kjt), labels)
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("backend", ["auto", "torch"])
@pytest.mark.parametrize("kind", ["exact_rowwise_adagrad", "exact_adagrad"])
def test_evicted_rows_are_reset_before_their_new_owner_uses_them(backend: str, kind: str) -> None:
    model = zch_model(backend, kind)
    ebc = model.sparse_arch
    raw = [10**12 + i for i in range(5)]  # five users fill slots 1..5
    for s in range(3):
        step(model, raw, seed=s)
    weights = ebc.embedding_bag_weights()["user"]
    state = ebc.optimizer_state()["user"]["momentum1"].clone()
    trained = weights.clone()
    assert bool((state[1:] > 0).all())  # the owners' rows have optimizer state
    before_default = trained[DEFAULT_ROW].clone()

    # Two newcomers evict the two least recently used owners (raw[0], raw[1] used last at
    # step 3 like the others; ties go to the lowest slots 1 and 2).
    step(model, [raw[2], raw[3], raw[4], 7, 8], seed=9)
    mc = model.collisions
    assert mc is not None
    slots = mc.remappers["user"].lookup(torch.tensor([7, 8])).tolist()
    assert sorted(slots) == [1, 2]
    assert mc.stats()["user"]["evictions"] == 2
    # The new owners' rows were re-drawn (not the evicted rows' trained values, not zero),
    # then trained one step from a fresh optimizer state.
    after = ebc.embedding_bag_weights()["user"]
    for slot in slots:
        assert not torch.equal(after[slot], trained[slot])
        assert bool(after[slot].abs().sum() > 0)
    low, high = ebc.embedding_bag_configs()[0].init_range
    assert bool(((after[slots] >= low - 1.0) & (after[slots] <= high + 1.0)).all())
    new_state = ebc.optimizer_state()["user"]["momentum1"]
    # One step's squared gradient, not the accumulated three steps' state of the old owner.
    assert bool((new_state[slots].reshape(len(slots), -1).sum(1)
                 < state[slots].reshape(len(slots), -1).sum(1)).all())
    assert torch.equal(after[DEFAULT_ROW], before_default)  # nobody looked it up


def test_reset_writes_fresh_rows_and_zero_state() -> None:
    """The reset itself, without a training step after it (cf. torchrec #3030)."""
    model = zch_model("auto")
    ebc, mc = model.sparse_arch, model.collisions
    assert mc is not None
    remapper = mc.remappers["user"]
    with torch.no_grad():
        ebc.embedding_bag_weights()["user"].zero_()  # the #3030 symptom, planted
        ebc.optimizer_state()["user"]["momentum1"].fill_(3.0)
    remapper.remap(torch.tensor([1, 2, 3]))
    assert mc.reset_rows(ebc) == {"user": 3}
    weights, state = ebc.embedding_bag_weights()["user"], ebc.optimizer_state()["user"]
    assert bool((weights[1:4].abs().sum(1) > 0).all())
    assert bool((state["momentum1"][1:4] == 0).all())
    assert bool((state["momentum1"][4:] == 3.0).all())  # rows not reassigned keep theirs


def test_eval_mode_only_looks_up() -> None:
    model = zch_model("auto")
    step(model, [1, 2, 3])
    mc = model.collisions
    assert mc is not None
    saved = {k: v.clone() for k, v in mc.state_dict().items()}
    model.eval()
    dense, kjt, _ = batch([1, 99, 3])
    with torch.no_grad():
        model(dense, kjt)
    remapped = mc(kjt)
    assert remapped["user"].values().tolist() == [1, DEFAULT_ROW, 3]
    assert remapped["item"].values().tolist() == kjt["item"].values().tolist()
    for key, value in mc.state_dict().items():
        assert torch.equal(value, saved[key]), key


def test_loaded_state_scores_raw_keys_as_the_trained_model() -> None:
    torch.manual_seed(0)
    trained = zch_model("auto")
    for s, users in enumerate([[1, 2, 3, 4], [5, 6, 7, 1], [8, 8, 9, 2]]):
        step(trained, users, seed=s)
    torch.manual_seed(1)
    fresh = zch_model("auto")
    fresh.load_state_dict(trained.state_dict())
    trained.eval()
    fresh.eval()
    dense, kjt, _ = batch([1, 9, 12345, 6, 2**62], seed=5)  # incl. ids never seen
    with torch.no_grad():
        torch.testing.assert_close(fresh(dense, kjt), trained(dense, kjt))


def test_reset_reaches_a_cached_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A table kept on disk with a DRAM row cache: the reset writes through to its rows."""
    tables = [EmbeddingBagConfig("user", CAPACITY, DIM, ["user"]),
              EmbeddingBagConfig("item", 20, DIM, ["item"])]
    ebc = EmbeddingBagCollection(tables, optimizer=EmbeddingOptimizerConfig(lr=0.5), seed=0,
                                 cached_tables={"user": 0.5}, cache_dir=str(tmp_path))
    mc = ManagedCollisionCollection({"user": CollisionConfig(CAPACITY, eviction="lru")}, tables)
    model = DLRM(ebc, 2, [8, DIM], [8, 1], collisions=mc)
    assert "cached" in ebc.backends()
    raw = [10**12 + i for i in range(5)]
    for s in range(3):
        step(model, raw, seed=s)
    with torch.no_grad():
        ebc.embedding_bag_weights(["user"])["user"][1:3] = 0.0  # the #3030 symptom, planted
    mc.remappers["user"].remap(torch.tensor([raw[2], raw[3], raw[4], 7, 8]))
    assert mc.reset_rows(ebc) == {"user": 2}
    weights = ebc.embedding_bag_weights(["user"])["user"]
    assert bool((weights[1:3].abs().sum(1) > 0).all())
    state = ebc.optimizer_state(["user"])["user"]["momentum1"]
    assert bool((state[1:3] == 0).all()) and bool((state[3:6] > 0).all())


def test_zch_models_train_with_the_base_pipeline() -> None:
    """Pipelines that read ahead would distribute or prefetch raw keys before the remap."""
    from ctrctl.distributed.pipeline import choose_pipeline
    from ctrctl.errors import ConfigError

    model = zch_model("auto")
    assert choose_pipeline("auto", model) == "base"
    assert choose_pipeline("base", model) == "base"
    with pytest.raises(ConfigError, match="reads batches ahead"):
        choose_pipeline("sparse-dist", model)
