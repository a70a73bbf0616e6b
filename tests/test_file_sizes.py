"""Files stay small: no source file under ``ctrctl/`` passes 600 lines (split by role first)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "ctrctl"
#: The limit of STYLE's "Files stay small".
MAX_LINES = 600
SOURCES = ("*.py", "*.c", "*.h")


def long_files(root: Path, limit: int = MAX_LINES) -> list[str]:
    """``path: N lines`` for every source file under ``root`` longer than ``limit``."""
    found = []
    for pattern in SOURCES:
        for path in sorted(root.rglob(pattern)):
            lines = len(path.read_text(errors="replace").splitlines())
            if lines > limit:
                found.append(f"{path.relative_to(root.parent)}: {lines} lines")
    return found


def test_no_source_file_passes_600_lines() -> None:
    assert len(list(ROOT.rglob("*.py"))) > 100  # the walk found the library
    assert long_files(ROOT) == []


def test_the_check_sees_a_long_file(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "short.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_files(tmp_path / "pkg") == [f"pkg/long.py: {MAX_LINES + 1} lines"]
