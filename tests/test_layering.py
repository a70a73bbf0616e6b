"""The import graph of ``ctrctl/``: no package cycles, and every import allowed by the layering.

Every module is parsed with ``ast`` (nothing is imported), and every ``ctrctl`` import is
resolved to the module it names: module-level and function-level imports, relative imports,
``from ctrctl import checkpoint`` (the submodule, not the package), ``importlib.import_module``
with a literal name, and the lazy re-exports of ``ctrctl/__init__.py`` (``_EXPORTS``). The
modules are grouped into packages (``ctrctl.data.*`` -> ``data``; the planner is its own
package, ``distributed.planner``, because it is held to a stricter rule than the rest of
``distributed``), and the package graph must be acyclic and inside :data:`ALLOWED`.

The Layout section of docs/architecture.md states the same table.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "ctrctl"

#: The layers, low to high; a package may import what its layer and the layers below allow.
_L1 = {"errors", "compat", "names", "io", "progress"}
_L2 = _L1 | {"config", "sparse", "metrics"}
_L3 = _L2 | {"tracking", "data", "modules", "checkpoint"}
_L4 = _L3 | {"distributed", "distributed.planner"}
_L5 = _L4 | {"models"}
_LIBRARY = _L5 | {"planning", "training", "inference", "evaluation"}

#: package -> the packages it may import (besides itself). A package missing here fails the
#: test: a new package takes its place in this table and in the Layout section of docs/architecture.md.
ALLOWED: dict[str, frozenset[str]] = {
    name: frozenset(allowed)
    for name, allowed in {
        "errors": set(),
        "names": set(),
        "progress": set(),
        "compat": {"errors"},
        "io": {"errors"},
        "config": {"errors", "names", "io"},
        "sparse": {"errors", "compat"},
        "metrics": {"errors"},
        "tracking": {"errors", "io"},
        "data": {"errors", "compat", "io", "progress", "config", "sparse", "metrics",
                 "tracking"},
        # Modules know no data format and no config: tensors and their own configs only.
        "modules": {"errors", "compat", "names", "sparse"},
        "checkpoint": {"errors", "compat", "names", "io"},
        "distributed": _L3 - {"distributed"},
        # The planner is pure: plans from tables and a topology, no processes, no tracking,
        # no modules; from the rest of distributed it reads the plan types only.
        "distributed.planner": {"errors", "names", "io", "config", "data", "distributed"},
        # The plan step around the planner: tables from files, plan.json, tracking, and
        # calibration (which measures sharded modules on real processes).
        "planning": _L4 | {"training"},  # the batch size training will choose
        # Training validates with ``metrics``, never with ``evaluation``.
        # The model a pipeline config describes (built, its state, loaded for scoring):
        # what training, evaluation and quantization share.
        "models": _L4,
        "training": _L5,
        # Serving needs nothing from the training loop.
        "inference": _L5,
        "evaluation": _L5 | {"training", "inference"},
        # Two-tower retrieval: index, full-ranking evaluation, baselines, synthetic logs.
        "retrieval": _L5 | {"training", "inference"},
        # The search runs training in process (or through its launcher), never eval.
        "tuning": _L5 | {"training"},
        # The runner calls every step's library in process; only the CLI imports it.
        "runner": _LIBRARY | {"retrieval", "tuning"},
        # The online ranker: the artifact's loader and the raw-log reader (load tests).
        "serving": _L4 | {"inference"},
        # Drift and calibration of a model on new or served rows (reads serving's registry
        # source and the export's encoder).
        "monitoring": _LIBRARY | {"serving"},
        "cli": _LIBRARY | {"runner", "serving", "monitoring", "retrieval", "tuning"},
        "ctrctl": _LIBRARY | {"runner", "serving", "monitoring", "retrieval", "tuning"},  # the public API: lazy re-exports
        "__main__": {"cli"},
        "testing": _LIBRARY | {"tuning"},  # helpers for tests: nothing in the library imports them
    }.items()
}

#: Modules the planner may use from the rest of ``distributed``, and what it may not import.
PLANNER_FROM_DISTRIBUTED = {"ctrctl.distributed.types"}
PLANNER_FORBIDDEN_EXTERNAL = ("torch.distributed", "torch.multiprocessing", "multiprocessing",
                              "subprocess", "mlflow")


@dataclass(frozen=True)
class Edge:
    """One import: ``source`` (a module) imports ``target`` (a module), at ``line``."""

    source: str
    target: str
    line: int


def module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under ``root`` (the package)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(module: str, path: Path, modules: dict[str, Path],
               package: str) -> tuple[list[Edge], list[str], list[tuple[str, int]]]:
    """``module``'s imports of ``package`` modules, its unknown ones, and all external ones."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    edges: list[Edge] = []
    unknown: list[str] = []
    external: list[tuple[str, int]] = []

    def add(name: str, line: int) -> None:
        if name != package and not name.startswith(package + "."):
            external.append((name, line))
            return
        if name not in modules:
            unknown.append(f"{module}:{line} imports {name}, which does not exist")
        elif name != module:
            edges.append(Edge(module, name, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            for alias in node.names:
                sub = f"{name}.{alias.name}"
                add(sub if sub in modules else name, node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            add(node.args[0].value, node.lineno)
        elif (isinstance(node, ast.AnnAssign | ast.Assign) and module == package
              and isinstance(node.value, ast.Dict)
              and any(isinstance(t, ast.Name) and t.id == "_EXPORTS"
                      for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
            for value in node.value.values:  # the lazy re-exports: name -> module
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    add(value.value, value.lineno)
    return edges, unknown, external


def package_of(module: str) -> str:
    """The layering package of a module: ``ctrctl.data.schema`` -> ``data``."""
    parts = module.split(".")[1:]
    if not parts:
        return "ctrctl"
    if parts[:2] == ["distributed", "planner"]:
        return "distributed.planner"
    return parts[0]


@dataclass
class Graph:
    modules: dict[str, Path]
    edges: list[Edge]
    unknown: list[str]
    external: dict[str, list[tuple[str, int]]]

    def packages(self) -> dict[str, set[str]]:
        """Package -> the packages it imports (self-imports dropped)."""
        graph: dict[str, set[str]] = {package_of(m): set() for m in self.modules}
        for e in self.edges:
            a, b = package_of(e.source), package_of(e.target)
            if a != b:
                graph[a].add(b)
        return graph


def build_graph(root: Path) -> Graph:
    modules = module_names(root)
    edges: list[Edge] = []
    unknown: list[str] = []
    external: dict[str, list[tuple[str, int]]] = {}
    for module, path in modules.items():
        found, missing, outside = imports_of(module, path, modules, root.name)
        edges += found
        unknown += missing
        external[module] = outside
    return Graph(modules, edges, unknown, external)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def violations(edges: list[Edge], allowed: dict[str, frozenset[str]]) -> list[str]:
    """Each import whose package may not import the target's package, named with its line."""
    bad = []
    for e in edges:
        a, b = package_of(e.source), package_of(e.target)
        if a == b:
            continue
        if a not in allowed:
            bad.append(f"{e.source}: package {a!r} has no row in the allowed-imports table")
        elif b not in allowed[a]:
            bad.append(f"{e.source}:{e.line} imports {e.target}: {a!r} may not import {b!r}")
    return sorted(set(bad))


@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph(ROOT)


def test_the_graph_is_real(graph: Graph) -> None:
    """Guards against a vacuous pass: the walk found the library and its imports."""
    assert len(graph.modules) > 100
    assert len(graph.edges) > 300
    packages = graph.packages()
    assert sum(len(v) for v in packages.values()) > 60
    # Known edges, module-level and function-level, are seen.
    pairs = {(e.source, e.target) for e in graph.edges}
    assert ("ctrctl.distributed.checkpoint", "ctrctl.checkpoint") in pairs
    assert ("ctrctl.training.validation", "ctrctl.metrics.streaming") in pairs  # in a function
    assert ("ctrctl", "ctrctl.training.loop") in pairs  # a lazy re-export of the API
    assert graph.unknown == []


def test_every_package_has_a_row_and_the_table_is_a_dag(graph: Graph) -> None:
    assert set(graph.packages()) <= set(ALLOWED), "add the new package to ALLOWED and docs/architecture.md"
    for package, allowed in ALLOWED.items():
        assert allowed <= set(ALLOWED), f"{package} allows unknown {sorted(allowed - set(ALLOWED))}"
    assert find_cycles({k: set(v) for k, v in ALLOWED.items()}) == []


def test_no_package_cycles(graph: Graph) -> None:
    assert find_cycles(graph.packages()) == []


def test_every_import_is_allowed(graph: Graph) -> None:
    assert violations(graph.edges, ALLOWED) == []


def test_inference_imports_nothing_from_training(graph: Graph) -> None:
    """Serving (quantize, export, predict from an artifact) does not depend on the training
    loop: the model it starts from comes from :mod:`ctrctl.models`."""
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in graph.edges
           if package_of(e.source) == "inference" and package_of(e.target) == "training"]
    assert bad == []
    assert "training" not in ALLOWED["inference"]
    assert ("ctrctl.inference.quantize", "ctrctl.models.scoring") in {
        (e.source, e.target) for e in graph.edges}


def test_no_library_module_imports_testing_or_cli(graph: Graph) -> None:
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in graph.edges
           if package_of(e.target) in ("testing", "cli")
           and package_of(e.source) not in ("testing", "cli", "__main__")]
    assert bad == []


def test_the_planner_is_pure(graph: Graph) -> None:
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in graph.edges
           if package_of(e.source) == "distributed.planner"
           and package_of(e.target) == "distributed"
           and e.target not in PLANNER_FROM_DISTRIBUTED]
    for module, names in graph.external.items():
        if package_of(module) == "distributed.planner":
            bad += [f"{module}:{line} imports {name}" for name, line in names
                    if any(name == f or name.startswith(f + ".")
                           for f in PLANNER_FORBIDDEN_EXTERNAL)]
    assert bad == []


def readme_table(text: str) -> dict[str, frozenset[str]]:
    """The allowed-imports table of the Layout section of docs/architecture.md, as :data:`ALLOWED`."""
    start = text.index("| package | may import |")
    table: dict[str, frozenset[str]] = {}
    for row in text[start:].split("\n\n", 1)[0].splitlines()[2:]:
        packages, allowed = (cell.strip() for cell in row.strip("|").split("|"))
        names = frozenset(re.findall(r"`([^`]+)`", allowed))
        for package in re.findall(r"`([^`]+)`", packages):
            table[package] = names
    return table


def test_the_readme_states_the_same_table() -> None:
    readme = (ROOT.parent / "docs" / "architecture.md").read_text()
    assert readme_table(readme) == ALLOWED
    # the parser reads a changed row as changed
    assert readme_table(readme.replace("| `config` | `errors`, `names`, `io` |",
                                       "| `config` | `errors`, `names`, `data` |")) != ALLOWED


# ---- the checker itself flags what it should ------------------------------------------------
def _write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "ctrctl" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "ctrctl"


def test_a_bad_synthetic_graph_is_flagged(tmp_path: Path) -> None:
    root = _write_package(tmp_path, {
        "__init__.py": '_EXPORTS = {"train": "ctrctl.training.loop"}\n',
        "errors.py": "",
        "config.py": "from ctrctl.errors import X\n",
        "data/__init__.py": "",
        # relative import, up one level
        "data/manifest.py": "from ..config import Y\n",
        "training/__init__.py": "",
        # an import inside a function counts
        "training/loop.py": "def f():\n    from ctrctl.evaluation import metrics\n",
        "evaluation/__init__.py": "",
        "evaluation/metrics.py": "import ctrctl.training.loop\n",
        "modules/__init__.py": "",
        "modules/dlrm.py": "from ctrctl.data import manifest\nimport ctrctl.nowhere\n",
        "distributed/__init__.py": "",
        "distributed/planner/__init__.py": "",
        "distributed/planner/calibration.py": (
            "import importlib\nimport torch.distributed as dist\n"
            "def f():\n    return importlib.import_module('ctrctl.testing.multiprocess')\n"),
        "testing/__init__.py": "",
        "testing/multiprocess.py": "",
    })
    g = build_graph(root)
    pairs = {(e.source, e.target) for e in g.edges}
    assert ("ctrctl.data.manifest", "ctrctl.config") in pairs
    assert ("ctrctl.training.loop", "ctrctl.evaluation.metrics") in pairs
    assert ("ctrctl", "ctrctl.training.loop") in pairs
    assert ("ctrctl.distributed.planner.calibration", "ctrctl.testing.multiprocess") in pairs
    assert g.unknown == ["ctrctl.modules.dlrm:2 imports ctrctl.nowhere, which does not exist"]
    assert find_cycles(g.packages()) == [["evaluation", "training"]]
    bad = violations(g.edges, ALLOWED)
    assert any("'training' may not import 'evaluation'" in b for b in bad)
    assert any("'modules' may not import 'data'" in b for b in bad)
    assert any("'distributed.planner' may not import 'testing'" in b for b in bad)
    assert not any("'data' may not import 'config'" in b for b in bad)  # allowed
    assert ("torch.distributed", 2) in g.external["ctrctl.distributed.planner.calibration"]
    # a package the table does not know is flagged too
    assert violations([Edge("ctrctl.scheduler", "ctrctl.errors", 1)], ALLOWED) == [
        "ctrctl.scheduler: package 'scheduler' has no row in the allowed-imports table"]


def test_find_cycles_sees_a_long_cycle_and_not_a_dag() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []

