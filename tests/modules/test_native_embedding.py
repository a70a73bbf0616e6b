"""The native CPU kernel against the plain-torch reference: forward, backward, fused update.

Held with assert_close's default tolerances over three steps. Where the summation order
differs: the row-wise mean of g * g and the per-sample-weight dot products are summed in 16
lanes (torch sums them its own way); repeated ids are summed in the ids' order, as the
reference's index_add_ does, and no other operation is fused or reordered.
"""

from __future__ import annotations

import pytest
import torch

from ctrctl.errors import ConfigError, SparseInputError
from ctrctl.modules import BatchedEmbeddingBag, EmbeddingBagCollection, EmbeddingBagConfig
from ctrctl.modules.native.embedding import native_available
from ctrctl.modules.optimizers import CPU_OPTIMIZERS, EmbeddingOptimizerConfig
from ctrctl.sparse import KeyedJaggedTensor

pytestmark = pytest.mark.skipif(not native_available(), reason="the C kernel was not built")

# Two dims; table 0 serves features 0 and 3 (a shared table, features out of table order).
TABLES = [(20, 8), (15, 4), (30, 8)]
FEATURE_TABLE_MAP = [0, 1, 2, 0]
BATCH = 6


def make_batch(seed: int, weighted: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Repeated ids inside bags and across bags and features, and empty bags."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 5, (len(FEATURE_TABLE_MAP), BATCH), generator=gen)
    lengths[0, 1] = 0  # an empty bag
    lengths[:, 4] = 0  # a sample with no ids at all
    lengths[3, 2] = 3
    ids = [
        torch.randint(0, min(TABLES[t][0], 5), (int(lengths[f].sum()),), generator=gen)
        for f, t in enumerate(FEATURE_TABLE_MAP)
    ]
    indices = torch.cat(ids)
    if lengths[0, 0] >= 2:
        indices[1] = indices[0]  # a repeat inside one bag
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.long)
    offsets[1:] = lengths.reshape(-1).cumsum(0)
    weights = torch.rand(indices.numel(), generator=gen) + 0.5 if weighted else None
    return indices, offsets, weights


def trace(backend: str, kind: str, pooling: str, weighted: bool, steps: int = 3,
          weight_decay_mode: str = "none") -> list[torch.Tensor]:
    """Outputs, the gradients reaching a dense head and the ids' weights, the tables and
    the optimizer state after each of a few steps."""
    optimizer = EmbeddingOptimizerConfig(
        kind=kind, lr=0.1, eps=1e-3, weight_decay=0.1 if weight_decay_mode != "none" else 0.0,
        weight_decay_mode=weight_decay_mode)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(rows, dim, generator=gen) * 0.1 for rows, dim in TABLES]
    bag = BatchedEmbeddingBag(TABLES, FEATURE_TABLE_MAP, optimizer=optimizer, pooling=pooling,
                              backend=backend, weights=weights)
    assert bag.backend == backend
    head = torch.nn.Linear(sum(bag.feature_dims), 1)
    with torch.no_grad():
        head.weight.copy_(torch.linspace(-1, 1, sum(bag.feature_dims)))
        head.bias.zero_()
    out: list[torch.Tensor] = []
    for step in range(steps):
        indices, offsets, per_sample = make_batch(step, weighted)
        if per_sample is not None:
            per_sample.requires_grad_(True)
        pooled = bag(indices, offsets, per_sample)  # (B, 28)
        loss = (head(pooled).squeeze(1) ** 2).sum()
        head.zero_grad()
        loss.backward()
        out += [pooled.detach().clone(), head.weight.grad.clone()]
        if per_sample is not None:
            assert per_sample.grad is not None
            out.append(per_sample.grad.clone())
        out += [w.detach().clone() for w in bag.split_weights()]
        out += [s.clone() for st in bag.optimizer_state() for s in st.values()]
    return out


@pytest.mark.parametrize("kind", CPU_OPTIMIZERS)
@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_native_equals_plain_torch(kind: str, pooling: str, weighted: bool) -> None:
    native = trace("native", kind, pooling, weighted)
    reference = trace("torch", kind, pooling, weighted)
    assert len(native) == len(reference)
    for i, (a, b) in enumerate(zip(native, reference, strict=True)):
        torch.testing.assert_close(a, b, msg=lambda m, i=i: f"item {i}: {m}")


