"""Render docs/performance.md and the README's headline table from benchmark result files.

The current figures live in ``benchmarks/results/<cpu>/<bench>.json``, one file per benchmark
and CPU family, written by ``scripts/bench_*.py --json PATH`` (or seeded by hand from a
recorded run). Each file holds one table: its rows, and for every row the command that
reproduces it, the date, the CPU model and the load average. This script turns them into one
table per benchmark and CPU family on ``docs/performance.md``, and the rows marked
``headline`` into the table between the ``performance`` markers in README.md. ``--check``
exits 1 when either file is not what the JSON renders (a test runs it).

The benchmark scripts import :func:`write_result` and :func:`add_json_argument` from here.

A result file::

    {"format": 1, "bench": "train", "cpu": "amd-epyc-zen5",
     "cpu_name": "AMD EPYC, Zen 5 (AVX-512, no AMX)",
     "title": "Training: DLRM on CPU", "what": "one line on the workload and the figures",
     "columns": ["case", "ctrctl samples/s", "ctrctl / TorchRec"],
     "rows": [{"values": {"case": "1 thread", "ctrctl samples/s": "41,583", ...},
               "command": "python scripts/bench_train.py", "date": "2026-12-04",
               "cpu_model": "AMD EPYC 9B45", "load": "1.13 -> 1.38",
               "headline": {"label": "Training, 1 thread: ctrctl / TorchRec",
                            "column": "ctrctl / TorchRec"}}]}

Usage:
    python scripts/render_performance.py [--check]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from ctrctl.modules.native import cpu_model

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PAGE = REPO / "docs" / "performance.md"
README = REPO / "README.md"
START = "<!-- performance:start (rendered by scripts/render_performance.py) -->"
END = "<!-- performance:end -->"
NOT_RECORDED = "not recorded"
FORMAT = 1


# ---- writing a result (the benchmark scripts call these) --------------------------------
def cpu_family() -> tuple[str, str]:
    """(folder name, readable name) of this CPU's family: ratios differ between families."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown", "unknown CPU"
    fields: dict[str, str] = {}
    for line in info.splitlines():
        if ":" in line:
            key, value = (part.strip() for part in line.split(":", 1))
            fields.setdefault(key, value)
    flags = set(fields.get("flags", "").split())
    vendor = fields.get("vendor_id", "")
    family, model = int(fields.get("cpu family", "0")), int(fields.get("model", "0"))
    isa = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE")
    if vendor == "AuthenticAMD":
        zen = {23: "zen2", 25: "zen4" if 0x10 <= model <= 0x1F or model >= 0x60 else "zen3",
               26: "zen5"}.get(family, f"family{family}")
        return f"amd-epyc-{zen}", f"AMD EPYC, {zen.capitalize()} ({isa})"
    if vendor == "GenuineIntel":
        if "amx_bf16" in flags:
            return "intel-amx", "Intel, AVX-512 + AMX"
        return f"intel-{isa.lower()}", f"Intel ({isa})"
    return platform.machine() or "unknown", platform.machine() or "unknown CPU"


