"""Credit for multi-agent episodes: the team's reward, shared, or credited to the agent whose action mattered.

The multi-agent collector (:mod:`turnrl.rollout.multiagent`) returns one group per (task, role), so every
registered estimator is already *per-agent*: ``grpo`` gives agent a's trajectory i the advantage of a's own return
``R^a_i`` against the mean over the group of a's copies of that task, its own baseline. The two estimators here
read instead the episode's team return ``T_i`` (``Trajectory.team_return``, the mean over the episode's roles of
their returns; for a team that shares one reward, that reward):

- ``team_grpo``: every agent's turns get the team's GRPO advantage, the same for all agents of an episode;
- ``counterfactual``: a COMA-style advantage per turn: the mean team return of the group's copies that took the same
  action at the same state, against the mean over every copy that faced that state.

Both raise ``ValueError`` on trajectories without a team return (a single-agent env).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from turnrl.credit.base import CreditParams, broadcast_to_turns, register_estimator
from turnrl.types import Advantages, Trajectory, TrajectoryGroup, Turn


def team_returns(group: TrajectoryGroup) -> np.ndarray:
    """``T_i`` of each trajectory of ``group``. Shape: (group size,). Raises ``ValueError`` where one is missing."""
    values = [t.team_return for t in group.trajectories]
    if any(v is None for v in values):
        raise ValueError("a trajectory has no team_return: team credit (team_grpo, counterfactual) needs a multi-agent env; "
                         "use grpo (or another per-agent estimator) for single-agent envs")
    out = np.asarray(values, dtype=np.float64)
    if not np.isfinite(out).all():
        raise ValueError(f"non-finite team return in the group of seed {group.seed}")
    return out


def _scale(returns: np.ndarray, params: CreditParams) -> float | None:
    """What a group's centred team returns are divided by: ``std(T) + eps`` (sample std), 1 without ``norm_std``;
    None when the group has no baseline (fewer than two members, or all equal)."""
    if returns.size < 2 or returns.max() == returns.min():
        return None
    return float(returns.std(ddof=1)) + params.eps if params.norm_std else 1.0


@register_estimator("team_grpo")
def team_grpo(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    r"""The shared team reward under GRPO: every agent gets the team's advantage.

    For trajectory i (any agent) in a group with team returns T_1..T_k:

        A_i = (T_i - mean(T)) / (std(T) + eps)     (T_i - mean(T) without ``norm_std``)

    given to every turn of i. Conventions as ``grpo`` (sample std; a singleton or all-equal group gets 0). Every agent
    of an episode gets the same value whatever its own part: the baseline that per-agent credit is measured against.
    """
    out = []
    for g in groups:
        t = team_returns(g)
        scale = _scale(t, params)
        out.append(np.zeros_like(t) if scale is None else (t - t.mean()) / scale)
    return broadcast_to_turns(groups, np.concatenate(out) if out else np.zeros(0))


@register_estimator("counterfactual")
def counterfactual(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    r"""A counterfactual baseline from the group (after COMA, Foerster et al. 2018, arXiv:1705.08926).

    COMA credits agent a's action u^a at state s with Q(s, u) - \sum_{u'} \pi^a(u' | s) Q(s, (u^{-a}, u')): the
    value of the action taken minus its expectation over a's *own* alternative actions, everything else held fixed.
    Without a critic, a group of copies of one task gives Monte Carlo estimates of both terms. For turn t of agent a's
    trajectory i (a group holds one role's copies of one task), with anchor s_{i,t} (``Turn.anchor``, the env's key of
    the state as a saw it, ``MultiAgentEnv.anchor(role)``) and action u_{i,t} (the parsed actions, ``Turn.actions``;
    the response text when it held none):

        J(s)      = { j in group : some turn of j has anchor s }                copies where a faced the same state
        K(s, u)   = { j in J(s) : at s, j took action u }                       copies that also acted the same
        b_{i,t}   = mean_{j in J(s_{i,t})} T_j         if |J(s_{i,t})| >= 2,   else mean_{j in group} T_j
        Q_{i,t}   = mean_{j in K(s_{i,t}, u_{i,t})} T_j                         (T_i when i is alone there)
        A_{i,t}   = (Q_{i,t} - b_{i,t}) / (std_group(T) + eps)                 (no division without ``norm_std``)

    The members of J(s) sampled their own action at s from the same policy, so their mean team return estimates the
    team's expected return over a's alternatives at s; the members of K(s, u) differ from i only in what happened
    after a acted, so their mean estimates Q(s, u) with the other agents' luck averaged out. A turn gets credit only
    for what its own action changed. In the relay: a speaker is compared with every speaker of its task, and credited
    with how often its message led its listeners to success (a right message is not blamed for a listener's wrong
    entry); a listener is compared only with listeners that got the same message (a wrong message does not blame it).

    Deviations from COMA: no learned Q (Monte Carlo team returns of the group); with turn-taking, agents that act
    after a are not held fixed (they answer a's action, as in the environment); a state no other copy reached falls
    back to the group mean (GRPO's baseline); the scale is one per group (the std of its team returns), so the
    fallback does not change it; ``params.gamma`` is ignored (the team return is episodic). A group whose team
    returns are all equal, or a singleton group, gets 0.
    """
    rows: list[list[float]] = []
    for g in groups:
        t = team_returns(g)
        scale = _scale(t, params)
        rows += [[0.0] * traj.num_turns for traj in g.trajectories] if scale is None else _baselined(g.trajectories, t, scale)
    return Advantages(rows)


def _action(turn: Turn) -> str:
    """What a turn did, as the env saw it: its parsed actions, else (none parsed) its response text."""
    return "\n".join(turn.actions) if turn.actions else "text:" + turn.response_text


def _who_faced(trajs: Sequence[Trajectory]) -> tuple[dict[str, set[int]], dict[tuple[str, str], set[int]]]:
    """``J(s)`` for every anchor ``s`` of the group's turns, and ``K(s, u)`` for every anchor and action taken there
    (the members' indices)."""
    holders: dict[str, set[int]] = {}
    takers: dict[tuple[str, str], set[int]] = {}
    for j, traj in enumerate(trajs):
        for turn in traj.turns:
            if turn.anchor is not None:
                holders.setdefault(turn.anchor, set()).add(j)
                takers.setdefault((turn.anchor, _action(turn)), set()).add(j)
    return holders, takers


def counterfactual_coverage(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    """How much of a multi-agent batch :func:`counterfactual` can tell apart from :func:`team_grpo`.

    ``credit/shared_state_turns``: the share of anchored turns whose state another copy in the group also faced
    (``|J(s)| >= 2``: a state baseline; otherwise the group mean). ``credit/shared_action_turns``: the share whose
    action at that state another copy also took (``|K(s, u)| >= 2``: a Q averaged over other episodes' luck;
    otherwise the turn's own team return). A turn with neither gets the shared team reward's advantage, and so does
    one whose state every copy faced but whose action none shared (every message worded differently, say). Empty for
    a batch without team returns (single-agent).
    """
    anchored = shared_state = shared_action = 0
    for g in groups:
        if not g.trajectories or any(t.team_return is None for t in g.trajectories):
            return {}
        holders, takers = _who_faced(g.trajectories)
        for traj in g.trajectories:
            for turn in traj.turns:
                if turn.anchor is not None:
                    anchored += 1
                    shared_state += len(holders[turn.anchor]) >= 2
                    shared_action += len(takers[(turn.anchor, _action(turn))]) >= 2
    if not anchored:
        return {}
    return {"credit/shared_state_turns": shared_state / anchored, "credit/shared_action_turns": shared_action / anchored}


def _baselined(trajs: Sequence[Trajectory], t: np.ndarray, scale: float) -> list[list[float]]:
    """``A_{i,t}`` of :func:`counterfactual` for one group with team returns ``t``."""
    holders, takers = _who_faced(trajs)
    rows = []
    for i, traj in enumerate(trajs):
        row = []
        for turn in traj.turns:
            same = holders.get(turn.anchor, set()) if turn.anchor is not None else set()
            baseline = float(t[sorted(same)].mean()) if len(same) >= 2 else float(t.mean())
            took = takers.get((turn.anchor, _action(turn)), {i}) if turn.anchor is not None else {i}
            row.append((float(t[sorted(took)].mean()) - baseline) / scale)
        rows.append(row)
    return rows
