"""What every config section shares: the base class that refuses unknown keys, and step counts."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


#: Step counts above this are a typo (1e12, 10^30), not a run: 1e8 steps at 10 ms each are 11 days.
MAX_STEPS = 100_000_000

#: A step count: a whole number (``1e3`` is refused rather than rounded), at most :data:`MAX_STEPS`.
Steps = Annotated[int, Field(strict=True, le=MAX_STEPS)]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


__all__ = ["MAX_STEPS", "Section", "Steps"]
