"""A training source fed by the rollout service: groups of the episodes external agents played through ``turnrl serve``.

:class:`ServedCollector` has the :class:`~turnrl.rollout.Collector`'s ``collect`` signature, so the training loop
takes a step's groups from it unchanged (``serve.train=true``; :func:`turnrl.build.build` picks it). A ``collect``
opens the :class:`~turnrl.engines.serve.EngineGate` (served requests run), waits until ``len(seeds)`` tasks each
have ``group_size`` closed episodes (:meth:`~turnrl.engines.sessions.SessionStore.take`), then closes the gate, so
the learner updates and syncs the weights with no request in flight: each turn comes from one weight version
(``Turn.info["policy_version"]``), and an episode that spans an update is a partial rollout over two, its older
turns' behaviour logprobs those of the older weights (the learner's ratio is against them). What differs from the in-process collector: the clients choose the tasks (the ``seeds`` only say
how many groups), so an episode whose task key is held out is dropped, said once on stderr; the ``sampling``
argument is not used (the server enforces the run's temperature; the client sets the rest).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

from turnrl.engines.base import SamplingParams
from turnrl.engines.serve import RolloutServer
from turnrl.rollout.collector import RolloutStats
from turnrl.types import Trajectory, TrajectoryGroup


class ServedCollector:
    """Groups from ``server``'s closed episodes; ``held_out(task_key)`` says which tasks training must not see.

    ``wait_timeout_s`` bounds one ``collect``'s wait; past it the run stops with a ``TimeoutError`` saying how many
    closed episodes of which tasks had arrived.
    """

    def __init__(self, server: RolloutServer, held_out: Callable[[str | None], bool], wait_timeout_s: float) -> None:
        self.server = server
        self.held_out = held_out
        self.wait_timeout_s = wait_timeout_s
        self.stats = RolloutStats()
        self._warned = False

    def collect(self, seeds: Sequence[int], group_size: int, sampling: SamplingParams,
                env_id: str = "") -> list[TrajectoryGroup]:
        """``len(seeds)`` groups of ``group_size`` served episodes, one task each, in the order the tasks filled up."""
        t0 = time.perf_counter()
        self.server.gate.open()
        try:
            taken = self.server.store.take(len(seeds), group_size, self.wait_timeout_s, self._admit)
        except TimeoutError as e:
            raise TimeoutError(f"serve.train: {e}; have agents play each task rollout.group_size times through "
                               f"{self.server.url}, or raise serve.wait_timeout_s (docs/serve.md)") from None
        finally:
            self.server.gate.close()
        self.stats.generate_s += time.perf_counter() - t0
        groups = []
        for g, trajectories in enumerate(taken):
            for t in trajectories:
                t.group_index = g
                self.stats.prompt_tokens += sum(len(turn.prompt_ids) for turn in t.turns)
                self.stats.generated_tokens += sum(len(turn.response_ids) for turn in t.turns)
            first = trajectories[0]
            groups.append(TrajectoryGroup(env_id=env_id or first.env_id, seed=first.seed, trajectories=trajectories))
        return groups

    def take_stats(self) -> RolloutStats:
        """The counters since the last call (``generate_s`` is the time spent waiting for episodes)."""
        stats, self.stats = self.stats, RolloutStats()
        return stats

    def close(self) -> None:
        """Stop the server."""
        self.server.close()

    def _admit(self, traj: Trajectory) -> bool:
        if not self.held_out(traj.task_key):
            return True
        if not self._warned:
            print(f"turnrl serve: an episode of held-out task {traj.task_key!r} was not trained on (evaluation tasks stay "
                  "unseen); send tasks of the training set (docs/serve.md)", file=sys.stderr)
            self._warned = True
        return False
