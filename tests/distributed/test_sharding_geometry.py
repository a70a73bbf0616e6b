"""Shard geometry, id bucketing and the received-layout reorder, on one process."""

from __future__ import annotations

import pytest
import torch

from ctrctl.distributed.default_plan import column_blocks, default_plan, forced_plan
from ctrctl.distributed.sharding import common
from ctrctl.distributed.sharding.common import GroupLayout, bucketize_by_rows
from ctrctl.distributed.types import row_blocks
from ctrctl.errors import PlanError
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.sparse.ops import use_fbgemm_ops

TABLES = [EmbeddingBagConfig("a", 10, 8, ("fa",)), EmbeddingBagConfig("b", 7, 16, ("fb", "fc")),
          EmbeddingBagConfig("c", 2, 4, ("fd",))]


def naive_bucketize(lengths, values, weights, blocks):
    """Per block, per bag: the ids of the bag that fall in the block, made block-local."""
    bag_values = list(values.split(lengths.reshape(-1).tolist()))
    bag_weights = list(weights.split(lengths.reshape(-1).tolist())) if weights is not None \
        else None
    out_len, out_val, out_wt = [], [], []
    for start, rows in blocks:
        for i, bag in enumerate(bag_values):
            keep = (bag >= start) & (bag < start + rows)
            out_len.append(int(keep.sum()))
            out_val.append(bag[keep] - start)
            if bag_weights is not None:
                out_wt.append(bag_weights[i][keep])
    f, b = lengths.shape
    return (torch.tensor(out_len).view(len(blocks), f, b), torch.cat(out_val),
            torch.cat(out_wt) if bag_weights is not None else None)


@pytest.mark.parametrize("rows,blocks", [(10, row_blocks(10, 3)), (7, row_blocks(7, 4)),
                                         (10, [(0, 2), (2, 5), (7, 3)])])
@pytest.mark.parametrize("weighted", [False, True])
def test_bucketize_matches_naive(rows: int, blocks, weighted: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    lengths = torch.randint(0, 4, (2, 5), generator=gen)
    values = torch.randint(0, rows, (int(lengths.sum()),), generator=gen)
    weights = torch.rand(values.numel(), generator=gen) if weighted else None
    got = bucketize_by_rows(lengths, values, weights, blocks, rows)
    want = naive_bucketize(lengths, values, weights, blocks)
    torch.testing.assert_close(got[0].long(), want[0])
    torch.testing.assert_close(got[1], want[1])
    if weighted:
        torch.testing.assert_close(got[2], want[2])


@pytest.mark.skipif(not use_fbgemm_ops(), reason="fbgemm_gpu is not installed")
def test_fbgemm_and_torch_bucketize_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 6, (3, 64), generator=gen)
    values = torch.randint(0, 1000, (int(lengths.sum()),), generator=gen)
    weights = torch.rand(values.numel(), generator=gen)
    blocks = row_blocks(1000, 3)
    fast = bucketize_by_rows(lengths, values, weights, blocks, 1000)
    monkeypatch.setattr(common, "use_fbgemm_ops", lambda: False)
    slow = bucketize_by_rows(lengths, values, weights, blocks, 1000)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b.to(a.dtype))


def test_to_slot_major_reorders_sources_within_slots() -> None:
    # 2 sources (B=2 and B=1) x 2 slots; each bag holds ids naming (source, slot, bag)
    bags = {(0, 0): [[1], [2, 3]], (0, 1): [[4], []], (1, 0): [[5, 6]], (1, 1): [[7]]}
    lengths, values = [], []
    for source in (0, 1):
        for slot in (0, 1):
            for bag in bags[(source, slot)]:
                lengths.append(len(bag))
                values += bag
    got_len, got_val, _ = common.to_slot_major(torch.tensor(lengths), torch.tensor(values),
                                               None, 2, [2, 1])
    assert got_len.tolist() == [1, 2, 2, 1, 0, 1]
    assert got_val.tolist() == [1, 2, 3, 5, 6, 4, 7]


