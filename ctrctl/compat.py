"""torch / fbgemm_gpu pairing, and the fallback when fbgemm_gpu is absent.

fbgemm_gpu wheels declare no torch requirement, so a mismatched pair installs cleanly and
fails at import with undefined symbols. :func:`fbgemm_available` imports fbgemm_gpu once,
checks the pair and says which versions are expected. Without fbgemm_gpu (macOS, Windows,
a machine where only torch is installed) ctrctl warns once and uses its plain-torch kernels;
then any torch version is accepted.

Example:
    >>> from ctrctl.compat import fbgemm_available
    >>> if fbgemm_available(): ...
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
import warnings

from ctrctl.errors import EnvironmentMismatchError

logger = logging.getLogger(__name__)

#: fbgemm-gpu release -> the torch minor it is built for.
PAIRS: dict[str, str] = {"1.8": "2.13"}
EXPECTED_TORCH = "2.13.0"
EXPECTED_FBGEMM = "1.8.0"


def ctrctl_version() -> str:
    """ctrctl's version from the installed package's metadata ("0+unknown" in a bare tree)."""
    try:
        return importlib.metadata.version("ctrctl")
    except importlib.metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
        return "0+unknown"


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def versions() -> dict[str, str | None]:
    """The installed torch and fbgemm_gpu versions (None where fbgemm_gpu is absent)."""
    import torch

    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return {"torch": torch.__version__, "fbgemm_gpu": None}
    fbgemm_version = None
    for dist in ("fbgemm-gpu-cpu", "fbgemm-gpu", "fbgemm-gpu-nightly-cpu"):
        try:
            fbgemm_version = version(dist)
            break
        except PackageNotFoundError:
            continue
    return {"torch": torch.__version__, "fbgemm_gpu": fbgemm_version}


def check_versions(strict: bool = False) -> bool:
    """Check that the installed torch and fbgemm_gpu pair.

    Args:
        strict: raise :class:`EnvironmentMismatchError` on a mismatch instead of warning.

    Returns:
        True when fbgemm_gpu is installed, pairs with torch and imports.
    """
    found = versions()
    torch_version, fbgemm_version = found["torch"], found["fbgemm_gpu"]
    if fbgemm_version is None:
        return False
    wanted_torch = PAIRS.get(_minor(fbgemm_version))
    if wanted_torch is not None and _minor(str(torch_version)) != wanted_torch:
        message = (
            f"fbgemm_gpu {fbgemm_version} is built for torch {wanted_torch}.x but torch "
            f"{torch_version} is installed"
        )
        hint = f"install the pair torch=={EXPECTED_TORCH} and fbgemm-gpu(-cpu)=={EXPECTED_FBGEMM}"
        if strict:
            raise EnvironmentMismatchError(message, hint=hint)
        warnings.warn(f"{message}; {hint}; using the plain-torch kernels", stacklevel=2)
        return False
    try:
        importlib.import_module("fbgemm_gpu")
    except Exception as exc:  # undefined symbols surface as OSError/ImportError
        message = f"fbgemm_gpu {fbgemm_version} fails to import beside torch {torch_version}: {exc}"
        hint = f"install the pair torch=={EXPECTED_TORCH} and fbgemm-gpu(-cpu)=={EXPECTED_FBGEMM}"
        if strict:
            raise EnvironmentMismatchError(message, hint=hint) from exc
        warnings.warn(f"{message}; using the plain-torch kernels", stacklevel=2)
        return False
    return True


@functools.lru_cache(maxsize=1)
def fbgemm_available() -> bool:
    """Whether FBGEMM's kernels can be used; warns once when they cannot."""
    ok = check_versions(strict=False)
    if not ok and versions()["fbgemm_gpu"] is None:
        warnings.warn(
            "fbgemm_gpu is not installed: ctrctl uses its plain-torch embedding kernels "
            f"(install fbgemm-gpu-cpu=={EXPECTED_FBGEMM} for the fast path)",
            stacklevel=2,
        )
    return ok


#: /proc/cpuinfo flags of CPUs with bf16 matrix or dot-product units.
BF16_CPU_FLAGS: tuple[str, ...] = ("amx_bf16", "avx512_bf16")


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:  # not Linux
        pass
    return frozenset()


def bf16_autocast_supported(device: object = "cpu") -> bool:
    """Whether bf16 autocast pays on ``device``: any CUDA device; a CPU with AMX-BF16 or
    AVX512-BF16 (torch's oneDNN kernels use them). On other CPUs bf16 matmuls are
    emulated and slower than fp32."""
    import torch

    kind = torch.device(device).type if isinstance(device, str | torch.device) else "cpu"
    if kind == "cuda":
        return True
    if kind != "cpu":
        return False
    flags = _cpu_flags()
    if flags:
        return any(flag in flags for flag in BF16_CPU_FLAGS)
    # No /proc/cpuinfo: ask oneDNN through torch (its bf16 check is the same hardware test).
    mkldnn = getattr(torch.backends, "mkldnn", None)
    checker = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    if mkldnn is not None and mkldnn.is_available() and checker is not None:
        try:
            return bool(checker())
        except RuntimeError:
            return False
    return False
