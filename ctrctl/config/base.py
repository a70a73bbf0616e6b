"""What every section of a pipeline YAML shares: strict, frozen pydantic models, and the
names that become file or folder names."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

from ctrctl.io import path_name_problem

__all__ = ["PathName", "Section"]


def _path_name(value: str) -> str:
    problem = path_name_problem(value)
    if problem:
        raise ValueError(f"the name {value!r:.80} {problem}")
    return value


#: A name that becomes a file or folder name (a table, split, model or pipeline name).
PathName = Annotated[str, AfterValidator(_path_name)]


class Section(BaseModel):
    """Base of every section: unknown keys are errors, and a validated config is frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
