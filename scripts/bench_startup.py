"""Start-up cost of a command with MLflow tracking on and off.

Runs ``ctrctl synth --rows ROWS`` as a user would (a fresh ``python -m ctrctl`` process),
alternating three variants ``--repeats`` times each: tracked in the background (the default
of leaf commands: a journal, sent by a detached replayer), tracked synchronously
(``CTRCTL_TRACKING_MODE=sync``) and ``--no-track``, all against ``--tracking-uri
sqlite:///STORE`` (a store that already exists: its migrations ran in an untimed first run).
Prints, per variant, the median and the range of the wall time and of the child's CPU time
(user + system) until the command exits; for the background variant also the wall time from
the command's start until its run is in MLflow (its journal sent and deleted; the next
variant starts only then). Beside them: the CPU model and the load average before and after.
A second table times the parts in fresh processes: ``import mlflow``, opening the store
(``MlflowClient`` + one search), and the replayer sending one journal
(``python -m ctrctl.tracking.replay``).

On a shared machine the wall time depends on the neighbours: the CPU time is the steadier
figure; the load average says how busy the machine was.

    .venv/bin/python scripts/bench_startup.py                 # 5 repeats
    .venv/bin/python scripts/bench_startup.py --repeats 3 --source /path/to/other/checkout
    .venv/bin/python scripts/bench_startup.py --json benchmarks/results/<cpu>/startup.json
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

from render_performance import add_json_argument, write_result

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
    parser.add_argument("--sent-timeout", type=float, default=120.0,
                        help="seconds to wait for a background run to reach MLflow")
    add_json_argument(parser)
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


def wait_sent(spool: Path, started: float, timeout_s: float) -> float:
    """Seconds from ``started`` until ``spool`` holds no journal (its runs are in MLflow)."""
    deadline = time.perf_counter() + timeout_s
    while any(spool.glob("*.jsonl*")):
        if time.perf_counter() > deadline:
            log = spool / "replay.log"
            raise SystemExit(f"journals still in {spool} after {timeout_s:.0f} s:\n"
                             + (log.read_text()[-2000:] if log.is_file() else "no replay log"))
        time.sleep(0.02)
    return time.perf_counter() - started


#: A journal like synth's (params, metrics, a dict), written without starting a replayer.
JOURNAL_CODE = """
from ctrctl.tracking.journal import JournalTracker
tracker = JournalTracker({uri!r}, "bench-replay", spawn=False)
with tracker.run("synth") as run:
    run.log_params({{"rows": 1000, "seed": 0}})
    run.log_metrics({{"rows.train": 800.0, "seconds": 0.1}})
    run.log_dict({{"rows": 1000}}, "synth.json")