@pytest.mark.parametrize("mode", ["l2", "decoupled"])
def test_native_rowwise_adagrad_weight_decay_equals_plain_torch(mode: str) -> None:
    native = trace("native", "exact_rowwise_adagrad", "sum", False, weight_decay_mode=mode)
    reference = trace("torch", "exact_rowwise_adagrad", "sum", False, weight_decay_mode=mode)
    for a, b in zip(native, reference, strict=True):
        torch.testing.assert_close(a, b)


def test_hot_row_is_updated_once_with_its_summed_gradient() -> None:
    """Row-wise Adagrad on one row read 5 times: one accumulator step with the sum, not five."""
    lr, eps = 0.5, 0.1
    cfg = EmbeddingOptimizerConfig(kind="exact_rowwise_adagrad", lr=lr, eps=eps)
    w0 = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    bag = BatchedEmbeddingBag([(3, 4)], optimizer=cfg, backend="native", weights=[w0])
    # 3 bags: [2, 2], [2], [2, 2] (duplicates in a bag and across bags), the other rows unread.
    out = bag(torch.tensor([2, 2, 2, 2, 2]), torch.tensor([0, 2, 3, 5]))
    torch.testing.assert_close(out[1], w0[2])
    out.backward(torch.ones(3, 4))
    g = torch.full((4,), 5.0)
    acc = (g * g).mean()
    expected = w0[2] - lr / (acc.sqrt() + eps) * g
    torch.testing.assert_close(bag.split_weights()[0][2], expected)
    torch.testing.assert_close(bag.split_weights()[0][:2], w0[:2])
    torch.testing.assert_close(bag.optimizer_state()[0]["momentum1"], torch.tensor([0, 0, acc]))


def test_many_threads_and_a_large_batch_match_one_thread() -> None:
    """The work split (by samples forward, by distinct rows backward) changes nothing."""
    results = []
    threads = torch.get_num_threads()
    for n in (1, 3):
        torch.set_num_threads(n)
        try:
            bag = BatchedEmbeddingBag([(500, 16), (300, 16)], [0, 1, 0], backend="native",
                                      weights=[torch.ones(500, 16), torch.ones(300, 16)])
            gen = torch.Generator().manual_seed(1)
            ids = torch.randint(0, 300, (3 * 1000,), generator=gen) ** 2 % 300  # skewed
            out = bag(ids, torch.arange(3 * 1000 + 1))
            out.backward(torch.randn(out.shape, generator=gen))
            results.append([w.clone() for w in bag.split_weights()] + [out.detach()])
        finally:
            torch.set_num_threads(threads)
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", CPU_OPTIMIZERS)
def test_one_feature_per_table_sorts_by_table_and_equals_plain_torch(kind: str) -> None:
    """Every table read by one feature (the backward then sorts each feature's ids on its
    own, in parallel): tables of 1 row, of a few thousand (two digits) and of 2^22 + 3 rows
    (three), features out of table order, repeated ids in and across bags, empty bags; one
    thread and three give the plain-torch reference's tables and state."""
    tables = [(1, 4), (3000, 8), (70_000, 4), (2**22 + 3, 2)]
    feature_table_map = [3, 1, 0, 2]
    batch = 64
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(0, 4, (len(feature_table_map), batch), generator=gen)
    lengths[:, 5] = 0
    ids = []
    for f, t in enumerate(feature_table_map):
        rows = tables[t][0]
        drawn = torch.randint(0, rows, (int(lengths[f].sum()),), generator=gen)
        drawn[::3] = drawn[0]  # a hot row, repeated in and across bags
        ids.append(drawn)
    indices, offsets = torch.cat(ids), torch.zeros(lengths.numel() + 1, dtype=torch.long)
    offsets[1:] = lengths.reshape(-1).cumsum(0)
    grad = torch.randn(batch, sum(tables[t][1] for t in feature_table_map), generator=gen)
    start = [torch.randn(rows, dim, generator=gen) * 0.1 for rows, dim in tables]
    optimizer = EmbeddingOptimizerConfig(kind=kind, lr=0.1, eps=1e-3)
    threads = torch.get_num_threads()
    results = {}
    for backend, n in (("torch", 1), ("native", 1), ("native", 3)):
        torch.set_num_threads(n)
        try:
            bag = BatchedEmbeddingBag(tables, feature_table_map, optimizer=optimizer,
                                      backend=backend, weights=start)
            for _ in range(2):
                bag(indices, offsets).backward(grad)
            results[(backend, n)] = (
                [w.clone() for w in bag.split_weights()]
                + [v.clone() for st in bag.optimizer_state() for v in st.values()])
        finally:
            torch.set_num_threads(threads)
    reference = results[("torch", 1)]
    for key in (("native", 1), ("native", 3)):
        for a, b in zip(results[key], reference, strict=True):
            torch.testing.assert_close(a, b)


