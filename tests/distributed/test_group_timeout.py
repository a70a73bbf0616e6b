"""Sub-groups (table-row-wise across hosts) wait as long as the group they come from."""

from __future__ import annotations

import pytest

from ctrctl.distributed.processes import run_multiprocess
from ctrctl.testing.groups import twrw_group_timeouts_body


@pytest.mark.distributed
def test_table_row_wise_sub_groups_inherit_the_timeout() -> None:
    # 2 hosts of 1 rank; 42 s is neither torch's default nor ctrctl's
    timeouts = run_multiprocess(twrw_group_timeouts_body, 2, args=(1,), local_world_size=1,
                                timeout_s=42)
    assert timeouts == [{"world": 42.0, "host": 42.0, "cross": 42.0}] * 2
