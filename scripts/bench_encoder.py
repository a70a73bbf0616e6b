"""Raw rows -> model inputs: the column encoder's rows/s on one core, against the per-row
encoder it replaced (the loader of commit ``BEFORE``), in the same run on the same rows.

Synthetic Avazu logs (``ctrctl synth --format avazu``: 22 raw categoricals, hex and int,
plus the ``hour`` column that ``hour_of_day`` and ``weekday`` derive from) are preprocessed
with ``schemas/avazu.yaml`` (``--vocab``: every feature in vocabulary mode instead), and
the artifact's input contract is built from that dataset; no model is trained (encoding
needs none). Each case encodes ``--rows`` raw rows as requests of ``--request`` rows:

- ``cold``: ``encode_columns`` of raw text columns (what a server that parses JSON column
  by column hands it), the encoder's value caches emptied before each repeat: every value
  of a request not seen in an earlier request of the repeat is parsed;
- ``columns``: the same with the caches filled by the previous repeat (every value seen
  before: the best case, a feed whose values repeat);
- ``records``: ``encode`` of row dicts (rows -> columns -> the same), what
  ``predict_records`` and the pyfunc do;
- ``before``: the per-row encoder of commit ``BEFORE`` on the same row dicts.

Medians and spread (min-max) over ``--repeats``, torch and numpy on one thread, as rows
per CPU-second of this process (what one core does, whatever the neighbours take) and as
wall rows/s; the load average before and after is printed beside them. Target: >= 200k raw rows/s on one core.

    PYTHONPATH=. .venv/bin/python scripts/bench_encoder.py                  # 270-row requests
    PYTHONPATH=. .venv/bin/python scripts/bench_encoder.py --request 8192
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctrctl.modules.native import cpu_model

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "d8f1085"  # main before the column encoder
TARGET_ROWS_PER_S = 200_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=54_000, help="raw rows per repeat")
    parser.add_argument("--request", type=int, default=270, help="rows per encode call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab", action="store_true", help="vocabulary mode features")
    parser.add_argument("--before-rows", type=int, default=5_400,
                        help="rows the per-row encoder gets (it is slow)")
    return parser.parse_args(argv)


def _contract(root: Path, rows: int, vocab: bool) -> tuple[dict[str, Any], dict[str, Any],
                                                            list[list[str]]]:
    """(input contract, vocabularies, raw test rows) of a synthetic Avazu dataset."""
    from ctrctl.data.manifest import DatasetManifest
    from ctrctl.data.preprocess import preprocess
    from ctrctl.data.schema import load_schema
    from ctrctl.data.synthetic import synthesize
    from ctrctl.inference.export import _vocabulary_files, input_contract

    synthesize(root / "logs", rows=2 * rows, format="avazu", seed=1,
               splits={"train": 0.5, "test": 0.5})
    schema = load_schema(ROOT / "schemas" / "avazu.yaml")
    if vocab:
        schema = schema.with_vocab(2)
    dataset = root / "dataset"
    preprocess(schema, [f"train={root / 'logs' / 'train.csv'}"], dataset)
    manifest = DatasetManifest.load(dataset)
    (root / "stage").mkdir()
    files = _vocabulary_files(manifest, dataset, root / "stage")
    vocabularies = {n: json.loads((root / "stage" / p).read_text()) for n, p in files.items()}
    with open(root / "logs" / "test.csv", newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        raw = [row for _, row in zip(range(rows), reader, strict=False)]
    assert header[0] == "id", header
    return input_contract(manifest, manifest.sparse_names, files), vocabularies, raw


def _old_loader(root: Path) -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{BEFORE}:ctrctl/inference/standalone.py"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    path = root / "old_serving.py"
    path.write_text(source)
    module = types.ModuleType("old_serving")
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 (our own file)
    return module


def _time(call: Callable[[], None], repeats: int) -> list[tuple[float, float]]:
    """(wall seconds, CPU seconds of this process) of each repeat."""
    seconds = []
    for _ in range(repeats):
        started, cpu = time.perf_counter(), time.process_time()
        call()
        seconds.append((time.perf_counter() - started, time.process_time() - cpu))
    return seconds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    from ctrctl.inference.standalone import ServingModel

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-encoder-") as tmp:
        contract, vocabularies, rows = _contract(Path(tmp), args.rows, args.vocab)
        names = ["id", "click", *contract["columns"]]
        model = ServingModel(tmp, {"input": contract}, None, vocabularies)
        old = _old_loader(Path(tmp)).ServingModel(tmp, {"input": contract}, None,
                                                  vocabularies)
        records = [dict(zip(names, row, strict=True)) for row in rows]
        step = args.request
        chunks = [records[i:i + step] for i in range(0, len(records), step)]
        column_chunks = [({n: [r[n] for r in chunk] for n in names}, len(chunk))
                         for chunk in chunks]
        # Same dense values (the ids are property-tested against preprocess in
        # tests/inference/test_encoder.py; the old encoder derived no hour features).
        assert torch.equal(model.encode(chunks[0])[0], old.encode(chunks[0])[0])
        few = chunks[:max(1, args.before_rows // step)]
        def cold() -> None:
            for cache in model._encoder._cache.values():
                cache.clear()
            for c, n in column_chunks:
                model.encode_columns(c, n)

        cases = {
            "cold": (cold, len(records)),
            "columns": (lambda: [model.encode_columns(c, n) for c, n in column_chunks],
                        len(records)),
            "records": (lambda: [model.encode(c) for c in chunks], len(records)),
            "before": (lambda: [old.encode(c) for c in few], sum(map(len, few))),
        }
        print(f"CPU: {cpu_model()}; load average before: {os.getloadavg()}")
        print(f"{len(records):,} raw Avazu rows ({len(names)} columns, "
              f"{'vocabulary' if args.vocab else 'hash'} mode), requests of {step} rows, "
              f"{args.repeats} repeats, 1 thread")
        medians = {}
        for name, (call, n) in cases.items():
            call()  # warm-up
            runs = _time(call, args.repeats)
            rates = [n / wall for wall, _ in runs]
            per_cpu = [n / cpu for _, cpu in runs]
            medians[name] = statistics.median(per_cpu)
            print(f"  {name:8s} {medians[name]:>10,.0f} rows per CPU-s (min {min(per_cpu):,.0f}"
                  f", max {max(per_cpu):,.0f}); wall {statistics.median(rates):,.0f} rows/s "
                  f"(min {min(rates):,.0f}, max {max(rates):,.0f}); "
                  f"{1e3 * step / medians[name]:.3f} CPU-ms per request")
        print(f"  cold / before: {medians['cold'] / medians['before']:.1f}x; "
              f"columns / before: {medians['columns'] / medians['before']:.1f}x; "
              f"records / before: {medians['records'] / medians['before']:.1f}x; "
              f"x target: cold {medians['cold'] / TARGET_ROWS_PER_S:.2f}, "
              f"columns {medians['columns'] / TARGET_ROWS_PER_S:.2f}")
        print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
