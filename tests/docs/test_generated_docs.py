"""The command pages and the YAML reference are generated from the code, whole."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import typer.main

from ctrctl.cli.app import app
from ctrctl.config import PipelineConfig
from tests.docs.doc_blocks import REPO


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_every_command_and_option_has_its_page(tmp_path: Path) -> None:
    generator = _script("gen_cli_docs")
    pages = generator.render(tmp_path)
    group = typer.main.get_command(app)
    index = pages[tmp_path / "index.md"]
    for name, command in group.commands.items():
        page = pages[tmp_path / generator.page_name(name)]
        assert f"({generator.page_name(name)})" in index
        commands = getattr(command, "commands", None) or {name: command}
        for sub in commands.values():
            for param in sub.params:
                for opt in param.opts if param.param_type_name == "option" else []:
                    assert f"{opt}" in page, (name, opt)


def test_prose_is_for_commands_that_exist() -> None:
    names = set(typer.main.get_command(app).commands)
    prose = {p.stem for p in (REPO / "docs" / "commands" / "prose").glob("*.md")}
    assert prose <= names, prose - names


def _keys(model: type, prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        annotation = field.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            keys += _keys(annotation, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def test_every_yaml_key_is_in_the_reference() -> None:
    text, _missing = _script("gen_config_docs").render()
    for key in _keys(PipelineConfig):
        assert f"| `{key}` |" in text, key
    assert "| `training.early_stopping.patience` | int (>= 1) | `3` |" in text


def test_section_keys_have_a_description() -> None:
    _text, missing = _script("gen_config_docs").render()
    # the top-level name/description are the only keys without one in the models' docstrings
    assert set(missing) <= {"name", "description"}, missing
