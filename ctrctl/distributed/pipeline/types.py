"""What flows through a train pipeline: ``(tag, batch)`` items, one per step.

The batch is a loader's :class:`~ctrctl.data.batch.Batch` (dense, sparse KJT, labels); the
tag travels with it untouched and comes back in the step's output: the loader's position
when training (what a checkpoint saves), ``(keep, labels)`` when scoring a padded split.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from ctrctl.data.batch import Batch

__all__ = ["Batch", "Item", "Tag"]

#: Opaque to the pipelines: whatever the caller pairs with a batch.
Tag: TypeAlias = Any
#: One input of a pipeline.
Item: TypeAlias = tuple[Tag, Batch]
