"""The experience library: step-level records of past training episodes, retrieved into later observations
(in the spirit of SLEA-RL's step-level experience; docs/experience.md).

After credit, every trained turn that executed an action becomes a :class:`Record`: the key of the state it acted in,
the action, the turn's reward, whether its episode succeeded, the advantage the estimator gave the turn, and the
policy version that sampled it. :class:`ExperienceRetrieval` wraps an env and appends the nearest records to every
observation as one short line, the retrieved actions ranked by their mean advantage::

    Past steps here: Right +0.41, Down -0.80.

("here" when every record shown was stored under exactly the current key, "nearby" otherwise.) The env's few-shot
examples get such a line too (:meth:`ExperienceRetrieval.examples`), so the format the policy sees is one it was shown.

**Nearest**: records stored under exactly the current key come first (newest first); when they are fewer than
``top_k``, records of other keys follow, most similar first, if their token-set Jaccard similarity to the current key
is at least ``min_similarity``. A key's token set is its lower-cased words plus its adjacent word pairs, so
``Left: hole`` and ``Left: frozen`` differ in a pair, not only in a word. The key is the env's anchor state
(``key="anchor"``, what GiGPO groups by), its situation (``key="situation"``: what the agent faces in terms that recur
across tasks, ``Env.situation``) or the raw observation (``key="observation"``). Anchors and observations usually name
the task (a FrozenLake anchor holds the map), so on tasks unlike any trained on only the situation can match exactly.

**Bounded and versioned**: at most ``max_records`` records (the oldest are evicted first), and a record sampled more
than ``max_age`` policy versions before the current one is dropped at the next store.

What it does to the tokens: the block is part of the observation, so it is prompt (masked, never trained on) and
the learner sees exactly the prompt the engine conditioned on. What it does to credit: nothing directly; records
carry the advantages the estimator already gave. Each turn's ``info["experience"]`` says what the observation it
answered held (key, records retrieved, exact matches, the block), for auditing and for the metrics.

:func:`agent_libraries` and :func:`with_libraries` (the end of this module) make both libraries from the config and
wrap an env factory with them, skills inside (:mod:`turnrl.agent.skills`); ``turnrl.build`` calls them.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal, NamedTuple

from turnrl.agent.skills import SkillActions, SkillLibrary
from turnrl.config import Config, ConfigError
from turnrl.envs.base import Env
from turnrl.envs.wrappers import StepResult, Wrapper
from turnrl.types import Advantages, Termination, Trajectory, TrajectoryGroup

KeyKind = Literal["anchor", "situation", "observation"]


@dataclass(frozen=True)
class Record:
    """One past turn: in the state ``key`` the policy of ``version`` did ``action`` (the executed actions, joined by
    ``", "``) and got ``reward``; its episode ended solved (``success``) or not; the estimator gave it ``advantage``."""

    key: str
    action: str
    reward: float
    success: bool
    advantage: float
    version: int


class _Index(NamedTuple):
    """The library's records (oldest first), the records of each key, and each key's token set."""

    records: tuple[Record, ...]
    by_key: dict[str, list[Record]]
    tokens: dict[str, frozenset[str]]


def key_tokens(key: str) -> frozenset[str]:
    """The token set that similarity compares: lower-cased words and adjacent word pairs."""
    words = re.findall(r"\w+", key.lower())
    return frozenset(words) | frozenset(f"{a} {b}" for a, b in zip(words, words[1:]))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """``|a & b| / |a | b|`` (1.0 for two empty sets)."""
    return len(a & b) / len(a | b) if a or b else 1.0


class ExperienceLibrary:
    """Bounded, versioned store of :class:`Record` s with nearest-key retrieval (the module docstring defines nearest).

    Args:
        max_records: records kept; a store past it evicts the oldest.
        max_age: a record with ``version < current - max_age`` is dropped when a newer batch is stored.
        top_k: records :meth:`nearest` returns at most.
        min_similarity: the smallest Jaccard similarity of a non-exact key whose records may be returned.
        key: ``"anchor"``, ``"situation"`` or ``"observation"``: what :class:`ExperienceRetrieval` looks records up by.
    """

    def __init__(self, max_records: int = 2048, max_age: int = 4, top_k: int = 3, min_similarity: float = 0.5,
                 key: KeyKind = "anchor") -> None:
        if max_records < 1 or max_age < 1 or top_k < 1 or not 0.0 <= min_similarity <= 1.0:
            raise ValueError(f"max_records={max_records}, max_age={max_age}, top_k={top_k} must be >= 1 and "
                             f"min_similarity={min_similarity} in [0, 1]")
        self.max_records, self.max_age, self.top_k, self.min_similarity, self.key = (
            max_records, max_age, top_k, min_similarity, key)
        self._index = _Index((), {}, {})

    def __len__(self) -> int:
        return len(self._index.records)

    def __iter__(self) -> Iterator[Record]:
        return iter(self._index.records)

    def add(self, records: list[Record], version: int) -> None:
        """Store ``records``, drop those older than ``max_age`` versions before ``version``, then evict the oldest
        past ``max_records``. The new index replaces the old one in one assignment, so an episode collected in
        another thread (``scale.async_mode``) reads either."""
        kept = [r for r in (*self._index.records, *records) if r.version >= version - self.max_age][-self.max_records:]
        by_key: dict[str, list[Record]] = {}
        for r in kept:
            by_key.setdefault(r.key, []).append(r)
        self._index = _Index(tuple(kept), by_key, {k: key_tokens(k) for k in by_key})

    def nearest(self, key: str) -> list[tuple[Record, float]]:
        """Up to ``top_k`` ``(record, similarity)`` pairs: exact matches first (similarity 1.0, newest first), then
        the records of the other keys, most similar key first (within a key, newest first)."""
        index = self._index
        found = [(r, 1.0) for r in reversed(index.by_key.get(key, []))]
        if len(found) < self.top_k and self.min_similarity < 1.0:
            tokens = key_tokens(key)
            scored = [(jaccard(tokens, t), k) for k, t in index.tokens.items() if k != key]
            for sim, k in sorted((s for s in scored if s[0] >= self.min_similarity), key=lambda s: -s[0]):
                found += [(r, sim) for r in reversed(index.by_key[k])]
                if len(found) >= self.top_k:
                    break
        return found[: self.top_k]

    def learn(self, groups: list[TrajectoryGroup], advantages: Advantages, version: int) -> dict[str, float]:
        """Store the batch's records (after credit; ``version`` is the policy's after this step's update) and return
        the metrics of what the batch's observations were shown."""
        trajectories = [t for g in groups for t in g.trajectories]
        metrics = retrieval_metrics(trajectories)
        self.add([r for i, traj in enumerate(trajectories) for r in records_of(traj, advantages.turns[i])], version)
        metrics["experience/records"] = float(len(self))
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"records": [asdict(r) for r in self._index.records]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        records = [Record(**r) for r in state["records"]]
        self._index = _Index((), {}, {})
        self.add(records, max((r.version for r in records), default=0))


