"""The checkpoint format: save at one layout, load at another, atomically and safely."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ctrctl.checkpoint import (
    TableShard,
    export_table_weights,
    import_table_weights,
    latest_checkpoint,
    load_dense,
    load_table_shards,
    load_trainer_state,
    read_metadata,
    resolve_checkpoint,
    save_checkpoint,
)
from ctrctl.distributed.processes import run_multiprocess
from ctrctl.errors import CheckpointError, FormatError
from ctrctl.testing.checkpoints import full_tables, save_row_wise


def _save(folder: Path, step: int, shards: list[TableShard]) -> Path:
    optim = torch.optim.Adagrad([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    optim.param_groups[0]["params"][0].grad = torch.ones(3)
    optim.step()
    return save_checkpoint(
        folder, step, shards, {"mlp.weight": torch.arange(6.0).view(2, 3)},
        optim.state_dict(), {"epoch": 1, "batch": 5},
        {"epoch": 1, "manifest_hash": "abc", "config": {"seed": 1}, "plan": None,
         "tables": {"t_a": {"rows": 10, "dim": 8, "optimizer": "rowwise_adagrad"},
                    "t_b": {"rows": 7, "dim": 4, "optimizer": "rowwise_adagrad"}}},
    )


def _column_blocks(cut: int) -> list[TableShard]:
    shards = []
    for name, (w, rs, es) in full_tables().items():
        c = min(cut, w.shape[1] - 1)
        for lo, hi in ((0, c), (c, w.shape[1])):
            shards.append(TableShard(name, 0, lo, w[:, lo:hi].clone(),
                                     {"momentum": rs.clone(), "sum": es[:, lo:hi].clone()}))
    return shards


def test_save_by_columns_load_by_rows(tmp_path: Path) -> None:
    path = _save(tmp_path / "ck", 4, _column_blocks(3))
    assert path.name == "step-00000004"
    tables = full_tables()
    # Row blocks of the new layout cut across every saved column block.
    wanted = [("t_a", 0, 0, 4, 8), ("t_a", 4, 0, 6, 8), ("t_b", 2, 1, 5, 3)]
    got = load_table_shards(path, wanted)
    for shard, (table, r0, c0, rows, cols) in zip(got, wanted, strict=True):
        w, rs, es = tables[table]
        torch.testing.assert_close(shard.weight, w[r0:r0 + rows, c0:c0 + cols])
        torch.testing.assert_close(shard.optimizer_state["sum"], es[r0:r0 + rows, c0:c0 + cols])
        # every saved column block held the same row state, so the mean is exact
        torch.testing.assert_close(shard.optimizer_state["momentum"], rs[r0:r0 + rows])


def test_row_state_of_differing_column_blocks_is_the_column_weighted_mean(
    tmp_path: Path,
) -> None:
    w = torch.randn(4, 8)
    left, right = torch.full((4,), 1.0), torch.full((4,), 4.0)
    path = save_checkpoint(
        tmp_path, 1,
        [TableShard("t", 0, 0, w[:, :2].clone(), {"m": left}),
         TableShard("t", 0, 2, w[:, 2:].clone(), {"m": right})],
        {}, {}, {}, {"tables": {"t": {"rows": 4, "dim": 8, "optimizer": "x"}}},
    )
    [whole] = load_table_shards(path, [("t", 0, 0, 4, 8)])
    torch.testing.assert_close(whole.optimizer_state["m"], torch.full((4,), (2 * 1 + 6 * 4) / 8))
    [left_again] = load_table_shards(path, [("t", 1, 0, 2, 2)])
    torch.testing.assert_close(left_again.optimizer_state["m"], torch.full((2,), 1.0))


def test_layout_files_latest_and_safe_loading(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    first = _save(folder, 2, _column_blocks(4))
    second = _save(folder, 6, _column_blocks(2))
    assert latest_checkpoint(folder) == second
    assert resolve_checkpoint(tmp_path / "ck") == second
    assert resolve_checkpoint(first) == first
    assert not [p for p in folder.iterdir() if ".tmp-" in p.name], "temp folder left behind"
    names = sorted(str(p.relative_to(second)) for p in second.rglob("*") if p.is_file())
    assert names == ["dense.safetensors", "dense_optimizer.pt", "metadata.json",
                     "rng/0.safetensors", "tables/t_a/0-0.safetensors",
                     "tables/t_a/0-1.safetensors", "tables/t_b/0-0.safetensors",
                     "tables/t_b/0-1.safetensors", "trainer_state.json"]
    meta = read_metadata(second)
    assert (meta.step, meta.epoch, meta.world_size, meta.manifest_hash) == (6, 1, 1, "abc")
    assert meta.tables["t_a"]["optimizer"] == "rowwise_adagrad"
    assert {p.states["momentum"] for p in meta.pieces("t_a")} == {"row"}
    assert {p.states["sum"] for p in meta.pieces("t_a")} == {"element"}
    dense, optim = load_dense(second)
    torch.testing.assert_close(dense["mlp.weight"], torch.arange(6.0).view(2, 3))
    assert set(optim) == {"state", "param_groups"}
    assert load_trainer_state(second) == {"epoch": 1, "batch": 5}


def test_export_and_import_full_tables(tmp_path: Path) -> None:
    path = _save(tmp_path / "ck", 1, _column_blocks(5))
    out = export_table_weights(tmp_path / "ck", tmp_path / "tables.safetensors")
    weights = import_table_weights(out)
    for name, (w, _, _) in full_tables().items():
        torch.testing.assert_close(weights[name], w)
    assert path.exists()


def test_incomplete_and_foreign_checkpoints(tmp_path: Path) -> None:
    w = torch.randn(6, 4)
    path = save_checkpoint(tmp_path, 1, [TableShard("t", 0, 0, w[:3].clone())], {}, {}, {},
                           {"tables": {"t": {"rows": 6, "dim": 4, "optimizer": None}}})
    with pytest.raises(CheckpointError, match="cover 12 of the 24 cells"):
        load_table_shards(path, [("t", 0, 0, 6, 4)])
    with pytest.raises(CheckpointError, match="outside the saved table"):
        load_table_shards(path, [("t", 0, 0, 7, 4)])
    with pytest.raises(CheckpointError, match="no table 'u'"):
        load_table_shards(path, [("u", 0, 0, 1, 1)])
    meta = json.loads((path / "metadata.json").read_text())
    meta["format_version"] = 99
    (path / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(FormatError, match="version 99"):
        read_metadata(path)
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        resolve_checkpoint(tmp_path / "nothing")


@pytest.mark.distributed
def test_saved_by_two_ranks_row_wise_loads_in_one_process_by_columns(tmp_path: Path) -> None:
    paths = run_multiprocess(save_row_wise, world_size=2, args=(str(tmp_path / "ck"),))
    assert paths[0] == paths[1]
    meta = read_metadata(paths[0])
    assert meta.world_size == 2
    assert sorted(p.rank for p in meta.pieces("t_a")) == [0, 1]
    assert (Path(paths[0]) / "rng" / "1.safetensors").is_file()
    for name, (w, rs, es) in full_tables().items():
        rows, dim = w.shape
        half = dim // 2
        got = load_table_shards(paths[0], [(name, 0, 0, rows, half), (name, 0, half, rows, half)])
        torch.testing.assert_close(torch.cat([g.weight for g in got], dim=1), w)
        torch.testing.assert_close(torch.cat([g.optimizer_state["sum"] for g in got], dim=1), es)
        torch.testing.assert_close(got[1].optimizer_state["momentum"], rs)
