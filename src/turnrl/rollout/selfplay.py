"""Self-play: the trained policy plays a competitive multi-agent env against a pool of its own frozen past versions.

:class:`SelfPlay` is a :class:`~turnrl.rollout.multiagent.Lineup`. For the task of seed ``s`` the learner plays role
``roles[s % len(roles)]`` (so it trains every role across tasks) and every other role is played by one pool member,
drawn uniformly with ``random.Random(s)``: an engine over a frozen in-memory copy of the weights (no checkpoint on
disk). The pool starts with the base model (``"base"``, kept for good) and gains a snapshot of the learner every
``snapshot_every`` steps, keeping the ``size`` newest snapshots.

League: ``league`` adds fixed members that stay for good beside the base, drawn like any other member: scripted
players that read the env (``{"rule": scripted(tokenizer, "rule")}``, the env's simple fixed rule, which always moves
legally). Past versions of a learner that writes invalid moves forfeit as often as it does, so against them alone a
win says little; a member that never forfeits makes winning need legal moves.

Ratings: after each step every training game updates an :class:`Elo` rating of ``"learner"`` against the member it
played (score 1 for a win, 0 for a loss, 0.5 for a game no one won: truncated). :meth:`SelfPlay.against_base` is the
evaluation lineup: every opponent is the base model, so evaluation's success rate is the win rate against the base.
:meth:`SelfPlay.against` gives the same lineup with any other engine as the opponent (a fixed rule, a stronger model).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnrl.config import ConfigError
from turnrl.engines.base import Engine
from turnrl.envs.multiagent import has_player
from turnrl.models import frozen_copy
from turnrl.rollout.multiagent import EpisodeEngines, scripted
from turnrl.types import Termination, TrajectoryGroup

LEARNER = "learner"


def expected_score(rating: float, opponent: float) -> float:
    """Elo's expected score of a player rated ``rating`` against ``opponent``: 1 / (1 + 10^((opponent - rating) / 400))."""
    return 1.0 / (1.0 + 10.0 ** ((opponent - rating) / 400.0))


@dataclass
class Elo:
    """Elo ratings (Elo 1978), updated one game at a time: with E_a = expected_score(R_a, R_b) and score S_a in {0, 0.5, 1},

        R_a += k (S_a - E_a),    R_b += k ((1 - S_a) - (1 - E_a))

    so the two changes cancel. A player not yet rated starts at ``initial``.
    """

    k: float = 32.0
    initial: float = 1000.0
    ratings: dict[str, float] = field(default_factory=dict)

    def rating(self, player: str) -> float:
        return self.ratings.get(player, self.initial)

    def update(self, a: str, b: str, score_a: float) -> None:
        """Record one game of ``a`` against ``b`` in which ``a`` scored ``score_a`` (1 win, 0.5 draw, 0 loss)."""
        if not 0.0 <= score_a <= 1.0:
            raise ValueError(f"an Elo score is in [0, 1], got {score_a}")
        ra, rb = self.rating(a), self.rating(b)
        change = self.k * (score_a - expected_score(ra, rb))
        self.ratings[a], self.ratings[b] = ra + change, rb - change


def league(players: Sequence[str], envs: Callable[[], Any], tokenizer, env_id: str) -> dict[str, EpisodeEngines]:
    """The league of ``multiagent.league``: each player (``"rule"``, ``"oracle"``) a scripted member that plays with
    the env's method of that name; ConfigError naming the players the env (``envs()``, an ``env_id``) lacks."""
    with envs() as env:
        missing = [player for player in players if not has_player(env, player)]
    if missing:
        raise ConfigError(f"multiagent.league={list(players)}: {env_id} has no {' or '.join(missing)}(role) to play; drop "
                          f"{missing} from multiagent.league")
    return {player: scripted(tokenizer, player) for player in players}


@dataclass
class _Member:
    name: str
    engine: Engine | EpisodeEngines


