"""GiGPO: group-in-group credit, episode-level plus anchor-state step-level advantages."""

from __future__ import annotations

from collections import defaultdict
from difflib import SequenceMatcher
from typing import Sequence

import numpy as np

from turnrl.credit.base import CreditParams, register_estimator
from turnrl.credit.outcome import group_normalised
from turnrl.credit.turn import turn_returns
from turnrl.types import Advantages, TrajectoryGroup


def anchor_similarity(a: str, b: str) -> float:
    """``difflib.SequenceMatcher(None, a, b).ratio()``: 2 * matched characters / total characters, in [0, 1]."""
    return 1.0 if a == b else SequenceMatcher(None, a, b, autojunk=False).ratio()


def anchor_clusters(anchors: Sequence[str], threshold: float) -> list[int]:
    """Cluster id of each anchor: exact match when ``threshold >= 1``, otherwise greedy clustering in order of
    appearance, each anchor joining the first cluster whose representative (its first anchor) it matches with
    ``anchor_similarity >= threshold`` (verl-agent's ``build_step_group`` with ``enable_similarity``).
    The relation is not transitive, so the clusters depend on the order; it is the batch order, deterministic."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"gigpo similarity threshold must be in (0, 1] (got {threshold})")
    reps: list[str] = []
    exact: dict[str, int] = {}
    out = []
    for a in anchors:
        if a not in exact:
            cid = next((k for k, r in enumerate(reps) if threshold < 1.0 and anchor_similarity(a, r) >= threshold), None)
            if cid is None:
                reps.append(a)
                cid = len(reps) - 1
            exact[a] = cid
        out.append(exact[a])
    return out


def _episode_weights(groups: Sequence[TrajectoryGroup], pooling: str) -> np.ndarray | None:
    """How many members of its group's episode-level pool each trajectory is: 1 (``trajectory``, None here) or
    its number of turns (``step``)."""
    if pooling == "trajectory":
        return None
    if pooling == "step":
        return np.asarray([t.num_turns for g in groups for t in g.trajectories], dtype=np.float64)
    raise ValueError(f"gigpo_pooling must be 'trajectory' or 'step' (got {pooling!r})")


@register_estimator("gigpo")
def gigpo(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    r"""Group-in-Group Policy Optimization (Feng et al. 2025, arXiv:2505.10978).

    Within a group (copies of one task), trajectories revisit the same environment states. GiGPO adds to
    GRPO's episode-level advantage a step-level one that compares the actions taken *from the same state*:

        A^E_i     = (R_i - mean_P R) / (std_P R + eps)                     episode level, P = the group's pool
        G_{i,t}   = sum_{k >= t} gamma^(k - t) r_{i,k}                     discounted return of turn t
        A^S_{i,t} = (G_{i,t} - mean_{(j,s) in S} G_{j,s}) / (std_S + eps)  S = turns of the group whose anchor
                                                                            state equals turn (i,t)'s
        A_{i,t}   = A^E_i + w * A^S_{i,t}                                   w = ``params.step_weight``

    The episode-level pool P (``params.gigpo_pooling``):

    - ``trajectory`` (default, the paper's Eq. 3): one R_j per trajectory, exactly ``grpo``.
    - ``step``: one R_j per *step row*, so trajectory j counts T_j times (its number of turns):
      mean_P = sum_j T_j R_j / sum_j T_j and std_P = sqrt(sum_j T_j (R_j - mean_P)^2 / (sum_j T_j - 1)).
      This is what the reference implementation computes (verl-agent ``gigpo/core_gigpo.py``,
      ``episode_norm_reward`` with its default ``compute_mean_std_cross_steps=True``, "more stable"): its batch
      rows are steps, each carrying its episode's reward. Long episodes pull the baseline towards their reward.

    ``norm_std=False`` drops both std divisions (the paper's "mean-only" normalisation). The anchor of a
    turn is ``Turn.anchor``, the env's key of the state the model acted in (turns without an anchor get no
    step-level term). Anchors match exactly by default; with ``params.similarity < 1`` (``algo.gigpo_similarity``)
    near-identical anchors share a step-level group (see :func:`anchor_clusters`, as verl-agent's
    similarity-based GiGPO). Conventions where implementations differ: std is the sample (ddof=1)
    std, as in ``grpo``; an episode pool without a baseline (one trajectory, or all rewards equal) gives
    A^E = 0, where verl-agent gives a singleton pool mean 0 and std 1 (A^E = R / (1 + eps)); an anchor group
    with one member, or whose returns are all equal, gives A^S = 0; returns are computed from the turn rewards
    only (observation spans carry no reward, so a running return never "crosses" them). Env-error
    trajectories are in neither pool (``register_estimator``). Deviation from the paper: the paper's step-level
    groups use the returns of the *next* states' discounted rewards exactly as here, but its released code
    counts only steps before termination; here every recorded turn is counted, including the terminal one.
    """
    episode = group_normalised(groups, params, _episode_weights(groups, params.gigpo_pooling))
    out: list[list[float]] = []
    offset = 0
    for g in groups:
        returns = [turn_returns([turn.reward for turn in t.turns], params.gamma) for t in g.trajectories]
        buckets: dict[int, list[tuple[int, int]]] = defaultdict(list)
        keyed = [(i, t, turn.anchor) for i, traj in enumerate(g.trajectories) for t, turn in enumerate(traj.turns)
                 if turn.anchor is not None]
        for (i, t, _), cid in zip(keyed, anchor_clusters([a for _, _, a in keyed], params.similarity)):
            buckets[cid].append((i, t))
        step = [[0.0] * len(rs) for rs in returns]
        for members in buckets.values():
            vals = np.asarray([returns[i][t] for i, t in members], dtype=np.float64)
            if len(members) < 2 or vals.max() == vals.min():
                continue
            centred = vals - vals.mean()
            if params.norm_std:
                centred = centred / (vals.std(ddof=1) + params.eps)
            for (i, t), a in zip(members, centred):
                step[i][t] = float(a)
        for i in range(len(g.trajectories)):
            out.append([float(episode[offset + i]) + params.step_weight * s for s in step[i]])
        offset += len(g.trajectories)
    return Advantages(out)
