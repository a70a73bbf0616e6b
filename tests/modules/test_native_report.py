"""The native tier's report: what was built, which loops run, what ``kernel="auto"`` picks."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch

from ctrctl.errors import ConfigError
from ctrctl.modules import native
from ctrctl.modules.interaction import DotInteraction, native_interaction_available
from ctrctl.modules.mlp import MLP


def test_report_names_every_kernel_and_its_choice(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ctrctl.modules.native"):
        found = native.log_report()
    assert [k.role for k in found.kernels] == ["embedding", "interaction", "dense"]
    assert str(found) in caplog.text
    for kernel in found.kernels:
        assert (kernel.isa is not None) == kernel.built
        if not kernel.built:
            assert kernel.auto != "native"
    tags = found.as_tags()
    assert tags["ctrctl.native.cpu"] == native.cpu_model()
    assert set(tags) == {"ctrctl.native.cpu", *(f"ctrctl.native.{k.role}"
                                                for k in found.kernels)}


def test_one_kernel_word_and_type() -> None:
    assert native.KERNELS == ("auto", "native", "torch")
    for kernel in native.KERNELS:
        if kernel == "native" and not native_interaction_available():
            continue
        MLP(4, [8], kernel=kernel)  # type: ignore[arg-type]
        DotInteraction(3, kernel=kernel)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown interaction kernel"):
        DotInteraction(3, kernel="fast")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown dense kernel"):
        MLP(4, [8], kernel="fast")  # type: ignore[arg-type]


@pytest.mark.skipif(not native_interaction_available(), reason="the C kernel was not built")
def test_native_interaction_matches_torch() -> None:
    dense, sparse = torch.randn(5, 8), torch.randn(5, 3, 8)
    ours = DotInteraction(3, kernel="native")(dense, sparse)
    theirs = DotInteraction(3, kernel="torch")(dense, sparse)
    torch.testing.assert_close(ours, theirs)


def test_without_the_extensions_the_report_says_so_and_native_is_refused() -> None:
    script = textwrap.dedent(
        """
        import sys
        for name in ("_embedding_kernel", "_interaction_kernel", "_dense_kernel"):
            sys.modules["ctrctl.modules.native." + name] = None   # as if not built
        from ctrctl.errors import ConfigError
        from ctrctl.modules import native
        from ctrctl.modules.interaction import DotInteraction
        found = native.report()
        assert not any(k.built for k in found.kernels), found
        assert {k.role: k.auto for k in found.kernels}["interaction"] == "torch"
        assert {k.role: k.auto for k in found.kernels}["dense"] == "torch"
        try:
            DotInteraction(3, kernel="native")
        except ConfigError as exc:
            assert "not built" in str(exc)
        else:
            raise AssertionError("kernel='native' accepted without the C kernel")
        print(found)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "interaction not built auto->torch" in done.stdout
