"""``ctrctl predict`` rows/s, before and after the streaming paths, in the same run.

A small DLRM is trained on synthetic Criteo logs (``--train-rows``; the demo's schema,
``criteo_vocab``: every categorical in vocabulary mode, and its shape: dim 16, dense arch
64,16, over arch 64,1) and exported INT8. On ``--rows`` synthetic test rows:

- ``--input`` (raw logs): ``predict_raw`` now (preprocess into a temporary dataset, then its
  row groups streamed to the program, scores appended) and its ``via="encoder"`` way (the
  preprocess step's reader in chunks and the artifact's column encoder), against
  ``predict_raw`` of commit ``BEFORE`` (preprocess, then the loader path, scores kept in
  memory);
- ``--dataset`` (the same rows preprocessed with the model's transforms): ``predict_dataset``
  now (row groups straight to the program's inputs) against that of ``BEFORE``.

Medians and spread (min-max) over ``--repeats``, torch on one thread, as wall rows/s and
as rows per CPU-second of the process (all threads: polars' too), which a loaded machine
disturbs less; the ratio now/before per path. Each run includes loading the artifact
(verifying its hashes), as the command does. ``--big-rows N`` also scores N synthetic rows with ``python -m ctrctl predict
--input`` under ``/usr/bin/time -v`` and prints its peak RSS and rows/s (bounded memory:
compare two sizes). The load average before and after is printed beside them.

    PYTHONPATH=. .venv/bin/python scripts/bench_predict.py
    PYTHONPATH=. .venv/bin/python scripts/bench_predict.py --rows 20000 --big-rows 1000000
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path

from ctrctl.modules.native import cpu_model

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "d8f1085"  # main before the streaming paths
OVERRIDES = ["model.embedding_dim=16", "model.dense_arch=[64,16]", "model.over_arch=[64,1]",
             "training.batch_size=512", "training.epochs=1", "training.num_workers=1",
             "training.device=cpu", "training.checkpoint_every=0", "training.val_every=0"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50_000, help="test rows scored per run")
    parser.add_argument("--train-rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--schema", default="criteo_vocab",
                        help="schemas/NAME.yaml (the demo's: criteo_vocab; criteo: hash mode)")
    parser.add_argument("--big-rows", type=int, default=0,
                        help="also measure peak RSS of the CLI on this many rows")
    return parser.parse_args(argv)


def _old_predictor(root: Path) -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{BEFORE}:ctrctl/inference/predictor.py"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    module = types.ModuleType("old_predictor")
    module.__file__ = str(root / "old_predictor.py")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 (ours)
    return module


def _rates(call: Callable[[], int], repeats: int) -> tuple[list[float], list[float]]:
    """(wall rows/s, rows per CPU-second of this process: all its threads) per repeat."""
    wall, cpu = [], []
    for _ in range(repeats):
        started, used = time.perf_counter(), time.process_time()
        rows = call()
        wall.append(rows / (time.perf_counter() - started))
        cpu.append(rows / (time.process_time() - used))
    return wall, cpu


def _big_run(root: Path, export: Path, rows: int) -> None:
    from ctrctl.data.synthetic import synthesize

    synthesize(root / "big", rows=rows, format="criteo", seed=5, splits={"test": 1.0})
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "ctrctl", "predict", "--model",
               str(export), "--input", str(root / "big" / "test.tsv"), "--out",
               str(root / "big.parquet")]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    seconds = time.perf_counter() - started
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr)
    print(f"  CLI predict --input, {rows:,} rows ({(root / 'big' / 'test.tsv').stat().st_size / 1e6:,.0f}"
          f" MB): rc {result.returncode}, {rows / seconds:,.0f} rows/s wall (with start-up), "
          f"peak RSS {int(peak.group(1)) / 1024 if peak else float('nan'):,.0f} MiB")
    if result.returncode:
        print(result.stderr[-2000:])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from ctrctl.config import load_config
    from ctrctl.data.preprocess import preprocess
    from ctrctl.data.synthetic import synthesize
    from ctrctl.inference import predictor
    from ctrctl.inference.export import write_artifact
    from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
    from ctrctl.training.loop import train

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-predict-") as tmp:
        root = Path(tmp)
        synthesize(root / "train", rows=args.train_rows, format="criteo", seed=1,
                   splits={"train": 1.0})
        synthesize(root / "test", rows=args.rows, format="criteo", seed=2,
                   splits={"test": 1.0})
        dataset = root / "dataset"
        preprocess(ROOT / "schemas" / f"{args.schema}.yaml",
                   [f"train={root / 'train' / 'train.tsv'}"], dataset)
        run = train(dataset, root / "run", load_config(None, OVERRIDES))
        export = write_artifact(quantize_checkpoint(run.checkpoint,
                                                    QuantizeConfig(dtype="int8")),
                                root / "export", dataset=dataset)
        scored = root / "scored"
        preprocess(None, [f"test={root / 'test' / 'test.tsv'}"], scored,
                   reuse_transforms=export / "dataset")
        old = _old_predictor(root)
        raw = root / "test" / "test.tsv"
        out = root / "scores.parquet"
        cases: dict[str, Callable[[], int]] = {
            "input now": lambda: predictor.predict_raw(export, raw, out, overwrite=True).rows,
            "input encoder": lambda: predictor.predict_raw(export, raw, out, overwrite=True,
                                                           via="encoder").rows,
            "input before": lambda: old.predict_raw(export, raw, out, overwrite=True).rows,
            "dataset now": lambda: predictor.predict_dataset(export, scored, "test", out,
                                                             overwrite=True).rows,
            "dataset before": lambda: old.predict_dataset(export, scored, "test", out,
                                                          overwrite=True).rows,
        }
        print(f"CPU: {cpu_model()}; load average before: {os.getloadavg()}")
        print(f"{args.rows:,} synthetic Criteo rows, schemas/{args.schema}.yaml, batch 8192, "
              f"{args.repeats} repeats, torch on 1 thread")
        medians = {}
        for name, call in cases.items():
            call()  # warm-up (and the same output path for both)
            wall, cpu = _rates(call, args.repeats)
            medians[name] = statistics.median(wall)
            medians[name + " cpu"] = statistics.median(cpu)
            print(f"  {name:15s} {medians[name]:>10,.0f} rows/s wall (min {min(wall):,.0f}, "
                  f"max {max(wall):,.0f}); {medians[name + ' cpu']:,.0f} rows per CPU-s "
                  f"(min {min(cpu):,.0f}, max {max(cpu):,.0f})")
        for path in ("input", "dataset"):
            print(f"  --{path} now/before: wall "
                  f"{medians[path + ' now'] / medians[path + ' before']:.1f}x, per CPU-s "
                  f"{medians[path + ' now cpu'] / medians[path + ' before cpu']:.1f}x")
        if args.big_rows:
            _big_run(root, export, args.big_rows)
        print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
