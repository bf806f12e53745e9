r"""Generalised Advantage Estimation with a learned critic: token-level, turn-level and bi-level.

GAE (Schulman et al. 2016, arXiv:1506.02438) over a sequence of states s_0..s_{N-1} with rewards r_k and
critic values V_k:

    delta_k = r_k + gamma * V_{k+1} - V_k
    A_k     = sum_{l >= 0} (gamma * lam)^l * delta_{k+l}
    R_k     = A_k + V_k                           (the value-loss target, "lambda-return")

with V_N the value after the last step: ``ValueInputs.bootstrap`` when the episode was **truncated**
(turn or context limit: the episode could have gone on, so the future is estimated by the critic) and 0
when it **terminated** (no future). gamma = lam = 1 gives A_k = (sum of future rewards) - V_k; lam = 0 gives
the one-step TD error.

Three ways to lay a multi-turn episode out as that sequence (the estimators below):

- ``ppo_token``: one step per *response token*, observation tokens skipped (they are the env's move, not
  the policy's). Turn t's reward sits on its last response token; gamma = ``params.gamma_token`` and
  lam = ``params.lam`` apply per token and run across turn boundaries as if the observation were not
  there. This is the RLHF PPO layout (InstructGPT / OpenRLHF) extended to several turns.
- ``ppo_turn``: one step per *turn*, V_t = the critic at the position before turn t's first response token,
  r_t = turn t's reward, gamma = ``params.gamma`` (the turn discount). Every token of turn t gets A_t.
- ``ppo_bilevel``: a turn-level TD target handed to a token-level GAE inside each turn, as in ArCHer's
  hierarchical actor (Zhou et al. 2024, arXiv:2402.19446): within turn t the last token's reward is
  r_t + gamma * V_{t+1} (V_{t+1} = the turn-level value of the next turn, or the bootstrap / 0 after the
  last turn), the token discount is ``params.gamma_token``, and the GAE stops at the turn's end. So credit
  crosses turns only through the turn-level value, and token credit within a turn is not diluted by
  later turns' noise. Deviations from ArCHer: ArCHer's high level is an off-policy Q/V critic trained by
  TD from a replay buffer and its low level uses a separate token-level baseline; here one on-policy
  critic (the same value head) provides both levels and the token level uses GAE rather than a
  REINFORCE-with-baseline estimate.

Conventions. Values are read from ``params.values`` (the trainer fills them when ``algo.critic`` is on);
without them these estimators raise. With ``params.whiten`` the advantages are whitened over the batch:
A <- (A - mean) / (std + eps) over every response token (``ppo_turn``: each turn's A_t weighted by its token
count), with ``params.whiten_std`` choosing the std: ``population`` (divide by n, as OpenRLHF normalises PPO
advantages) or ``unbiased`` (divide by n - 1, as TRL's and verl's ``masked_whiten``); see
:func:`turnrl.credit.base.batch_std`. Returns are never whitened. A turn with no response tokens has an
empty token list; turn-level estimators still give it its A_t. Trajectories that ended in an env error are
left out before any of this (``register_estimator``) and get advantage 0; their value targets are still
computed, and the critic skips them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from turnrl.credit.base import CreditParams, ValueInputs, batch_std, register_estimator
from turnrl.types import Advantages, Trajectory, TrajectoryGroup

ValueTargets = tuple[list[list[list[float]]], list[list[list[int]]]]
"""``(returns, mask)``: per trajectory, per turn, per response token the value target and whether that
position is trained (turn-level GAE trains only each turn's first position)."""


# ----------------------------------------------------------------------------------------- the recursion


def gae_loop(rewards: Sequence[float], values: Sequence[float], next_value: float, gamma: float, lam: float) -> tuple[list[float], list[float]]:
    """Reference GAE by the backward recursion A_k = delta_k + gamma * lam * A_{k+1}. Returns (advantages, returns)."""
    n = len(rewards)
    if len(values) != n:
        raise ValueError(f"{n} rewards but {len(values)} values")
    adv = [0.0] * n
    running = 0.0
    for k in range(n - 1, -1, -1):
        v_next = values[k + 1] if k + 1 < n else next_value
        delta = rewards[k] + gamma * v_next - values[k]
        running = delta + gamma * lam * running
        adv[k] = running
    return adv, [a + v for a, v in zip(adv, values)]


def gae(rewards: np.ndarray, values: np.ndarray, next_value: float, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised GAE: A = T @ delta with T[k, j] = (gamma * lam)^(j - k) for j >= k. Shapes: (N,) -> (N,), (N,).

    O(N^2) memory in the sequence length N, fine for the few hundred response tokens of an agent episode.
    """
    r = np.asarray(rewards, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    n = r.size
    if v.size != n:
        raise ValueError(f"{n} rewards but {v.size} values")
    if n == 0:
        return np.zeros(0), np.zeros(0)
    v_next = np.append(v[1:], next_value)
    delta = r + gamma * v_next - v
    lag = np.arange(n)[None, :] - np.arange(n)[:, None]
    weights = np.where(lag >= 0, (gamma * lam) ** np.maximum(lag, 0), 0.0)
    adv = weights @ delta
    return adv, adv + v


# ----------------------------------------------------------------------------------------- helpers


def _flat(groups: Sequence[TrajectoryGroup]) -> list[Trajectory]:
    return [t for g in groups for t in g.trajectories]


def _require_values(groups: Sequence[TrajectoryGroup], params: CreditParams, name: str) -> ValueInputs:
    if params.values is None:
        raise ValueError(f"estimator {name!r} needs critic values: set algo.critic=head (or separate)")
    vals = params.values
    trajs = _flat(groups)
    if len(vals.token_values) != len(trajs) or len(vals.bootstrap) != len(trajs):
        raise ValueError(f"{len(trajs)} trajectories but values for {len(vals.token_values)} (bootstrap {len(vals.bootstrap)})")
    for i, (traj, tv) in enumerate(zip(trajs, vals.token_values)):
        if [len(x) for x in tv] != [len(turn.response_ids) for turn in traj.turns]:
            raise ValueError(f"trajectory {i}: token values do not match its response lengths")
    return vals


def _next_value(traj: Trajectory, bootstrap: float) -> float:
    """The value after the last step: the critic's estimate on truncation, 0 otherwise."""
    return float(bootstrap) if traj.termination.truncated else 0.0


def _turn_values(token_values: list[list[float]], fallback: float) -> list[float]:
    """Turn-level value of each turn: the value before its first response token (``fallback`` for an empty turn)."""
    return [tv[0] if tv else fallback for tv in token_values]


def _token_stats(per_token: list[list[np.ndarray]], params: CreditParams) -> tuple[float, float] | None:
    """Mean and std (``params.whiten_std``, see :func:`batch_std`) over every response token of the batch;
    None when there are fewer than two tokens."""
    parts = [a for traj in per_token for a in traj if a.size]
    flat = np.concatenate(parts) if parts else np.zeros(0)
    return (float(flat.mean()), batch_std(flat, params)) if flat.size >= 2 else None


def _whiten(adv: list[list[np.ndarray]], params: CreditParams) -> None:
    """With ``params.whiten``, whiten in place: (A - mean) / (std + eps) over every response token of the batch."""
    stats = _token_stats(adv, params) if params.whiten else None
    if stats is None:
        return
    mean, std = stats
    for traj in adv:
        for t, a in enumerate(traj):
            traj[t] = (a - mean) / (std + params.eps)


def _split(x: np.ndarray, lengths: Sequence[int]) -> list[np.ndarray]:
    return np.split(x, np.cumsum(lengths)[:-1]) if lengths else []


# ----------------------------------------------------------------------------------------- the three layouts


def _token_level(groups, params: CreditParams) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    vals = _require_values(groups, params, "ppo_token")
    adv_out, ret_out = [], []
    for traj, tv, boot in zip(_flat(groups), vals.token_values, vals.bootstrap):
        lengths = [len(turn.response_ids) for turn in traj.turns]
        rewards = np.zeros(sum(lengths))
        # a turn's reward sits on its last response token; a turn with no tokens passes it to the previous one
        pos = -1
        for turn, n in zip(traj.turns, lengths):
            pos += n
            if pos >= 0:
                rewards[pos] += turn.reward
        values = np.asarray([v for x in tv for v in x], dtype=np.float64)
        a, r = gae(rewards, values, _next_value(traj, boot), params.gamma_token, params.lam)
        adv_out.append(_split(a, lengths))
        ret_out.append(_split(r, lengths))
    return adv_out, ret_out


def _turn_level(groups, params: CreditParams) -> tuple[list[list[float]], list[list[float]]]:
    vals = _require_values(groups, params, "ppo_turn")
    adv_out, ret_out = [], []
    for traj, tv, boot in zip(_flat(groups), vals.token_values, vals.bootstrap):
        v_turn = np.asarray(_turn_values(tv, boot), dtype=np.float64)
        rewards = np.asarray([turn.reward for turn in traj.turns], dtype=np.float64)
        a, r = gae(rewards, v_turn, _next_value(traj, boot), params.gamma, params.lam)
        adv_out.append(a.tolist())
        ret_out.append(r.tolist())
    return adv_out, ret_out


def _bi_level(groups, params: CreditParams) -> tuple[list[list[np.ndarray]], list[list[np.ndarray]]]:
    vals = _require_values(groups, params, "ppo_bilevel")
    adv_out, ret_out = [], []
    for traj, tv, boot in zip(_flat(groups), vals.token_values, vals.bootstrap):
        v_turn = _turn_values(tv, boot)
        after = v_turn[1:] + [_next_value(traj, boot)]
        a_traj, r_traj = [], []
        for t, (turn, x) in enumerate(zip(traj.turns, tv)):
            values = np.asarray(x, dtype=np.float64)
            if values.size == 0:
                a_traj.append(np.zeros_like(values))
                r_traj.append(values.copy())
                continue
            rewards = np.zeros(values.size)
            rewards[-1] = turn.reward + params.gamma * after[t]  # the turn-level TD target ends the turn
            a, r = gae(rewards, values, 0.0, params.gamma_token, params.lam)
            a_traj.append(a)
            r_traj.append(r)
        adv_out.append(a_traj)
        ret_out.append(r_traj)
    return adv_out, ret_out


def _token_targets(returns: list[list[np.ndarray]]) -> ValueTargets:
    return [[r.tolist() for r in traj] for traj in returns], [[[1] * r.size for r in traj] for traj in returns]


@register_estimator("ppo_token")
def ppo_token(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    """Token-level GAE over response tokens (see the module docstring). One advantage per response token."""
    if not groups:
        return Advantages([])
    adv, _ = _token_level(groups, params)
    _whiten(adv, params)
    return Advantages.per_token([[a.tolist() for a in traj] for traj in adv])


@register_estimator("ppo_turn")
def ppo_turn(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    """Turn-level GAE: one value and one advantage per turn, spread over the turn's tokens (module docstring)."""
    if not groups:
        return Advantages([])
    adv, _ = _turn_level(groups, params)
    as_tokens = [[np.full(len(turn.response_ids), a) for turn, a in zip(traj.turns, ad)]
                 for traj, ad in zip(_flat(groups), adv)]
    stats = _token_stats(as_tokens, params) if params.whiten else None  # token-weighted, as the token-level estimators
    if stats is not None:
        mean, std = stats
        adv = [[(a - mean) / (std + params.eps) for a in traj] for traj in adv]
    return Advantages([[float(a) for a in traj] for traj in adv])


@register_estimator("ppo_bilevel")
def ppo_bilevel(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    """Bi-level GAE: turn-level TD targets, token-level GAE within each turn (module docstring)."""
    if not groups:
        return Advantages([])
    adv, _ = _bi_level(groups, params)
    _whiten(adv, params)
    return Advantages.per_token([[a.tolist() for a in traj] for traj in adv])


def _turn_value_targets(groups: Sequence[TrajectoryGroup], params: CreditParams) -> ValueTargets:
    """Turn-level returns on each turn's first response position; the other positions are not trained."""
    _, ret = _turn_level(groups, params)
    trajs = _flat(groups)
    returns, mask = [], []
    for traj, rs in zip(trajs, ret):
        returns.append([[r] + [0.0] * (len(turn.response_ids) - 1) if turn.response_ids else [] for turn, r in zip(traj.turns, rs)])
        mask.append([[1] + [0] * (len(turn.response_ids) - 1) if turn.response_ids else [] for turn in traj.turns])
    return returns, mask


for _est, _targets in (
    (ppo_token, lambda g, p: _token_targets(_token_level(g, p)[1])),
    (ppo_turn, _turn_value_targets),
    (ppo_bilevel, lambda g, p: _token_targets(_bi_level(g, p)[1])),
):
    _est.needs_critic = True  # type: ignore[attr-defined]
    _est.value_targets = _targets  # type: ignore[attr-defined]
