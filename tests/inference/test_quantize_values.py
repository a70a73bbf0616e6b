"""``quantize --device-memory-gb 0`` is refused: 0 was read as "no limit" without a word."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.cli.app import main
from ctrctl.errors import ConfigError
from ctrctl.inference.quantize import QuantizeConfig


@pytest.mark.parametrize("gib", ["0", "-1", "0.0000000001"])
def test_no_memory_per_shard_is_refused(gib: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["quantize", "--checkpoint", str(tmp_path / "run"), "--out",
                 str(tmp_path / "export"), "--device-memory-gb", gib, "--no-track"])
    assert code == 1
    err = capsys.readouterr().err
    assert "--device-memory-gb must be more than 0" in err and "Traceback" not in err
    assert not (tmp_path / "export").exists()


def test_the_library_refuses_it_too() -> None:
    with pytest.raises(ConfigError, match="more than 0"):
        QuantizeConfig(device_memory_bytes=0)
    assert QuantizeConfig(device_memory_bytes=None).device_memory_bytes is None
