"""The schemas ship with the package: ``schemas/NAME.yaml`` works from any folder."""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest

from ctrctl.data.schema import load_schema, resolve_schema_path
from ctrctl.errors import SchemaError

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = sorted(p.name for p in (ROOT / "schemas").glob("*.yaml"))


def test_package_data_holds_every_schema_of_the_one_folder() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["ctrctl"]
    package = ROOT / "ctrctl"
    shipped = sorted(str(p.relative_to(package)) for p in package.glob("schemas/*.yaml")
                     if any(fnmatch.fnmatch(str(p.relative_to(package)), pat)
                            for pat in patterns))
    assert SCHEMAS and shipped == [f"schemas/{name}" for name in SCHEMAS]
    # one source of truth: the package's folder is the top-level one
    assert (package / "schemas").resolve() == (ROOT / "schemas").resolve()


@pytest.mark.parametrize("name", ["schemas/criteo.yaml", "avazu.yaml"])
def test_a_shipped_schema_resolves_from_any_folder(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   name: str) -> None:
    monkeypatch.chdir(tmp_path)
    schema = load_schema(name)
    assert schema.label in ("label", "click")
    assert resolve_schema_path(name).is_file()


def test_a_local_file_wins_and_an_unknown_name_is_still_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "schemas").mkdir()
    local = tmp_path / "schemas" / "criteo.yaml"
    local.write_text((ROOT / "schemas" / "frappe.yaml").read_text())
    assert resolve_schema_path("schemas/criteo.yaml") == Path("schemas/criteo.yaml")
    assert load_schema("schemas/criteo.yaml").name == load_schema(
        ROOT / "schemas" / "frappe.yaml").name
    with pytest.raises(SchemaError):
        load_schema("schemas/nosuch.yaml")
