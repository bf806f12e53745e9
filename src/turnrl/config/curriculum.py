"""The ``curriculum`` config section: training tasks whose difficulty moves to keep their success rate in a band
(``docs/curriculum.md``; the scheduler is :mod:`turnrl.rollout.curriculum`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from turnrl.config.section import Section


class CurriculumConfig(Section):
    enabled: bool = Field(
        False, description="draw training tasks at a difficulty level that moves with their recent success rate; held-out "
        "evaluation stays on env.kwargs (or eval.env_id / eval.env_kwargs) at every level"
    )
    param: str = Field(
        "", description="the env keyword each level sets (e.g. size for frozenlake-v0): levels is then a list of its "
        "values; empty: each level is a dict of env keywords"
    )
    levels: list[Any] = Field(
        default_factory=list, description="the difficulty levels, easiest first: values of param (e.g. [3, 4, 6, 8]), or "
        "dicts of env keywords laid over env.kwargs (e.g. [{size: 4, p_frozen: 0.9}, {size: 6, p_frozen: 0.8}])"
    )
    band: tuple[float, float] = Field(
        (0.2, 0.8), description="(low, high): a window success rate above high moves one level harder, below low one "
        "level easier; in between the level stays"
    )
    window: int = Field(4, ge=1, description="training steps at the current level whose episodes make the success rate; "
                                            "the level moves only on a full window, and a move starts a new one")
    start: int = Field(0, ge=0, description="the level (index into levels) the run starts at")

    @model_validator(mode="after")
    def _consistent(self) -> "CurriculumConfig":
        low, high = self.band
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(f"curriculum.band={list(self.band)} must be [low, high] with 0 <= low < high <= 1, e.g. [0.2, 0.8]")
        if not self.enabled:
            return self
        if len(self.levels) < 2:
            raise ValueError(f"curriculum.levels has {len(self.levels)} level(s); a curriculum needs at least two, easiest "
                             "first, e.g. curriculum.param=size curriculum.levels=[3,4,6]")
        dicts = [isinstance(level, dict) for level in self.levels]
        if self.param and any(dicts):
            raise ValueError(f"curriculum.param={self.param!r} takes levels that are values of it, not dicts: "
                             "e.g. curriculum.levels=[3,4,6], or drop curriculum.param and give dicts of env keywords")
        if not self.param and not all(dicts):
            raise ValueError("curriculum.levels holds values, not dicts of env keywords: name the keyword they set, "
                             "e.g. curriculum.param=size, or make every level a dict such as {size: 4}")
        if self.start >= len(self.levels):
            raise ValueError(f"curriculum.start={self.start} is past the last of the {len(self.levels)} levels: "
                             f"use 0..{len(self.levels) - 1}")
        return self

    def level_kwargs(self) -> list[dict[str, Any]]:
        """Each level as the env keywords it sets, easiest first."""
        return [{self.param: level} if self.param else dict(level) for level in self.levels]