def records_of(traj: Trajectory, advantages: list[float]) -> list[Record]:
    """The records of one credited trajectory: its turns that executed an action and were shown an experience
    lookup (so their key is the one looked up); none from an episode that ended in an env error."""
    if traj.termination == Termination.ENV_ERROR:
        return []
    return [Record(turn.info["experience"]["key"], ", ".join(turn.actions), turn.reward, traj.success, float(adv),
                   traj.policy_version)
            for turn, adv in zip(traj.turns, advantages) if turn.actions and "experience" in turn.info]


def retrieval_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """``experience/retrieved_per_turn`` (records shown per observation) and ``experience/hit_rate`` (fraction of
    observations shown at least one record; ``experience/exact_rate``: one stored under exactly its key)."""
    shown = [t.info["experience"] for traj in trajectories for t in traj.turns if "experience" in t.info]
    if not shown:
        return {}
    n = len(shown)
    return {"experience/retrieved_per_turn": sum(s["retrieved"] for s in shown) / n,
            "experience/hit_rate": sum(s["retrieved"] > 0 for s in shown) / n,
            "experience/exact_rate": sum(s["exact"] > 0 for s in shown) / n}


def render_block(records: list[Record], exact: int) -> str:
    """The line appended to an observation ("" when nothing): the distinct actions of ``records`` with their mean
    advantage, the highest first (ties in retrieval order); "here" when all ``exact`` records were stored under exactly
    the current key, else "nearby". Reward and success stay in the records (and the audit), not in the line: a longer
    line (``Experience (3 past steps, ...): Right led to reward +0.20, solved 2/2, advantage +0.41``) made the default
    model continue the line instead of answering (docs/experience.md)."""
    if not records:
        return ""
    by_action: dict[str, list[float]] = {}
    for r in records:
        by_action.setdefault(r.action, []).append(r.advantage)
    ranked = sorted(by_action.items(), key=lambda item: -_mean(item[1]))
    where = "here" if exact == len(records) else "nearby"
    return f"Past steps {where}: " + ", ".join(f"{action} {_mean(a):+.2f}" for action, a in ranked) + "."


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


