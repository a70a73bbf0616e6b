"""What preprocess decides about splits and skipped rows, before and after streaming.

* :func:`carve_plan`: whether a validation split is drawn from the training rows (no ``val``
  input was given), so that training can stop early by default.
* :func:`check_skipped`: ``--on-bad-rows skip`` may not silently drop a whole class (libfm's
  -1/1 labels read as 0/1 drop every negative) or more than a stated share of an input.

Example:
    >>> carve_plan([InputSource(Path("train.tsv"), "train")], None, False, 0.1)
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctrctl.data.readers import InputSource
from ctrctl.data.transforms import BAD_REASONS
from ctrctl.errors import InputDataError

__all__ = ["carve_plan", "check_skipped"]


def carve_plan(sources: Sequence[InputSource], ratio: tuple[float, float, float] | None,
               split_by_day: bool, val_fraction: float) -> bool:
    """Whether a validation split is carved from train: no input names ``val`` and none is
    divided by ratio or by day, some input goes to train, and ``val_fraction`` > 0."""
    return (val_fraction > 0 and ratio is None and not split_by_day
            and not any(s.split == "val" for s in sources)
            and any(s.split in (None, "train") for s in sources))


def check_skipped(path: Path, counts: dict[str, dict[str, Any]], max_fraction: float) -> None:
    """Refuse a skip that drops too much: more than ``max_fraction`` of the input's rows, or
    every row of one label (what is kept of a split holds one class only).

    Raises:
        InputDataError: naming the input, the counts per reason and what to do.
    """
    read = sum(int(v.get("rows_read", 0)) for v in counts.values())
    kept = sum(int(v.get("rows", 0)) for v in counts.values())
    positives = sum(int(v.get("positives", 0)) for v in counts.values())
    dropped = read - kept
    if not dropped:
        return
    reasons = ", ".join(f"{r} {sum(int(v.get(r, 0)) for v in counts.values()):,}"
                        for r in BAD_REASONS if any(v.get(r) for v in counts.values()))
    what = f"--on-bad-rows skip would drop {dropped:,} of {read:,} rows ({reasons})"
    if kept and positives in (0, kept):
        raise InputDataError(
            f"{what} and keep only rows of label {int(positives > 0)} "
            f"({kept:,} rows): a whole class would be dropped",
            where=str(path),
            hint="the labels are probably coded otherwise (e.g. -1/1): map them in the "
                 "schema, e.g. `label: {name: label, map: {-1: 0, 1: 1}}`")
    if dropped > max_fraction * read:
        raise InputDataError(
            f"{what}: {dropped / read:.1%}, more than the {max_fraction:.0%} allowed",
            where=str(path),
            hint="check the schema against the file, or raise --max-skip-fraction")
