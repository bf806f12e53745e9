"""Turn-reward transforms applied before credit assignment: process-reward models and clipping.

Both edit ``Turn.reward`` in place and record the change as its own named component in
``Turn.reward_components``, so components still sum to the reward and each change is logged separately
(``rollout/reward/prm``, ``rollout/reward/clip``).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence

from turnrl.types import Trajectory, TrajectoryGroup

ProcessRewardModel = Callable[[Trajectory, int], float]
"""Scores turn ``t`` of a trajectory (observation, response, actions, env reward are all on the Turn)."""


def load_prm(spec: str) -> ProcessRewardModel:
    """Import a process-reward model from ``"package.module:function"``."""
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"algo.prm={spec!r} must look like 'package.module:function'")
    fn = getattr(importlib.import_module(module), attr, None)
    if not callable(fn):
        raise ValueError(f"algo.prm={spec!r}: {module} has no callable {attr!r}")
    return fn


def apply_process_rewards(groups: Sequence[TrajectoryGroup], prm: ProcessRewardModel, weight: float) -> None:
    """Add ``weight * prm(trajectory, t)`` to every turn's reward, as component ``prm``.

    The PRM's scores combine additively with the env's outcome and step rewards; any estimator that reads
    per-turn rewards (``grpo_turn``, ``gigpo``, ``reinforce_pp``) then credits each turn with them, and the
    episode-level ones see them through the episode sum.
    """
    for g in groups:
        for traj in g.trajectories:
            for t, turn in enumerate(traj.turns):
                score = float(prm(traj, t))
                if not math.isfinite(score):
                    raise ValueError(f"the process-reward model returned {score} for seed {traj.seed} turn {t}")
                turn.reward += weight * score
                turn.reward_components["prm"] = turn.reward_components.get("prm", 0.0) + weight * score


def clip_rewards(groups: Sequence[TrajectoryGroup], bound: float) -> None:
    """Clip every turn reward to [-bound, bound]; the change is recorded as component ``clip``."""
    if bound <= 0:
        raise ValueError(f"reward clip bound {bound} must be > 0")
    for g in groups:
        for traj in g.trajectories:
            for turn in traj.turns:
                clipped = min(bound, max(-bound, turn.reward))
                if clipped != turn.reward:
                    turn.reward_components["clip"] = turn.reward_components.get("clip", 0.0) + clipped - turn.reward
                    turn.reward = clipped


class RunningMeanStd:
    """Welford's running mean and variance over every value ever passed to :meth:`update` (all steps)."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0

    def update(self, xs: Sequence[float]) -> None:
        for x in xs:
            self.count += 1
            d = x - self.mean
            self.mean += d / self.count
            self.m2 += d * (x - self.mean)

    @property
    def std(self) -> float:
        """Population std of everything seen (0 before two values)."""
        return math.sqrt(self.m2 / self.count) if self.count > 1 else 0.0

    def state_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.count, self.mean, self.m2 = int(state["count"]), float(state["mean"]), float(state["m2"])


class KLController:
    r"""The KL-in-reward coefficient beta: fixed, or adaptive as in Ziegler et al. 2019 (arXiv:1909.08593, sec. 2.2).

    Adaptive (``target > 0``), after each step with mean per-turn KL ``kl`` over ``n`` turns:

        e    = clip(kl / target - 1, -0.2, 0.2)
        beta = beta * (1 + e * n / horizon)

    Deviation: the paper measures KL per episode (one response); here the unit is a turn, so ``target``
    is the KL per turn and ``horizon`` counts turns.
    """

    def __init__(self, beta: float, target: float = 0.0, horizon: int = 10000) -> None:
        if beta < 0 or target < 0 or horizon < 1:
            raise ValueError(f"KL controller needs beta >= 0, target >= 0, horizon >= 1 (got {beta}, {target}, {horizon})")
        self.beta, self.target, self.horizon = beta, target, horizon

    def update(self, kl: float, n: int) -> None:
        if self.target > 0:
            e = min(0.2, max(-0.2, kl / self.target - 1.0))
            self.beta *= 1.0 + e * n / self.horizon


class RewardShaper:
    """KL(pi || ref) as a reward penalty and running reward normalisation, applied to turn rewards in place.

    - KL penalty (``kl_beta > 0``): turn t's reward loses ``beta * sum_k (log pi(y_k) - log ref(y_k))`` over
      its response tokens (the sampled k1 estimate, as in Ziegler et al. 2019 and InstructGPT), recorded
      as component ``kl``. Deviation: the per-token penalties are summed onto the turn (the turn's reward
      carries them), so token-level GAE sees them on the turn's last token rather than on each token.
    - Running normalisation (``normalise``): every turn reward is divided by the running std of all turn
      rewards seen so far (this batch included), recorded as component ``norm``. Rewards are scaled, not
      centred: subtracting a mean from every turn would reward or punish episode length.

    Both keep their state in :meth:`state_dict` so a resumed run continues with the same beta and statistics.
    """

    def __init__(self, kl_beta: float = 0.0, kl_target: float = 0.0, kl_horizon: int = 10000, normalise: bool = False,
                 eps: float = 1e-8) -> None:
        self.kl = KLController(kl_beta, kl_target, kl_horizon) if kl_beta > 0 else None
        self.norm = RunningMeanStd() if normalise else None
        self.eps = eps
        self.last_metrics: dict[str, float] = {}  # what the last :meth:`apply` measured (beta, KL, running std)

    def apply(self, groups: Sequence[TrajectoryGroup], turn_kl: Sequence[Sequence[float]] | None = None) -> dict[str, float]:
        """Shape the rewards; ``turn_kl[i][t]`` is turn t's summed token KL (flattened order). Returns metrics."""
        trajs = [t for g in groups for t in g.trajectories]
        metrics: dict[str, float] = {}
        if self.kl is not None:
            if turn_kl is None or len(turn_kl) != len(trajs):
                raise ValueError("the KL reward penalty needs one KL per turn of every trajectory (reference model forward)")
            beta = self.kl.beta
            values = []
            for traj, kls in zip(trajs, turn_kl):
                for turn, k in zip(traj.turns, kls):
                    turn.reward -= beta * k
                    turn.reward_components["kl"] = turn.reward_components.get("kl", 0.0) - beta * k
                    values.append(k)
            mean_kl = sum(values) / max(1, len(values))
            self.kl.update(mean_kl, len(values))
            metrics.update({"train/kl_reward_beta": beta, "rollout/kl_per_turn": mean_kl})
        if self.norm is not None:
            self.norm.update([turn.reward for t in trajs for turn in t.turns])
            scale = 1.0 / (self.norm.std + self.eps) if self.norm.count > 1 else 1.0
            for t in trajs:
                for turn in t.turns:
                    new = turn.reward * scale
                    turn.reward_components["norm"] = turn.reward_components.get("norm", 0.0) + new - turn.reward
                    turn.reward = new
            metrics["train/reward_running_std"] = self.norm.std
        self.last_metrics = metrics
        return metrics

    def state_dict(self) -> dict:
        return {"kl_beta": self.kl.beta if self.kl else None, "norm": self.norm.state_dict() if self.norm else None}

    def load_state_dict(self, state: dict) -> None:
        if self.kl is not None and state.get("kl_beta") is not None:
            self.kl.beta = float(state["kl_beta"])
        if self.norm is not None and state.get("norm") is not None:
            self.norm.load_state_dict(state["norm"])
