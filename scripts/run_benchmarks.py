"""Run every ``scripts/bench_*.py`` in turn and collect their JSON results.

Each benchmark compares ctrctl against its reference in one run and writes
``bench-out/<name>.json``; this script runs them one after another (never in parallel: the
machine is small and shared) and prints where the results are.

Usage:
    python scripts/run_benchmarks.py [--quick] [--only train,sharding] [--out bench-out]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: Benchmarks with a second mode that runs on its own (its results in ``<name>-<mode>.json``).
EXTRA_RUNS = {"planner": ["--scale"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small, fast variants")
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = {name for name in args.only.split(",") if name}
    scripts = sorted(HERE.glob("bench_*.py"))
    failed = []
    for script in scripts:
        name = script.stem.removeprefix("bench_")
        if wanted and name not in wanted:
            continue
        runs = [(name, [sys.executable, str(script), "--out", str(args.out / f"{name}.json")]
                 + (["--quick"] if args.quick else []))]
        for extra in EXTRA_RUNS.get(name, []):  # further modes of the same script
            label = f"{name}-{extra.lstrip('-')}"
            runs.append((label, [sys.executable, str(script), extra, "--out",
                                 str(args.out / f"{label}.json")]))
        for label, cmd in runs:
            print(f"\n=== {label}: {' '.join(cmd)}", flush=True)
            t0 = time.perf_counter()
            code = subprocess.call(cmd)
            print(f"=== {label}: exit {code} in {time.perf_counter() - t0:.0f} s", flush=True)
            if code:
                failed.append(label)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"\nresults in {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
