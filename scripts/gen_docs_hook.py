"""MkDocs hook: regenerate the command pages and the YAML reference before every build.

Named in ``mkdocs.yml`` (``hooks:``), so ``mkdocs build --strict`` and ``mkdocs serve`` never
run without the generated pages, whoever calls them. The generators write only pages whose
text changed, so ``mkdocs serve`` does not rebuild in a loop.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent


def _load(name: str) -> Any:
    """A generator script as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_pre_build(config: Any) -> None:
    """Write docs/commands/*.md and docs/reference/pipeline-yaml.md from the code."""
    docs = Path(config["docs_dir"])
    _load("gen_cli_docs").main(["--out", str(docs / "commands")])
    _load("gen_config_docs").main(["--out", str(docs / "reference" / "pipeline-yaml.md")])