def load_average() -> str:
    """The 1-minute load average, as ``uptime`` prints it."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return NOT_RECORDED


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    """``--json PATH``: also write the run as a result file for render_performance.py."""
    family = cpu_family()[0]
    parser.add_argument(
        "--json", type=Path, default=None, metavar="PATH",
        help=f"also write the figures as benchmarks/results/{family}/<bench>.json for "
             "scripts/render_performance.py (the path to write)")


def write_result(path: Path, bench: str, title: str, what: str, columns: list[str],
                 rows: list[dict[str, Any]], load_before: str) -> None:
    """Write one benchmark's current table for this CPU.

    Args:
        path: the result file (``benchmarks/results/<cpu>/<bench>.json``).
        bench: the benchmark's name (``train`` for ``scripts/bench_train.py``).
        title: the table's heading.
        what: one line on the workload and how the figures are taken.
        columns: the table's columns, ``case`` first.
        rows: each ``{"values": {column: text}, "headline": {...}}`` (headline optional).
        load_before: the load average when the run started.
    """
    family, name = cpu_family()
    command = "python " + " ".join(
        [str(Path(sys.argv[0]).resolve().relative_to(REPO))
         if Path(sys.argv[0]).resolve().is_relative_to(REPO) else sys.argv[0]]
        + [arg for arg in sys.argv[1:]])
    stamp = {"command": command, "date": datetime.date.today().isoformat(),
             "cpu_model": cpu_model(), "load": f"{load_before} -> {load_average()}"}
    data = {"format": FORMAT, "bench": bench, "cpu": family, "cpu_name": name, "title": title,
            "what": what, "columns": columns, "rows": [{**row, **stamp} for row in rows]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)


# ---- rendering ---------------------------------------------------------------------------
def load_results(root: Path = RESULTS) -> list[dict[str, Any]]:
    """Every result file under ``root``, by benchmark then CPU family."""
    results = []
    for path in sorted(root.glob("*/*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            raise SystemExit(f"{path}: format {data.get('format')!r}, expected {FORMAT}")
        for key in ("bench", "cpu", "cpu_name", "title", "what", "columns", "rows"):
            if key not in data:
                raise SystemExit(f"{path}: no {key!r}")
        for row in data["rows"]:
            for key in ("values", "command", "date", "cpu_model", "load"):
                if key not in row:
                    raise SystemExit(f"{path}: a row has no {key!r}")
        data["path"] = str(path.relative_to(root.parent.parent)) if root == RESULTS else str(path)
        results.append(data)
    order = {name: i for i, name in enumerate(("train", "sharding", "dedup", "dense", "inference",
                                                    "planner"))}
    return sorted(results, key=lambda d: (order.get(d["bench"], 99), d["bench"], d["cpu"]))


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def bench_table(result: dict[str, Any]) -> list[str]:
    """One benchmark on one CPU family: its rows, each with command, date, CPU and load."""
    columns = list(result["columns"]) + ["command", "date", "CPU", "load"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in result["rows"]:
        cells = [row["values"].get(c, "") for c in result["columns"]]
        cells += [f"`{row['command']}`", row["date"], row["cpu_model"], row["load"]]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def headline(results: list[dict[str, Any]]) -> list[str]:
    """The headline ratios: one row per marked figure, one column per CPU family."""
    families: dict[str, str] = {}
    labels: list[str] = []
    cells: dict[tuple[str, str], str] = {}
    for result in results:
        for row in result["rows"]:
            mark = row.get("headline")
            if not mark:
                continue
            families.setdefault(result["cpu"], result["cpu_name"])
            if mark["label"] not in labels:
                labels.append(mark["label"])
            cells[(mark["label"], result["cpu"])] = row["values"][mark["column"]]
    cpus = sorted(families)
    lines = ["| ctrctl / reference, same run | " + " | ".join(families[c] for c in cpus) + " |",
             "|---|" + "---|" * len(cpus)]
    for label in labels:
        lines.append(f"| {label} | "
                     + " | ".join(_cell(cells.get((label, c), "no result")) for c in cpus)
                     + " |")
    return lines


def render_page(results: list[dict[str, Any]]) -> str:
    """docs/performance.md."""
    lines = [
        "<!-- rendered by scripts/render_performance.py from benchmarks/results/; "
        "edit the JSON, then run it -->", "", "# Performance", "",
        "The current figures, one table per benchmark and CPU family. Each is ctrctl against "
        "its reference (TorchRec 1.8.0, plain torch, scikit-learn) measured in the same run "
        "on the same machine; the ratio within one run is the figure to read, as absolute "
        "rates move with the machine and its load. Every row names the command that "
        "reproduces it, the date, the CPU model and the load average (start -> end of the "
        "run). Fields the original notes did not record say so.", "",
        "How a figure is measured and how to add one: [contributing](contributing.md#benchmarks). "
        "The history of what each change bought, run by run: the "
        "[benchmark log](benchmark-log.md).", "", "## Headline", ""]
    lines += headline(results)
    current = None
    for result in results:
        if result["title"] != current:
            current = result["title"]
            lines += ["", f"## {result['title']}"]
        lines += ["", f"### {result['cpu_name']}", "", result["what"], ""]
        lines += bench_table(result)
        origins = list(dict.fromkeys(row["source"] for row in result["rows"] if row.get("source")))
        lines += ["", f"Source: `{result['path']}`" + (
            f"; first recorded in {'; '.join(origins)}." if origins else ".")]
    return "\n".join(lines) + "\n"


def render_readme(readme: str, results: list[dict[str, Any]]) -> str:
    """README.md with the headline table between its markers replaced."""
    if START not in readme or END not in readme:
        raise SystemExit(f"README.md has no {START} ... {END} markers")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + START + "\n" + "\n".join(headline(results)) + "\n" + END + tail


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/performance.md or README.md is out of date")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = load_results()
    wanted = {PAGE: render_page(results),
              README: render_readme(README.read_text(encoding="utf-8"), results)}
    stale = [path for path, text in wanted.items()
             if not path.is_file() or path.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO)} is out of date: run "
                  "python scripts/render_performance.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path], encoding="utf-8")
    print(f"{len(results)} result files; rewrote {[str(p.relative_to(REPO)) for p in stale]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
