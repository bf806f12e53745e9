"""Curriculum: the training tasks' difficulty, moved to keep their success rate in a band (``docs/curriculum.md``).

Levels are sets of env keywords, easiest first (``curriculum.levels``). After each training step,
:meth:`Curriculum.observe` adds the step's episode successes to a window of the last ``window`` steps collected at
the current level. Once the window is full, its success rate ``s`` (successful episodes / episodes) moves the level:

    s > band.high  and a harder level exists  ->  level + 1
    s < band.low   and an easier level exists ->  level - 1
    otherwise                                ->  the level stays

and a move starts an empty window, so every decision rests on ``window`` steps at one level. Tasks that are always
solved or never solved give group-relative estimators no signal (every advantage is 0); the band keeps the training
tasks between the two.

Training draws its tasks at the current level: :class:`LeveledEnvs` builds the collector's envs of that level and
:class:`LeveledTasks` keeps one task split per level, each excluding the held-out task keys. Held-out evaluation
does not move: it stays on the configured eval env.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from turnrl.config import Config, ConfigError
from turnrl.envs.base import Env
from turnrl.types import Trajectory, TrajectoryGroup


class Curriculum:
    """The level scheduler. ``levels``: env keywords per level, easiest first; ``band``: ``(low, high)``;
    ``window``: steps per decision; ``start``: the first level."""

    def __init__(self, levels: Sequence[Mapping[str, Any]], band: tuple[float, float] = (0.2, 0.8), window: int = 4,
                 start: int = 0) -> None:
        if len(levels) < 2 or not 0 <= start < len(levels):
            raise ValueError(f"need at least two levels and 0 <= start < {len(levels)}, got {len(levels)} and {start}")
        if not 0.0 <= band[0] < band[1] <= 1.0 or window < 1:
            raise ValueError(f"need 0 <= low < high <= 1 and window >= 1, got band={band}, window={window}")
        self.levels = [dict(level) for level in levels]
        self.band, self.level = band, start
        self._window: deque[tuple[int, int]] = deque(maxlen=window)  # (successes, episodes) of each recent step

    @classmethod
    def from_config(cls, cfg: Config) -> Curriculum | None:
        """The ``curriculum`` section's scheduler (None when it is off); ConfigError where the level cannot move."""
        k = cfg.curriculum
        if not k.enabled:
            return None
        if cfg.scale.async_mode or cfg.scale.workers or cfg.serve.train:  # they collect ahead of, or apart from, it
            raise ConfigError("curriculum.enabled=true moves the level between steps of this process, which batches "
                              "collected ahead or elsewhere would not follow: set scale.async_mode=false, "
                              "scale.workers=0 and serve.train=false")
        return cls(k.level_kwargs(), k.band, k.window, k.start)

    @property
    def kwargs(self) -> dict[str, Any]:
        """The env keywords of the current level."""
        return self.levels[self.level]

    @property
    def success(self) -> float:
        """The window's success rate (0 for an empty window)."""
        episodes = sum(n for _, n in self._window)
        return sum(s for s, _ in self._window) / episodes if episodes else 0.0

    def observe(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """Record a training step's episodes (all it collected) and move the level when the full window says so.

        Returns ``curriculum/level`` (the level these episodes were drawn at) and ``curriculum/success`` (the
        window's success rate with them).
        """
        episodes: list[Trajectory] = [t for g in groups for t in g.trajectories]
        self._window.append((sum(t.success for t in episodes), len(episodes)))
        metrics = {"curriculum/level": float(self.level), "curriculum/success": self.success}
        if len(self._window) == self._window.maxlen:
            harder = self.success > self.band[1] and self.level + 1 < len(self.levels)
            easier = self.success < self.band[0] and self.level > 0
            if harder or easier:
                self.level += 1 if harder else -1
                self._window.clear()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "window": [list(w) for w in self._window]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not 0 <= state["level"] < len(self.levels):
            raise ValueError(f"a curriculum level of {state['level']} does not fit {len(self.levels)} levels")
        self.level = state["level"]
        self._window.clear()
        self._window.extend(tuple(w) for w in state["window"])


class LeveledEnvs:
    """An env factory that builds the curriculum's current level: ``factories[curriculum.level]()``."""

    def __init__(self, factories: Sequence[Callable[[], Env]], curriculum: Curriculum) -> None:
        if len(factories) != len(curriculum.levels):
            raise ValueError(f"{len(factories)} env factories for {len(curriculum.levels)} levels")
        self.factories, self.curriculum = list(factories), curriculum

    def __call__(self) -> Env:
        return self.factories[self.curriculum.level]()


class TaskSource(Protocol):
    """What the loop asks of its tasks (:class:`turnrl.build.TaskSplit` is one)."""

    train_envs: Callable[[], Env]

    @property
    def eval_tasks(self) -> list[Any]: ...

    @property
    def held_keys(self) -> frozenset[str]: ...

    def train_tasks(self, step: int, round_: int = 0) -> list[Any]: ...

    def training_only(self, trajectories: list[Trajectory]) -> list[Trajectory]: ...


class LeveledTasks:
    """Held-out and training tasks under a curriculum: ``splits[i]`` draws level ``i``'s training tasks (each split
    built over that level's envs and the one evaluation env, so every level excludes the same held-out task keys).

    Step ``t`` trains on ``splits[level].train_tasks(t)``: a pure function of the step and the level, so a resumed run
    (whose checkpoint holds the level) draws the same tasks.
    """

    def __init__(self, splits: Sequence[TaskSource], curriculum: Curriculum) -> None:
        if len(splits) != len(curriculum.levels):
            raise ValueError(f"{len(splits)} task splits for {len(curriculum.levels)} levels")
        self.splits, self.curriculum = list(splits), curriculum

    @property
    def _current(self) -> TaskSource:
        return self.splits[self.curriculum.level]

    @property
    def train_envs(self) -> Callable[[], Env]:
        return self._current.train_envs

    @property
    def eval_tasks(self) -> list[Any]:
        return self.splits[0].eval_tasks

    @property
    def held_keys(self) -> frozenset[str]:
        return self.splits[0].held_keys

    def train_tasks(self, step: int, round_: int = 0) -> list[Any]:
        return self._current.train_tasks(step, round_)

    def training_only(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        return self._current.training_only(trajectories)