class SelfPlay:
    """The pool, the role assignment and the ratings (module docstring).

    ``engine_for(model)`` builds an engine sampling from a frozen copy; ``model`` is the learner's module; ``league``
    names the fixed members besides the base (module docstring).
    """

    def __init__(self, model: Any, engine_for: Callable[[Any], Engine], *, size: int = 3, snapshot_every: int = 1,
                 elo_k: float = 32.0, league: Mapping[str, Engine | EpisodeEngines] | None = None) -> None:
        if size < 1 or snapshot_every < 1:
            raise ValueError(f"self-play pool size ({size}) and snapshot_every ({snapshot_every}) must be >= 1")
        league = dict(league or {})
        if "base" in league or LEARNER in league:
            raise ValueError(f"a league member may not be called 'base' or {LEARNER!r}: {sorted(league)}")
        self.model, self.engine_for = model, engine_for
        self.size, self.snapshot_every = size, snapshot_every
        self.base = _Member("base", engine_for(frozen_copy(model)))
        self.fixed = [self.base] + [_Member(name, engine) for name, engine in league.items()]
        self.snapshots: list[_Member] = []
        self.elo = Elo(k=elo_k)
        self._played: dict[int, str] = {}  # seed -> the member that played it in the latest collection

    @property
    def members(self) -> list[_Member]:
        """The pool: the base, the league, then the snapshots oldest first."""
        return self.fixed + self.snapshots

    @staticmethod
    def learner_role(seed: int, roles: Sequence[str]) -> str:
        return roles[seed % len(roles)]

    def opponents(self, seed: int, roles: Sequence[str]) -> Mapping[str, Engine | EpisodeEngines]:
        members = self.members
        member = members[random.Random(seed).randrange(len(members))]
        self._played[seed] = member.name
        return {r: member.engine for r in roles if r != self.learner_role(seed, roles)}

    def against_base(self) -> "Against":
        return self.against(self.base.engine)

    @staticmethod
    def against(engine: Engine | EpisodeEngines) -> "Against":
        """The evaluation lineup with ``engine`` playing every role but the learner's."""
        return Against(engine)

    def after_step(self, step: int, groups: Sequence[TrajectoryGroup], metrics: Mapping[str, float]) -> dict[str, float]:
        """Rate the step's games, snapshot the learner when due; returns the ``selfplay/*`` metrics, with the step's
        evaluation (``eval/success_rate`` and its interval in ``metrics``, when it evaluated) as the win rate against the base."""
        scores = []
        for g in groups:
            for t in g.trajectories:
                if t.termination == Termination.ENV_ERROR:
                    continue
                score = 1.0 if t.success else (0.5 if t.termination.truncated else 0.0)
                self.elo.update(LEARNER, self._played[g.seed], score)
                scores.append(score)
        if step % self.snapshot_every == 0:
            self.snapshots.append(_Member(f"step{step}", self.engine_for(frozen_copy(self.model))))
            if len(self.snapshots) > self.size:
                del self.snapshots[0]  # the oldest; the base and the league stay
        out = {f"selfplay/elo_{m.name}": self.elo.rating(m.name) for m in self.members}
        out.update({"selfplay/elo": self.elo.rating(LEARNER), "selfplay/pool_size": float(len(self.members))})
        if scores:
            out["selfplay/score_vs_pool"] = sum(scores) / len(scores)
        for name, key in (("success_rate", ""), ("success_ci_low", "_ci_low"), ("success_ci_high", "_ci_high")):
            if f"eval/{name}" in metrics:
                out[f"selfplay/winrate_vs_base{key}"] = metrics[f"eval/{name}"]
        return out


@dataclass
class Against:
    """An evaluation lineup: the learner's role as in training, every other role played by ``engine``."""

    engine: Engine | EpisodeEngines

    def opponents(self, seed: int, roles: Sequence[str]) -> Mapping[str, Engine | EpisodeEngines]:
        return {r: self.engine for r in roles if r != SelfPlay.learner_role(seed, roles)}