print(tracker.spool)
"""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "CTRCTL_"))}
    env["PYTHONPATH"] = str(args.source.resolve())
    load_before = load_average()
    print(f"CPU: {cpu_model()} ({os.cpu_count()} CPUs); source: {args.source.resolve()}")
    print(f"load average before: {load_before}")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        work = Path(tmp)
        uri = f"sqlite:///{work / 'mlflow.db'}"
        spool = work / ".ctrctl" / "spool" / "mlflow.db"
        synth = [args.python, "-m", "ctrctl", "synth", "--rows", str(args.rows), "--out",
                 "out", "--overwrite"]
        tracked = [*synth, "--tracking-uri", uri]
        variants = {"background": (tracked, {"CTRCTL_TRACKING_MODE": "background"}),
                    "sync": (tracked, {"CTRCTL_TRACKING_MODE": "sync"}),
                    "no-track": ([*synth, "--no-track"], {})}
        timed(tracked, work, {**env, "CTRCTL_TRACKING_MODE": "sync"})  # migrations: untimed
        walls: dict[str, list[float]] = {name: [] for name in variants}
        cpus: dict[str, list[float]] = {name: [] for name in variants}
        sent: list[float] = []
        for _ in range(args.repeats):
            for name, (cmd, extra) in variants.items():  # alternated: same neighbours
                started = time.perf_counter()
                wall, cpu = timed(cmd, work, {**env, **extra})
                walls[name].append(wall)
                cpus[name].append(cpu)
                if name == "background":
                    sent.append(wait_sent(spool, started, args.sent_timeout))
        parts = {
            "import mlflow": "import mlflow",
            "open store": ("import mlflow.tracking as t; c = t.MlflowClient(tracking_uri="
                           f"{uri!r}); c.search_experiments(max_results=1)"),
            "python": "pass",
        }
        part_walls: dict[str, list[float]] = {name: [] for name in [*parts, "replay"]}
        part_cpus: dict[str, list[float]] = {name: [] for name in [*parts, "replay"]}
        replay = [args.python, "-m", "ctrctl.tracking.replay", str(spool)]
        for _ in range(args.repeats):
            for name, code in parts.items():
                wall, cpu = timed([args.python, "-c", code], work, env)
                part_walls[name].append(wall)
                part_cpus[name].append(cpu)
            timed([args.python, "-c", JOURNAL_CODE.format(uri=uri)], work, env)
            wall, cpu = timed(replay, work, env)
            part_walls["replay"].append(wall)
            part_cpus["replay"].append(cpu)
    print(f"\nctrctl synth --rows {args.rows}, {args.repeats} runs each, until the command "
          "exits (wall / CPU):")
    for name in variants:
        print(f"  {summary(name, walls[name])}   CPU {summary('', cpus[name]).strip()}")
    print(f"  background run in MLflow after {summary('', sent).strip()} (wall, from the "
          "command's start)")
    median = {name: statistics.median(walls[name]) for name in variants}
    for name in ("background", "sync"):
        cost = median[name] - median["no-track"]
        cpu_cost = statistics.median(cpus[name]) - statistics.median(cpus["no-track"])
        print(f"  {name} tracking costs {cost:.2f} s wall, {cpu_cost:.2f} s CPU (medians); "
              f"{median[name]:.2f} s wall ({'within' if median[name] < TARGET_S else 'over'} "
              f"the {TARGET_S:.0f} s target)")
    print("\nparts, in fresh processes (wall / CPU):")
    for name in part_walls:
        label = "replay 1" if name == "replay" else name
        print(f"  {summary(label, part_walls[name])}   CPU "
              f"{summary('', part_cpus[name]).strip()}")
    print(f"\nload average after: {load_average()}")
    if args.json:
        write_json(args, walls, cpus, sent, part_walls, part_cpus, load_before)
    return 0


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def write_json(args: argparse.Namespace, walls: dict[str, list[float]],
               cpus: dict[str, list[float]], sent: list[float],
               part_walls: dict[str, list[float]], part_cpus: dict[str, list[float]],
               load_before: str) -> None:
    columns = ["case", "wall s until exit", "CPU s until exit", "wall s until in MLflow"]
    labels = {"background": "synth, tracked in the background (default)",
              "sync": "synth, tracked synchronously (CTRCTL_TRACKING_MODE=sync)",
              "no-track": "synth --no-track"}
    rows = [{"values": {"case": labels[name], "wall s until exit": _cell(walls[name]),
                        "CPU s until exit": _cell(cpus[name]),
                        "wall s until in MLflow": (_cell(sent) if name == "background"
                                                   else _cell(walls[name])
                                                   if name == "sync" else "-")}}
            for name in walls]
    rows.append({"values": {"case": "the replayer sending one journal (its own process)",
                            "wall s until exit": _cell(part_walls["replay"]),
                            "CPU s until exit": _cell(part_cpus["replay"]),
                            "wall s until in MLflow": _cell(part_walls["replay"])}})
    write_result(args.json, "startup", "Start-up with tracking on (`scripts/bench_startup.py`)",
                 f"`ctrctl synth --rows {args.rows}` in fresh processes against an existing "
                 f"sqlite store, the variants alternated, {args.repeats} runs each: median "
                 "[min-max] seconds; target: a tracked command exits within 2 s wall.",
                 columns, rows, load_before.split()[0])


if __name__ == "__main__":
    sys.exit(main())
