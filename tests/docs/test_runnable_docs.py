"""Every shell block in README.md and docs/ is marked, and the runnable ones still work.

Each page with runnable blocks runs in its own temporary folder on the small data its setup
block makes (``ctrctl synth``); a command that fails, or an option that is gone, fails the
page's test. See ``doc_blocks`` for the markers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.doc_blocks import KINDS, REPO, all_blocks, documented_pages, run_page, shell_blocks

BLOCKS = all_blocks()
RUNNABLE_PAGES = sorted({b.page for b in BLOCKS if b.kind == "run"})
SLOW_PAGES = sorted({b.page for b in BLOCKS if b.kind == "slow"})


def test_every_shell_block_is_marked() -> None:
    unmarked = [b.where for b in BLOCKS if b.kind not in KINDS]
    assert not unmarked, ("shell blocks without a `<!-- docs-test: setup|run|skip REASON -->` "
                          f"marker on the line before: {unmarked}")


def test_skipped_blocks_give_a_reason() -> None:
    skipped = [b for b in BLOCKS if b.kind == "skip"]
    print("\nshell blocks not run by the docs test:")
    for block in skipped:
        print(f"  {block.where}: {block.reason}")
    print("shell blocks run only by the slow docs test (make test-slow):")
    for block in (b for b in BLOCKS if b.kind == "slow"):
        print(f"  {block.where}")
    assert all(b.reason for b in skipped), [b.where for b in skipped if not b.reason]


def test_the_readme_tour_is_runnable() -> None:
    # the front page's tour is the path a new user copies: it must stay under test
    readme = [b for b in BLOCKS if b.page == "README.md"]
    assert [b.kind for b in readme].count("setup") == 1
    assert sum(b.kind == "run" for b in readme) >= 5
    assert "README.md" in RUNNABLE_PAGES


def test_generated_pages_are_not_collected() -> None:
    pages = {str(p.relative_to(REPO)) for p in documented_pages()}
    assert "README.md" in pages and "docs/getting-started.md" in pages
    assert not any(p.startswith("docs/reference/pipeline-yaml") for p in pages)
    assert "docs/performance.md" not in pages


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_runnable_blocks_run(page: str, tmp_path: Path) -> None:
    blocks = shell_blocks((REPO / page).read_text(encoding="utf-8"), page)
    ran = run_page(blocks, tmp_path)
    assert ran and all(b.kind in ("setup", "run") for b in ran)


@pytest.mark.slow
@pytest.mark.parametrize("page", SLOW_PAGES)
def test_slow_blocks_run(page: str, tmp_path: Path) -> None:
    blocks = shell_blocks((REPO / page).read_text(encoding="utf-8"), page)
    ran = run_page(blocks, tmp_path, slow=True)
    assert any(b.kind == "slow" for b in ran)
