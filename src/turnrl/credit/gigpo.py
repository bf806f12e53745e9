"""GiGPO: group-in-group credit, episode-level plus anchor-state step-level advantages."""

from __future__ import annotations

from collections import defaultdict
from difflib import SequenceMatcher
from typing import Sequence

import numpy as np

from turnrl.credit.base import CreditParams, register_estimator
from turnrl.credit.outcome import grpo
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


@register_estimator("gigpo")
def gigpo(groups: Sequence[TrajectoryGroup], params: CreditParams) -> Advantages:
    r"""Group-in-Group Policy Optimization (Feng et al. 2025, arXiv:2505.10978).

    Within a group (copies of one task), trajectories revisit the same environment states. GiGPO adds to
    GRPO's episode-level advantage a step-level one that compares the actions taken *from the same state*:

        A^E_i     = (R_i - mean_j R_j) / (std_j R_j + eps)                 episode level (this module's ``grpo``)
        G_{i,t}   = sum_{k >= t} gamma^(k - t) r_{i,k}                     discounted return of turn t
        A^S_{i,t} = (G_{i,t} - mean_{(j,s) in S} G_{j,s}) / (std_S + eps)  S = turns of the group whose anchor
                                                                            state equals turn (i,t)'s
        A_{i,t}   = A^E_i + w * A^S_{i,t}                                   w = ``params.step_weight``

    ``norm_std=False`` drops both std divisions (the paper's "mean-only" normalisation). The anchor of a
    turn is ``Turn.anchor``, the env's key of the state the model acted in (turns without an anchor get no
    step-level term). Anchors match exactly by default; with ``params.similarity < 1`` (``algo.gigpo_similarity``)
    near-identical anchors share a step-level group (see :func:`anchor_clusters`, as verl-agent's
    similarity-based GiGPO). Conventions where implementations differ: std is the sample (ddof=1)
    std, as in ``grpo``; an anchor group with one member, or whose returns are all equal, gives
    A^S = 0; returns are computed from the turn rewards only (observation spans carry no reward, so a
    running return never "crosses" them). Deviation from the paper: the paper's step-level groups use the
    returns of the *next* states' discounted rewards exactly as here, but its released code counts only
    steps before termination; here every recorded turn is counted, including the terminal one.
    """
    episode = grpo(groups, params).turns
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
            out.append([e + params.step_weight * s for e, s in zip(episode[offset + i], step[i])])
        offset += len(g.trajectories)
    return Advantages(out)