def test_bad_ids_and_offsets_raise() -> None:
    bag = BatchedEmbeddingBag([(4, 4)], backend="native")
    with pytest.raises(SparseInputError, match="id 4 at position 1 is outside its table"):
        bag(torch.tensor([0, 4]), torch.tensor([0, 1, 2]))
    with pytest.raises(SparseInputError, match="id -1"):
        bag(torch.tensor([-1]), torch.tensor([0, 1]))
    with pytest.raises(SparseInputError, match="offsets decrease"):
        bag(torch.tensor([0, 1]), torch.tensor([0, 2, 1, 2]))
    with pytest.raises(SparseInputError, match="offsets end at 3"):
        bag(torch.tensor([0, 1]), torch.tensor([0, 3]))


def test_native_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ConfigError, match="CPU only"):
        BatchedEmbeddingBag([(4, 4)], backend="native", device="meta")
    with pytest.raises(ConfigError, match="fp32 only"):
        BatchedEmbeddingBag([(4, 4)], backend="native", data_type="fp16")


def test_auto_takes_native_on_cpu() -> None:
    assert BatchedEmbeddingBag([(6, 4)], backend="auto").backend == "native"
    assert BatchedEmbeddingBag([(6, 6)], backend="auto").backend == "native"  # any dim


def test_output_buffer_is_not_reused_while_held() -> None:
    """The kernel reuses its output buffer only once nothing else holds the previous one."""
    bag = BatchedEmbeddingBag([(10, 4)], backend="native",
                              weights=[torch.arange(40, dtype=torch.float32).reshape(10, 4)])
    offsets = torch.arange(3)
    first = bag(torch.tensor([1, 2]), offsets)
    kept = first.detach().clone()
    second = bag(torch.tensor([3, 4]), offsets)
    torch.testing.assert_close(first, kept)  # still the first batch's values
    assert not torch.equal(first, second)
    view = second[0]
    del second
    third = bag(torch.tensor([5, 6]), offsets)
    torch.testing.assert_close(view, bag.split_weights()[0][3])  # a view keeps it alive too
    assert third[0, 0] == 20.0


def test_collection_state_and_resume_across_kernels() -> None:
    """Weights and optimizer state move between the native and plain-torch kernels as the
    checkpoint code moves them (per table name), and training continues identically."""
    configs = [EmbeddingBagConfig("t_a", 30, 8, ["a"]), EmbeddingBagConfig("t_b", 20, 8, ["b"])]
    cfg = EmbeddingOptimizerConfig(kind="exact_rowwise_adagrad", lr=0.1)
    native = EmbeddingBagCollection(configs, optimizer=cfg, backend="native", seed=0)
    assert native.backends() == ["native"]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        ["a", "b"], torch.tensor([1, 1, 7, 3, 3, 0, 9]), torch.tensor([2, 1, 0, 3, 1, 0]))
    native(kjt).values().sum().backward()
    resumed = EmbeddingBagCollection(configs, optimizer=cfg, backend="torch", seed=9)
    resumed.load_state_dict({k: v.clone() for k, v in native.state_dict().items()})
    resumed.load_optimizer_state(
        {k: {n: t.clone() for n, t in s.items()} for k, s in native.optimizer_state().items()})
    assert sorted(native.state_dict()) == ["embedding_bags.t_a.weight", "embedding_bags.t_b.weight"]
    native(kjt).values().pow(2).sum().backward()
    resumed(kjt).values().pow(2).sum().backward()
    for name, weight in native.embedding_bag_weights().items():
        torch.testing.assert_close(resumed.embedding_bag_weights()[name], weight)
        torch.testing.assert_close(resumed.optimizer_state()[name]["momentum1"],
                                   native.optimizer_state()[name]["momentum1"])