def test_row_and_column_blocks_follow_torchrec() -> None:
    assert row_blocks(10, 3) == [(0, 4), (4, 4), (8, 2)]
    assert row_blocks(2, 4) == [(0, 1), (1, 1)]            # fewer blocks than ranks
    assert column_blocks(64, 2) == [(0, 32), (32, 32)]
    assert column_blocks(12, 4) == [(0, 4), (4, 4), (8, 4)]  # widths divide, multiples of 4
    assert column_blocks(6, 2) == [(0, 6)]                   # cannot cut: one block


def test_layout_slots_and_columns() -> None:
    plan = forced_plan(TABLES, 2, {"a": "row_wise", "b": "column_wise", "c": "table_wise"})
    layout = GroupLayout.build(TABLES, [plan.tables[t.name] for t in TABLES], 2)
    assert layout.feature_names == ["fa", "fb", "fc", "fd"]
    # rank 0: a's first row block, b's second column block (round robin from table 1; fb
    # and fc share it), c whole
    slots0 = [(layout.features[s.feature][0], s.shard.row_offset, s.shard.col_offset)
              for s in layout.slots_per_rank[0]]
    assert slots0 == [("fa", 0, 0), ("fb", 0, 8), ("fc", 0, 8), ("fd", 0, 0)]
    assert layout.rank_width(0) == 8 + 8 + 8 + 4
    # output columns: fa 0-7, fb 8-23, fc 24-39, fd 40-43; rank 1 holds a's rows 5-9 and
    # b's first column block
    cols = layout.target_columns([1]).tolist()
    assert cols == list(range(0, 8)) + list(range(8, 16)) + list(range(24, 32))


def test_forced_and_default_plans_validate() -> None:
    for kind in ("data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise",
                 "table_column_wise"):
        for world in (1, 2, 3, 4):
            forced_plan(TABLES, world, kind)
    forced_plan(TABLES, 4, "table_row_wise", local_world_size=2).validate(
        {t.name: (t.num_embeddings, t.embedding_dim) for t in TABLES})
    plan = default_plan(TABLES, 2)
    assert {ps.sharding_type for ps in plan.tables.values()} == {"table_wise"}
    # largest first onto the least loaded rank: b (112 cells) -> 0, a (80) -> 1, c (8) -> 1
    assert {n: ps.shards[0].rank for n, ps in plan.tables.items()} == {"a": 1, "b": 0, "c": 1}
    with pytest.raises(PlanError, match="no sharding type given for table 'c'"):
        forced_plan(TABLES, 2, {"a": "row_wise", "b": "table_wise"})


@pytest.mark.parametrize("batches", [[3, 3, 3], [2, 4, 1]])
def test_to_slot_major_matches_naive(batches: list[int]) -> None:
    gen = torch.Generator().manual_seed(len(batches))
    num_slots = 4
    bags = {(src, slot): [torch.randint(0, 9, (int(n),), generator=gen)
                          for n in torch.randint(0, 3, (b,), generator=gen)]
            for src, b in enumerate(batches) for slot in range(num_slots)}
    source_major = [bags[(src, slot)] for src in range(len(batches)) for slot in range(num_slots)]
    slot_major = [bags[(src, slot)] for slot in range(num_slots) for src in range(len(batches))]

    def flat(blocks):
        lengths = torch.tensor([len(b) for block in blocks for b in block])
        values = torch.cat([b for block in blocks for b in block])
        return lengths, values

    lengths, values = flat(source_major)
    weights = values.float() / 10
    got = common.to_slot_major(lengths, values, weights, num_slots, batches)
    want_len, want_val = flat(slot_major)
    torch.testing.assert_close(got[0], want_len)
    torch.testing.assert_close(got[1], want_val)
    torch.testing.assert_close(got[2], want_val.float() / 10)