class ExperienceRetrieval(Wrapper):
    """Append the ``library``'s nearest records to every observation (the module docstring has the format).

    ``info["experience"]`` of a ``step`` describes the lookup shown in the observation that step *answered* (the
    previous reply's, or the reset's): ``{"key", "retrieved", "exact", "block"}``; ``reset`` returns its own lookup.
    The library is only read here; the training loop stores into it after credit.
    """

    def __init__(self, env: Env, library: ExperienceLibrary) -> None:
        super().__init__(env)
        self.library = library
        self._shown: dict[str, Any] = {}

    def examples(self) -> list[tuple[str, str]]:
        """The env's examples, each observation followed by an experience line that ranks its own response first
        (+0.50) and another example's response last (-0.50), so that the few-shot exchanges show the line the policy
        will see. Unchanged when a response is not a short single line (the line names actions, not long texts)."""
        pairs = list(self.env.examples())
        responses = [response for _, response in pairs]
        if any("\n" in r or len(r) > 40 for r in responses):
            return pairs
        out = []
        for i, (observation, response) in enumerate(pairs):
            other = next((r for r in responses[i + 1:] + responses[:i] if r != response), None)
            shown = [Record("", response, 0.0, True, 0.5, 0)] + ([Record("", other, 0.0, False, -0.5, 0)] if other else [])
            out.append((f"{observation}\n{render_block(shown, len(shown))}", response))
        return out

    def on_reset(self, observation: str, info: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        observation, self._shown = self._with_experience(observation)
        return observation, {**info, "experience": self._shown}

    def on_step(self, observation: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]) -> StepResult:
        info = {**info, "experience": self._shown}
        if not (terminated or truncated):  # no lookup for an observation nobody answers
            observation, self._shown = self._with_experience(observation)
        return observation, reward, terminated, truncated, info

    def _with_experience(self, observation: str) -> tuple[str, dict[str, Any]]:
        key = self._key(observation)
        records = [r for r, _ in self.library.nearest(key)]
        exact = sum(r.key == key for r in records)
        block = render_block(records, exact)
        shown = {"key": key, "retrieved": len(records), "exact": exact, "block": block}
        return (f"{observation}\n{block}" if block else observation), shown

    def _key(self, observation: str) -> str:
        if self.library.key == "observation":  # with SkillActions inside, its changing skill list is no part of the key
            return getattr(self.env, "env_observation", observation)
        kind = self.library.key
        try:
            return self.env.situation() if kind == "situation" else self.env.anchor()
        except NotImplementedError:
            raise TypeError(f"{type(self.env.unwrapped).__name__} has no {kind}(), so experience cannot be looked up "
                            f"by it; set experience.key=observation (or {'anchor' if kind == 'situation' else 'situation'}"
                            " if the env defines it)") from None


# ---------------------------------------------------------------------------------------------- wiring


def agent_libraries(cfg: Config) -> tuple[ExperienceLibrary | None, SkillLibrary | None]:
    """The experience and skill libraries ``experience.retrieve`` / ``experience.skills`` enable (None when off);
    :func:`turnrl.build.build` makes them and the loop feeds them."""
    x = cfg.experience
    if (x.retrieve or x.skills) and cfg.scale.workers:
        raise ConfigError("experience.retrieve and experience.skills keep their libraries in the training process, "
                          "which Ray rollout workers do not see: set scale.workers=0, or switch both off")
    experience = ExperienceLibrary(x.max_records, x.max_age, x.top_k, x.min_similarity, x.key) if x.retrieve else None
    skills = (SkillLibrary(x.max_skills, x.skill_min_length, x.skill_max_length, x.skill_min_count, x.max_age)
              if x.skills else None)
    return experience, skills


def with_libraries(cfg: Config, factory: Callable[[], Env], experience: ExperienceLibrary | None,
                   skills: SkillLibrary | None) -> Callable[[], Env]:
    """``factory``, each env wrapped by :class:`SkillActions` and then :class:`ExperienceRetrieval` (outermost, so
    a skill's expansion is one lookup) for the libraries given; tried once (an env without the key looked up by is a
    :class:`ConfigError`)."""
    if experience is None and skills is None:
        return factory

    def wrapped() -> Env:
        env = SkillActions(factory(), skills) if skills is not None else factory()
        return ExperienceRetrieval(env, experience) if experience is not None else env

    with contextlib.closing(wrapped()) as probe:
        try:
            probe.reset(seed=cfg.train.seed_start)
        except TypeError as e:
            raise ConfigError(f"experience.key={cfg.experience.key}: {e}") from None
    return wrapped
