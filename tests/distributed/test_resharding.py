"""Checkpoints saved on 2 ranks load on 3 and on 1 under other plans: same weights, and the
next step equals the unsharded model's from the same checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.testing.sharding_dmp import resume_body, save_body

SAVE_PLAN = {"t0": "row_wise", "t1": "column_wise", "t2": "table_wise", "t3": "table_wise"}
RESUME_PLANS = {
    3: {"t0": "column_wise", "t1": "row_wise", "t2": "table_row_wise", "t3": "row_wise"},
    1: "table_wise",
}


@pytest.mark.distributed
@pytest.mark.slow
def test_checkpoint_reshards_from_2_to_3_and_1(tmp_path: Path) -> None:
    saved = run_multiprocess(save_body, 2, args=(str(tmp_path / "ckpt"), SAVE_PLAN))
    path = saved[0]["path"]
    assert Path(path, "metadata.json").is_file()
    assert not [p for p in (tmp_path / "ckpt").iterdir() if ".tmp-" in p.name]
    for world_size, plan in RESUME_PLANS.items():
        assert run_multiprocess(resume_body, world_size, args=(path, saved[0], plan)) == \
            [True] * world_size
