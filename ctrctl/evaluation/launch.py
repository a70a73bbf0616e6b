"""Running ``ctrctl eval`` on several processes: torchrun starts them, gloo/NCCL joins them.

``ctrctl eval --nproc-per-node N`` re-runs itself under torchrun through
:func:`ctrctl.distributed.launch.launch`; each child sees ``RANK``/``WORLD_SIZE`` and joins
the default process group with :func:`ctrctl.distributed.launch.init_process_group`.

Example:
    >>> if needs_launch(nproc_per_node=2):
    ...     code = launch_eval(["eval", "--checkpoint", "ckpt", ...], nproc_per_node=2)
"""

from __future__ import annotations

from collections.abc import Sequence

from ctrctl.distributed.launch import launch, needs_launch

__all__ = ["CHILD_ENV", "launch_eval", "needs_launch"]

#: Set in the children so that the parent, not each rank, reports a failed gate.
CHILD_ENV = "CTRCTL_EVAL_CHILD"


def launch_eval(args: Sequence[str], nproc_per_node: int) -> int:
    """Run ``ctrctl <args>`` on ``nproc_per_node`` local processes; returns torchrun's exit code."""
    return launch(["-m", "ctrctl", *args], nproc_per_node, env={CHILD_ENV: "1"})
