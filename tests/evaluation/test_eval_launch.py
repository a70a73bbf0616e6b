"""Eval's launch has training's shape: a spec as JSON, a worker module, one group start."""

from __future__ import annotations

from ctrctl.evaluation.launch import EvalSpec, worker_program


def test_the_spec_travels_as_json_unchanged() -> None:
    spec = EvalSpec(out="eval", checkpoint="runs/a", split="val", segment_by=("C1", "C2"),
                    gates=("auc>=0.7",), keep=("C1",), baselines=False, track=False,
                    env={"X": "1"})
    assert EvalSpec.from_json(spec.to_json()) == spec
    program = worker_program(spec)
    assert program[:3] == ["-m", "ctrctl.evaluation.worker", "--spec"]
    assert EvalSpec.from_json(program[3]) == spec
