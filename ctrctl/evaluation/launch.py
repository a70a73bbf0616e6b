"""Running ``ctrctl eval`` on several processes: the same shape as training's launch.

``ctrctl eval --nproc-per-node N`` runs ``python -m torch.distributed.run ... -m
ctrctl.evaluation.worker --spec JSON`` through :func:`ctrctl.distributed.launch.launch`:
torchrun starts the ranks and fails them all when one fails. Each worker joins the default
process group with :func:`ctrctl.distributed.launch.init_process_group` (the one start;
gloo on CPU, NCCL on CUDA, always with a timeout), scores its slice of the split and runs
:func:`ctrctl.evaluation.evaluate.evaluate`; the launching process reports the metrics and
the gates from the output folder.

Example:
    >>> spec = EvalSpec(out="eval", checkpoint="runs/a", split="test")
    >>> if needs_launch(nproc_per_node=2):
    ...     code = launch_eval(spec, nproc_per_node=2)    # torchrun's exit code
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from ctrctl.distributed.launch import launch, needs_launch

__all__ = ["EvalSpec", "launch_eval", "needs_launch", "worker_program"]


@dataclass(frozen=True)
class EvalSpec:
    """Everything an evaluation worker needs to run ``evaluate``: what the command line said.

    The fields are :func:`ctrctl.evaluation.evaluate.evaluate`'s arguments, paths as text;
    ``track``, ``tracking_uri`` and ``experiment`` make rank 0's tracker; ``env`` is added
    to the workers' environment.
    """

    out: str
    checkpoint: str | None = None
    dataset: str | None = None
    predictions: str | None = None
    split: str = "test"
    segment_by: tuple[str, ...] = ()
    gates: tuple[str, ...] = ()
    save_predictions: bool = False
    keep: tuple[str, ...] = ()
    baselines: bool = True
    overwrite: bool = False
    batch_size: int = 8192
    num_bins: int = 1 << 20
    exact_limit: int = 10_000_000
    ece_bins: int = 20
    track: bool = True
    tracking_uri: str | None = None
    experiment: str = "ctrctl"
    env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> EvalSpec:
        data = json.loads(text)
        for name in ("segment_by", "gates", "keep"):
            data[name] = tuple(data.get(name, ()))
        return cls(**data)


def worker_program(spec: EvalSpec) -> list[str]:
    """What each evaluation rank runs under torchrun: the worker module with the spec."""
    return ["-m", "ctrctl.evaluation.worker", "--spec", spec.to_json()]


def launch_eval(spec: EvalSpec, nproc_per_node: int) -> int:
    """Run the evaluation workers on ``nproc_per_node`` local processes and wait; returns
    torchrun's exit code (0 when all succeed).

    Raises:
        DistributedError: a rank failed, naming it and its own cause.
    """
    return launch(worker_program(spec), nproc_per_node, env=dict(spec.env))
