"""The docs runner itself: markers are read, and a renamed option in a doc block fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.doc_blocks import BlockFailed, run_page, shell_blocks

PAGE = """# A page

<!-- docs-test: setup -->
```bash
mkdir -p out
```

Show the resolved config:

<!-- docs-test: run -->
```bash
ctrctl config show --config pipelines/default.yaml training.batch_size=64 > out/config.yaml
```

<!-- docs-test: skip needs the Criteo 1TB logs -->
```bash
ctrctl preprocess --schema schemas/criteo_1tb.yaml --input day_0.gz --out dataset
```

```text
not a shell block
```
"""


def test_markers_are_read() -> None:
    blocks = shell_blocks(PAGE, "page.md")
    assert [(b.kind, b.line) for b in blocks] == [("setup", 4), ("run", 11), ("skip", 16)]
    assert blocks[2].reason == "needs the Criteo 1TB logs"
    assert blocks[1].code.startswith("ctrctl config show")


def test_an_unmarked_block_has_no_kind() -> None:
    (block,) = shell_blocks("```bash\nctrctl --version\n```\n", "page.md")
    assert block.kind is None


def test_a_page_runs_in_order(tmp_path: Path) -> None:
    ran = run_page(shell_blocks(PAGE, "page.md"), tmp_path)
    assert [b.kind for b in ran] == ["setup", "run"]
    assert "batch_size: 64" in (tmp_path / "out" / "config.yaml").read_text()


def test_a_renamed_option_fails_the_page(tmp_path: Path) -> None:
    renamed = PAGE.replace("config show --config", "config show --config-file")
    with pytest.raises(BlockFailed, match=r"page.md:11: exit code 2") as failed:
        run_page(shell_blocks(renamed, "page.md"), tmp_path)
    assert "--config-file" in str(failed.value)
