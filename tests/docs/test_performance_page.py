"""docs/performance.md and the README's headline table are what benchmarks/results/ renders."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.docs.doc_blocks import REPO


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


render = _script("render_performance")


def test_committed_tables_match_the_json() -> None:
    assert render.main(["--check"]) == 0, "run: python scripts/render_performance.py"


def test_every_row_names_command_date_cpu_and_load() -> None:
    results = render.load_results()
    assert {r["bench"] for r in results} >= {"train", "sharding"}
    for result in results:
        for row in result["rows"]:
            # a script of scripts/ that reproduces the row (bench_*.py, tune_samples.py)
            script = row["command"].removeprefix("python ").split()[0]
            assert row["command"].startswith("python scripts/"), row["command"]
            assert (REPO / script).is_file(), script
            assert row["date"] and row["cpu_model"] and row["load"]


def test_the_readme_headline_is_the_marked_rows() -> None:
    results = render.load_results()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split(render.START)[1].split(render.END)[0]
    marked = [(row["headline"]["label"], row["values"][row["headline"]["column"]])
              for result in results for row in result["rows"] if row.get("headline")]
    assert marked
    for label, value in marked:
        line = next(line for line in table.splitlines() if line.startswith(f"| {label} |"))
        assert f" {value} |" in line


def test_a_changed_figure_changes_the_page(tmp_path: Path) -> None:
    root = tmp_path / "benchmarks" / "results"
    shutil.copytree(REPO / "benchmarks" / "results", root)
    path = next(root.glob("*/train.json"))
    data = json.loads(path.read_text())
    before = render.render_page(render.load_results(root))
    data["rows"][0]["values"]["ctrctl / TorchRec"] = "9.99x [9.98-9.99]"
    path.write_text(json.dumps(data))
    after = render.render_page(render.load_results(root))
    assert before != after and "9.99x [9.98-9.99]" in after


def test_a_row_without_its_load_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "results"
    (root / "some-cpu").mkdir(parents=True)
    data = json.loads(next((REPO / "benchmarks" / "results").glob("*/train.json")).read_text())
    del data["rows"][0]["load"]
    (root / "some-cpu" / "train.json").write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="load"):
        render.load_results(root)


def test_write_result_stamps_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(REPO / "scripts" / "bench_train.py"), "--quick"])
    path = tmp_path / "r" / "train.json"
    render.write_result(path, "train", "Training", "what", ["case", "x"],
                        [{"values": {"case": "1 thread", "x": "2.00x"}}], load_before="0.50")
    (row,) = json.loads(path.read_text())["rows"]
    assert row["command"] == "python scripts/bench_train.py --quick"
    assert row["load"].startswith("0.50 -> ") and row["date"] and row["cpu_model"]
    assert render.load_results(tmp_path)[0]["rows"][0]["values"]["x"] == "2.00x"
