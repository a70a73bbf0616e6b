"""One rank failing (killed, raising, dying mid-checkpoint) stops the others with a message
that names it, well within the process group's timeout, never a hang."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.testing.sharding_dmp import (
    kill_in_checkpoint_body,
    kill_mid_step_body,
    raise_mid_step_body,
    run_ranks,
)

TIMEOUT_S = 30.0


def _survivors(results: dict, victim: int, world_size: int) -> list[tuple]:
    assert victim not in results or results[victim][0] != "ok"
    out = [results[r] for r in range(world_size) if r != victim]
    assert len(out) == world_size - 1, f"a survivor reported nothing: {results}"
    return out


@pytest.mark.slow
@pytest.mark.distributed
def test_rank_killed_mid_step_is_named() -> None:
    results = run_ranks(kill_mid_step_body, 3, args=(1,), timeout_s=TIMEOUT_S)
    assert 1 not in results                       # killed: it said nothing
    for status, message, seconds in _survivors(results, 1, 3):
        assert status == "DistributedError", message
        assert "rank(s) 1 did not arrive" in message, message
        assert seconds < TIMEOUT_S, f"took {seconds:.1f}s: waited for the timeout"


@pytest.mark.distributed
@pytest.mark.slow
def test_rank_raising_is_named_with_its_error() -> None:
    results = run_ranks(raise_mid_step_body, 2, args=(1,), timeout_s=TIMEOUT_S)
    assert results[1][0] == "ValueError"
    [(status, message, seconds)] = _survivors(results, 1, 2)
    assert status == "DistributedError", message
    assert "rank 1 failed: ValueError" in message and "outside table t0" in message, message
    assert seconds < TIMEOUT_S


@pytest.mark.distributed
@pytest.mark.slow
def test_rank_killed_while_checkpointing_leaves_no_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    results = run_ranks(kill_in_checkpoint_body, 2, args=(str(folder), 1),
                        timeout_s=TIMEOUT_S)
    [(status, message, seconds)] = _survivors(results, 1, 2)
    assert status == "DistributedError" and "1" in message, message
    assert seconds < TIMEOUT_S
    assert not (folder / "step-00000007").exists()
    assert not (folder / "latest").exists()
