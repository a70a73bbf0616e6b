"""Training sizes chosen from the data: batch size, epochs and validation cadence.

A pipeline YAML may leave ``training.batch_size``, ``epochs`` and ``val_every`` at ``null``;
:func:`resolve_sizes` fills them in from the training split's row count (small data: small
batches and several epochs; large data: large batches, one epoch).

Example:
    >>> resolve_sizes(TrainingConfig(), 7200).batch_size
    64
"""

from __future__ import annotations

from dataclasses import dataclass

from ctrctl.config import TrainingConfig

__all__ = ["AUTO_BATCH_ROWS", "FEW_STEPS", "ResolvedSizes", "auto_batch_size",
           "resolve_sizes"]

#: Automatic batch sizes: about one batch per this many training rows, as a power of two
#: between the bounds below (7,200 rows -> 64, 60k -> 512, 1M and more -> 4,096).
AUTO_BATCH_ROWS = 100
AUTO_BATCH_MIN, AUTO_BATCH_MAX = 64, 4096
#: Automatic epochs: enough passes for about this many steps (early stopping usually ends
#: the run sooner), at most AUTO_MAX_EPOCHS; a 10M-row split gets one epoch.
AUTO_TARGET_STEPS = 2000
AUTO_MAX_EPOCHS = 20
#: Automatic validation: four times an epoch but no more often than every AUTO_VAL_STEPS
#: steps (so once an epoch for short epochs), and at least AUTO_MIN_VALIDATIONS times a run.
AUTO_VAL_PER_EPOCH = 4
AUTO_VAL_STEPS = 25
AUTO_MIN_VALIDATIONS = 4
#: A run of fewer steps than this gets a warning: the model has barely moved.
FEW_STEPS = 50


@dataclass(frozen=True)
class ResolvedSizes:
    """The training sizes in use, after those left at ``null`` were chosen from the data.

    Attributes:
        rows: training rows per epoch (all ranks together).
        batch_size, epochs, val_every: as :class:`TrainingConfig`, resolved.
        max_steps: the explicit step cap, or None.
        steps_per_epoch, total_steps: steps per epoch and the cap on steps in all.
        chosen: the keys that were chosen from the data (not set in the config).
    """

    rows: int
    batch_size: int
    epochs: int
    max_steps: int | None
    val_every: int
    steps_per_epoch: int
    total_steps: int
    chosen: tuple[str, ...]

    def describe(self) -> str:
        """One line for the log: every size, and which were chosen from the data."""
        auto = f" (from {self.rows:,} rows: {', '.join(self.chosen)})" if self.chosen else ""
        cap = f"max_steps {self.max_steps}" if self.max_steps else f"epochs {self.epochs}"
        return (f"batch_size {self.batch_size}, {cap}, {self.steps_per_epoch} steps per "
                f"epoch, at most {self.total_steps} steps, val_every {self.val_every}{auto}")


def auto_batch_size(rows: int, world_size: int = 1) -> int:
    """The batch size chosen for ``rows`` training rows: see :data:`AUTO_BATCH_ROWS`."""
    target = max(rows // AUTO_BATCH_ROWS, 1)
    batch = 1 << max(target.bit_length() - 1, 0)  # the power of two at or below
    batch = min(max(batch, AUTO_BATCH_MIN), AUTO_BATCH_MAX)
    return -(-batch // world_size) * world_size  # a multiple of the world size


def resolve_sizes(training: TrainingConfig, rows: int, world_size: int = 1,
                  drop_last: bool | None = None) -> ResolvedSizes:
    """Batch size, epochs and validation cadence for a training split of ``rows`` rows.

    Keys set in ``training`` are kept; those left at ``null`` follow from ``rows`` (small
    data: small batches and several epochs; large data: large batches, one epoch).

    Example:
        >>> resolve_sizes(TrainingConfig(), 7200).batch_size
        64
    """
    chosen = []
    batch = training.batch_size
    if batch is None:
        batch = auto_batch_size(rows, world_size)
        chosen.append("batch_size")
    drop = training.drop_last if drop_last is None else drop_last
    per_epoch = (rows // batch) if drop else -(-rows // batch)
    per_epoch = max(per_epoch, 1)
    epochs = training.epochs
    if epochs is None:
        epochs = min(max(-(-AUTO_TARGET_STEPS // per_epoch), 1), AUTO_MAX_EPOCHS)
        if training.max_steps is None:
            chosen.append("epochs")
    total = training.max_steps or epochs * per_epoch
    val_every = training.val_every
    if val_every is None:
        often = max(AUTO_VAL_STEPS, per_epoch // AUTO_VAL_PER_EPOCH)
        val_every = max(1, min(per_epoch, total // AUTO_MIN_VALIDATIONS, often))
        chosen.append("val_every")
    return ResolvedSizes(rows=rows, batch_size=batch, epochs=epochs,
                         max_steps=training.max_steps, val_every=val_every,
                         steps_per_epoch=per_epoch, total_steps=total, chosen=tuple(chosen))
