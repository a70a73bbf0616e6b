"""Error text that is not ours (paths, user values, a worker's exception) prints as text.

rich reads ``[...]`` as markup: gloo's ``[/__w/pytorch/.../pair.cc:537]`` was a MarkupError
traceback instead of the rank's error, a path ``[/x].tsv`` crashed the error printer, and a
hint's ``[train=PATH]`` vanished.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from ctrctl.cli import app as cli_app
from ctrctl.cli.app import main
from ctrctl.errors import DistributedError

ROOT = Path(__file__).resolve().parents[2]
GLOO = ("rank 1 failed: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
        "Connection closed by peer [127.0.0.1]:29500")


def _error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "MarkupError" not in err, err
    return lines[0]


@pytest.mark.parametrize("name", ["[/x].tsv", "[red]logs.tsv", "[bold]a[/bold].tsv"])
def test_a_path_with_brackets_is_printed_as_given(name: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["preprocess", "--schema", str(ROOT / "schemas" / "criteo.yaml"),
                 "--input", f"train={tmp_path / name}", "--out", str(tmp_path / "o"),
                 "--no-track"])
    assert code == 1
    line = _error_line(capsys.readouterr().err)
    assert f"{tmp_path / name}: input file not found" in line
    assert not (tmp_path / "o").exists()


def test_a_rank_error_with_gloo_text_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def failing() -> None:
        raise DistributedError(GLOO, hint="see the [rank 1] log above")

    probe = typer.Typer()
    probe.command("probe")(failing)
    probe.command("other")(failing)  # two commands: typer keeps the subcommand name
    monkeypatch.setattr(cli_app, "app", probe)
    assert main(["probe"]) == 1
    line = _error_line(capsys.readouterr().err)
    assert line == f"error: {GLOO} (see the [rank 1] log above)"


def test_a_config_hint_keeps_its_brackets(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-folder").mkdir()
    config = tmp_path / "pipeline.yaml"
    config.write_text("name: p\ndata:\n  schema_path: " + str(ROOT / "schemas" / "criteo.yaml")
                      + f"\n  inputs: [train={tmp_path / 'a-folder'}]\n")
    code = main(["run", str(config), "--workdir", str(tmp_path / "wd"), "--plain"])
    assert code == 1
    line = _error_line(capsys.readouterr().err)
    assert "is not a file" in line and "(e.g. data.inputs=[train=PATH])" in line


def test_a_progress_description_is_text() -> None:
    from rich.console import Console

    from ctrctl.cli.common import RichProgress

    bar = RichProgress(embedded=True)
    bar.start("eval [/x]", total=10)  # a split named by a user
    bar.advance(1)
    screen = Console(record=True, width=100)
    screen.print(bar.renderable)
    bar.finish()
    assert screen.export_text().startswith("eval [/x] ")
