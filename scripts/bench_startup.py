"""Start-up cost of a command with MLflow tracking on and off.

Runs ``ctrctl synth --rows ROWS`` as a user would (a fresh ``python -m ctrctl`` process),
alternating ``--tracking-uri sqlite:///STORE`` (a store that already exists: its migrations
ran in an untimed first run) and ``--no-track``, ``--repeats`` times each. Prints, per
variant, the median and the range of the wall time and of the child's CPU time (user +
system), the difference of the medians (what tracking costs), and beside them the CPU model
and the load average before and after. A second table times the parts of tracking in fresh
processes: ``import mlflow``, and opening the store (``MlflowClient`` + one search).

On a shared machine the wall time depends on the neighbours: the CPU time is the steadier
figure; the load average says how busy the machine was.

    .venv/bin/python scripts/bench_startup.py                 # 5 repeats
    .venv/bin/python scripts/bench_startup.py --repeats 3 --source /path/to/other/checkout
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ctrctl.modules.native import cpu_model

ROOT = Path(__file__).resolve().parents[1]
#: The target of the start-up work: a tracked command ready to work within this many seconds.
TARGET_S = 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per variant")
    parser.add_argument("--rows", type=int, default=1000, help="rows synth writes")
    parser.add_argument("--source", type=Path, default=ROOT,
                        help="the ctrctl checkout to run (default: this one)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run")
    return parser.parse_args(argv)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def summary(name: str, values: list[float]) -> str:
    return (f"{name:<10} median {statistics.median(values):6.2f} s  "
            f"range {min(values):.2f}-{max(values):.2f} s")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["PYTHONPATH"] = str(args.source.resolve())
    print(f"CPU: {cpu_model()} ({os.cpu_count()} CPUs); source: {args.source.resolve()}")
    print(f"load average before: {load_average()}")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        work = Path(tmp)
        uri = f"sqlite:///{work / 'mlflow.db'}"
        synth = [args.python, "-m", "ctrctl", "synth", "--rows", str(args.rows), "--out",
                 "out", "--overwrite"]
        variants = {"tracked": [*synth, "--tracking-uri", uri], "no-track": [*synth,
                                                                              "--no-track"]}
        timed(variants["tracked"], work, env)  # creates the store (migrations): not timed
        walls: dict[str, list[float]] = {name: [] for name in variants}
        cpus: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):
            for name, cmd in variants.items():  # alternated: both see the same neighbours
                wall, cpu = timed(cmd, work, env)
                walls[name].append(wall)
                cpus[name].append(cpu)
        parts = {
            "import mlflow": "import mlflow",
            "open store": ("import mlflow.tracking as t; c = t.MlflowClient(tracking_uri="
                           f"{uri!r}); c.search_experiments(max_results=1)"),
            "python": "pass",
        }
        part_walls: dict[str, list[float]] = {name: [] for name in parts}
        part_cpus: dict[str, list[float]] = {name: [] for name in parts}
        for _ in range(args.repeats):
            for name, code in parts.items():
                wall, cpu = timed([args.python, "-c", code], work, env)
                part_walls[name].append(wall)
                part_cpus[name].append(cpu)
    print(f"\nctrctl synth --rows {args.rows}, {args.repeats} runs each (wall / CPU):")
    for name in variants:
        print(f"  {summary(name, walls[name])}   CPU {summary('', cpus[name]).strip()}")
    cost = statistics.median(walls["tracked"]) - statistics.median(walls["no-track"])
    cpu_cost = statistics.median(cpus["tracked"]) - statistics.median(cpus["no-track"])
    tracked = statistics.median(walls["tracked"])
    print(f"  tracking costs {cost:.2f} s wall, {cpu_cost:.2f} s CPU (medians); tracked run "
          f"{tracked:.2f} s wall, {statistics.median(cpus['tracked']):.2f} s CPU "
          f"(wall {'within' if tracked < TARGET_S else 'over'} the {TARGET_S:.0f} s target)")
    print("\nparts, in fresh processes (wall / CPU):")
    for name in parts:
        print(f"  {summary(name, part_walls[name])}   CPU {summary('', part_cpus[name]).strip()}")
    print(f"\nload average after: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
