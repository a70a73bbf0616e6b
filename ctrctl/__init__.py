"""ctrctl: click-through-rate pipelines from raw logs to a sharded, quantized model.

The Python API mirrors the CLI; each command is a thin wrapper over a function here.
Importing ctrctl has no side effects: nothing touches torch.distributed, MLflow or the disk.
"""

from __future__ import annotations

from ctrctl.errors import CtrctlError

__version__ = "0.1.0"

__all__ = ["CtrctlError", "__version__"]
