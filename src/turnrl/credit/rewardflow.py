r"""RewardFlow-style dense rewards: success propagated backwards over the graph of states a group visited.

After RewardFlow (Feng et al. 2026, arXiv:2603.18859): the trajectories of one group (copies of one task, one role)
revisit the same states, so their union is a small **state graph**. Nodes are anchors (``Turn.anchor``, the env's
``anchor()`` of the state a turn acted in; a hierarchy's executor anchor includes its subgoal) plus one node
``SUCCESS``; each turn t of trajectory i adds the edge ``s_{i,t} -> s_{i,t+1}``, and the last turn of a successful
trajectory the edge ``s_{i,T} -> SUCCESS``. Success flows backwards along the edges:

    d(s) = the fewest edges from s to SUCCESS in the graph (breadth-first, backwards from SUCCESS)
    V(s) = gamma_f ** d(s)        (V(SUCCESS) = 1; V(s) = 0 for a state with no path to SUCCESS)

so a state any copy went on from to succeed is worth more the closer to success it was seen, and a dead end is
worth 0, whichever copy visited it. Each turn then gets the potential difference (Ng, Harada & Russell 1999) as a
dense reward, weighted by ``w``:

    F_{i,t} = w * (gamma_f * Phi_{i,t+1} - V(s_{i,t}))
    Phi_{i,t+1} = V(s_{i,t+1}) for t < T;  at the last turn T: 1 on success, 0 when the episode terminated
                  without success (a failure state), V(s_{i,T}) when it was truncated (the next state is unknown,
                  taken as unchanged)

A step along a shortest observed way to success gets 0 (gamma_f * gamma_f^{d-1} = gamma_f^d), a step away from it
or one that changes nothing (an invalid action) gets less than 0, a step into a dead end gets -w V(s). Summed with
discount gamma_f over an episode of n turns the shaping telescopes to ``w (gamma_f^n Phi_end - V(s_0))``; every copy
of a task starts in the same state, so episode-level estimators (``grpo``) see only the ``gamma_f^n Phi_end`` part
(shorter successes earn more), while per-turn estimators (``grpo_turn``, ``gigpo``) see each turn's own share.

It is an estimator *input*: :func:`apply_rewardflow` adds ``F`` to the turn rewards as component ``rewardflow`` before
the configured estimator runs (``hierarchy.rewardflow`` = w, ``hierarchy.rewardflow_gamma`` = gamma_f).

Deviations from the paper: nodes are the env's exact anchors (no state-equivalence model); the propagation is the
breadth-first distance above with a geometric decay, for one group at a time (not pooled over the batch); the dense
reward is the potential difference rather than the state value itself, so it does not pay for lingering in good
states. Trajectories that ended in an env error are left out of the graph and get no shaping.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from turnrl.credit.base import is_env_error
from turnrl.types import Termination, Trajectory, TrajectoryGroup

SUCCESS = "\x00success"  # the success node; no env anchor starts with a NUL byte


def state_values(trajectories: Sequence[Trajectory], gamma: float) -> dict[str, float]:
    """``V(s)`` of every anchor of ``trajectories`` (one group) with a path to success; absent states are worth 0.

    Raises ``ValueError`` when a turn has no anchor (the env gives none: RewardFlow cannot build its graph).
    """
    if not 0.0 < gamma < 1.0:
        raise ValueError(f"rewardflow gamma={gamma} must be in (0, 1): it decays success with the distance to it")
    parents: dict[str, set[str]] = {}
    for traj in trajectories:
        anchors = _anchors(traj)
        ends = anchors[1:] + ([SUCCESS] if traj.success else [])
        for state, nxt in zip(anchors, ends):
            parents.setdefault(nxt, set()).add(state)
    distance = {SUCCESS: 0}
    queue = deque([SUCCESS])
    while queue:
        node = queue.popleft()
        for parent in sorted(parents.get(node, ())):
            if parent not in distance:
                distance[parent] = distance[node] + 1
                queue.append(parent)
    return {s: gamma**d for s, d in distance.items()}


def shaped_rewards(traj: Trajectory, values: dict[str, float], gamma: float) -> list[float]:
    """``F_{i,t} / w`` for each turn of ``traj`` under the state values of its group (module docstring)."""
    anchors = _anchors(traj)
    phi = [values.get(s, 0.0) for s in anchors]
    if traj.success:
        last = 1.0
    elif traj.termination == Termination.TERMINATED:
        last = 0.0
    else:
        last = phi[-1] if phi else 0.0
    following = phi[1:] + [last]
    return [gamma * nxt - now for now, nxt in zip(phi, following)]


def apply_rewardflow(groups: Sequence[TrajectoryGroup], weight: float, gamma: float) -> None:
    """Add ``F_{i,t}`` (module docstring) to every turn's reward, as component ``rewardflow``, one graph per group."""
    for g in groups:
        trajs = [t for t in g.trajectories if not is_env_error(t)]
        values = state_values(trajs, gamma)
        for traj in trajs:
            for turn, f in zip(traj.turns, shaped_rewards(traj, values, gamma)):
                turn.reward += weight * f
                turn.reward_components["rewardflow"] = turn.reward_components.get("rewardflow", 0.0) + weight * f


def _anchors(traj: Trajectory) -> list[str]:
    anchors = [turn.anchor for turn in traj.turns]
    if any(a is None for a in anchors):
        raise ValueError(f"{traj.env_id} seed {traj.seed}: a turn has no anchor, so RewardFlow has no state graph; "
                         "the env must implement anchor(), or set hierarchy.rewardflow=0")
    return anchors  # type: ignore[return-value]