def test_large_tables_go_on_huge_pages_and_train_as_plain_torch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffers past HUGE_PAGE_MIN_BYTES are advised (and collapsed) once, not every step;
    the weights, their values and the training are unchanged by it."""
    import ctrctl.modules.native.embedding as native
    from ctrctl.modules.native import buffers

    calls: list[tuple[int, int, bool]] = []
    advise = buffers.advise_huge_pages

    def spy(tensor: torch.Tensor, collapse: bool = False) -> bool:
        calls.append((tensor.data_ptr(), tensor.numel() * tensor.element_size(), collapse))
        return advise(tensor, collapse)

    monkeypatch.setattr(native, "advise_huge_pages", spy)
    dim = 64
    rows = buffers.HUGE_PAGE_MIN_BYTES // (dim * 4) + 1000
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(rows, dim, generator=gen)
    optimizer = EmbeddingOptimizerConfig(kind="exact_adagrad", lr=0.1, eps=1e-3)
    bags = {b: BatchedEmbeddingBag([(rows, dim)], backend=b, optimizer=optimizer,
                                   weights=[start.clone()]) for b in ("native", "torch")}
    for _ in range(3):
        ids = torch.randint(0, rows, (2000,), generator=gen)
        ids[1::7] = ids[0]  # a hot row
        offsets = torch.arange(0, 2001, 4)
        grad = torch.randn(500, dim, generator=gen)
        for bag in bags.values():
            bag(ids, offsets).backward(grad)
    torch.testing.assert_close(bags["native"].split_weights()[0],
                               bags["torch"].split_weights()[0])
    weight = bags["native"].kernel.flat_weights[0]  # type: ignore[attr-defined]
    assert (weight.data_ptr(), rows * dim * 4, True) in calls  # the table, collapsed
    assert len(calls) == 2  # table and state, once (the addresses did not change)


def test_advise_huge_pages_keeps_values_and_skips_small_tensors() -> None:
    from ctrctl.modules.native.buffers import HUGE_PAGE_MIN_BYTES, advise_huge_pages

    small = torch.randn(100)
    assert advise_huge_pages(small) is False
    big = torch.randn(HUGE_PAGE_MIN_BYTES // 4 + 12345)
    before = big.clone()
    advised = advise_huge_pages(big, collapse=True)
    assert torch.equal(big, before)
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    import os
    if os.path.exists(thp) and "[never]" not in open(thp).read():
        assert advised  # Linux with huge pages available: the advice is taken


def test_one_openmp_runtime_in_the_process() -> None:
    """The kernels' threads are torch's OpenMP threads: loading them adds no OpenMP runtime
    beside the one torch loaded (Linux, where /proc/self/maps says; in a fresh interpreter,
    since other libraries the tests load bring their own)."""
    import os
    import subprocess
    import sys
    import textwrap

    if not os.path.exists("/proc/self/maps"):
        pytest.skip("no /proc/self/maps here")
    script = textwrap.dedent("""
        def runtimes():
            with open("/proc/self/maps") as maps:
                return sorted({line.split()[-1] for line in maps
                               if any(n in line for n in ("libgomp", "libomp", "libiomp"))})
        import torch
        torch.ones(4096).sum()  # torch's OpenMP is up
        before = runtimes()
        import ctrctl.modules.native.embedding, ctrctl.modules.interaction
        assert ctrctl.modules.native.embedding.native_available()
        print(before == runtimes(), len(before))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    same, count = result.stdout.split()
    assert same == "True" and int(count) <= 1, result.stdout
