"""Small pipelines for the runner's tests: a few thousand synthetic rows, one short epoch."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "pipelines" / "demo.yaml"
#: The demo pipeline made small: seconds per run on 2 cores.
TINY = ("synth.rows=4000", "training.epochs=1", "training.batch_size=256",
        "training.val_every=0", "training.checkpoint_every=0", "training.num_workers=1",
        "eval.gates={auc: 0.5}")


def tiny_inputs(raw: Path, rows: int = 4000, seed: int = 0) -> tuple[str, ...]:
    """Synthetic Criteo logs written as user files, and overrides pointing the demo at them."""
    from ctrctl.data.synthetic import synthesize

    synthesize(raw, rows=rows, format="criteo", seed=seed)
    inputs = ",".join(f"{s}={raw / f'{s}.tsv'}" for s in ("train", "val", "test"))
    return (*TINY, "synth.format=null", f"data.inputs=[{inputs}]")
