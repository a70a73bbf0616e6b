"""The public Python API: every exported name resolves, and importing has no side effects."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import ctrctl


def test_every_exported_name_resolves() -> None:
    for name in ctrctl.__all__:
        assert getattr(ctrctl, name) is not None, name


def test_unknown_name_is_an_attribute_error() -> None:
    try:
        ctrctl.no_such_thing  # noqa: B018
    except AttributeError as exc:
        assert "no_such_thing" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")


def test_import_is_light_and_side_effect_free(tmp_path) -> None:
    code = (
        "import sys, ctrctl; "
        "heavy = [m for m in ('torch', 'mlflow', 'polars') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == ""
    assert list(tmp_path.iterdir()) == []



def test_version_comes_from_the_installed_metadata() -> None:
    # pyproject.toml is the one place the version is written (tomllib is 3.11+: a regex).
    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    written = re.search(r'^version = "([^"]+)"', text, re.M)
    assert written is not None
    assert ctrctl.__version__ == importlib.metadata.version("ctrctl") == written.group(1)
