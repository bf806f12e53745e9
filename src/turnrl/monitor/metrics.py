"""What a step's rollouts, credit and timings measure: the ``rollout/*``, ``eval/*``, ``train/advantage_*``,
``credit/*`` and ``perf/*`` metrics (docs/metrics.md lists each). Pure functions of the step's records."""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from turnrl.credit import group_counts
from turnrl.credit.base import is_env_error
from turnrl.credit.multiagent import counterfactual_coverage
from turnrl.rollout import RolloutStats
from turnrl.types import Advantages, Termination, TrainSample, TrajectoryGroup


def rollout_metrics(groups: list[TrajectoryGroup], prefix: str = "rollout") -> dict[str, float]:
    """Success, reward (and each named component), turns, validity, lengths and terminations, per trajectory."""
    trajs = [t for g in groups for t in g.trajectories]
    turns = [turn for t in trajs for turn in t.turns]
    n = max(1, len(trajs))
    m = {
        f"{prefix}/success_rate": sum(t.success for t in trajs) / n,
        f"{prefix}/reward": sum(t.total_reward for t in trajs) / n,
        f"{prefix}/turns": sum(t.num_turns for t in trajs) / n,
        f"{prefix}/valid_action_rate": sum(t.valid for t in turns) / max(1, len(turns)),
        f"{prefix}/response_tokens": sum(len(t.response_ids) for t in turns) / max(1, len(turns)),
        f"{prefix}/response_truncated_rate": sum(t.finish_reason == "length" for t in turns) / max(1, len(turns)),
    }
    for why in Termination:
        m[f"{prefix}/termination/{why.value}"] = sum(t.termination == why for t in trajs) / n
    similarity = cross_input_similarity(groups)
    if similarity is not None:
        m[f"{prefix}/cross_input_similarity"] = similarity
    comps: dict[str, float] = {}
    for t in trajs:
        for k, v in t.reward_components.items():
            comps[k] = comps.get(k, 0.0) + v
    for k, v in comps.items():
        m[f"{prefix}/reward/{k}"] = v / n
    return m


def cross_input_similarity(groups: list[TrajectoryGroup], max_pairs: int = 256) -> float | None:
    """Mean token-set Jaccard similarity of first-turn responses to different tasks (the echo-trap signal).

    Pairs are taken across groups (different tasks) in a fixed order, at most ``max_pairs``. None with fewer
    than two groups.
    """
    firsts = [[set(t.turns[0].response_ids) for t in g.trajectories if t.turns] for g in groups]
    sims = []
    for i in range(len(firsts)):
        for j in range(i + 1, len(firsts)):
            for a, b in zip(firsts[i], firsts[j]):
                sims.append(len(a & b) / len(a | b) if a | b else 1.0)
                if len(sims) >= max_pairs:
                    return sum(sims) / len(sims)
    return sum(sims) / len(sims) if sims else None


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a success rate (8 lines; not worth a statistics dependency)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def eval_metrics(groups: list[TrajectoryGroup], seconds: float) -> dict[str, float]:
    """``eval/*``: the rollout metrics of held-out episodes, the number of distinct tasks, and the success rate's 95%
    interval over those tasks.

    Tasks are told apart by ``Trajectory.task_key`` (by the group's seed where it is None); the interval counts each
    distinct task once, at the mean success of its episodes, so a task drawn twice does not narrow it.
    """
    m = rollout_metrics(groups, prefix="eval")
    by_task: dict[object, list[bool]] = {}
    for g in groups:
        for t in g.trajectories:
            by_task.setdefault(t.task_key if t.task_key is not None else ("seed", g.seed), []).append(t.success)
    wins = sum(sum(s) / len(s) for s in by_task.values())
    lo, hi = wilson_interval(wins, len(by_task))
    m.update({"eval/success_ci_low": lo, "eval/success_ci_high": hi, "eval/num_tasks": float(len(groups)),
              "eval/distinct_tasks": float(len(by_task))})
    m["perf/eval_s"] = seconds
    return m


def credit_metrics(groups: list[TrajectoryGroup], advantages: Advantages) -> dict[str, float]:
    """Advantage statistics over the trajectories credit used (env errors are out of it, with advantage 0), what
    group-relative credit could not use (singleton groups and env-error trajectories) and, on multi-agent batches,
    how many turns a counterfactual baseline can compare (:func:`~turnrl.credit.multiagent.counterfactual_coverage`)."""
    trajs = [t for g in groups for t in g.trajectories]
    values = advantages.rows([i for i, t in enumerate(trajs) if not is_env_error(t)]).values()
    counts = group_counts(groups)
    return {
        "train/advantage_mean": float(np.mean(values)) if values else 0.0,
        "train/advantage_std": float(np.std(values)) if values else 0.0,
        "credit/singleton_groups": float(counts.singleton_groups),
        "credit/env_error_trajectories": float(counts.env_error_trajectories),
    } | counterfactual_coverage(groups)


def step_metrics(samples: list[TrainSample], stats: RolloutStats, t_rollout: float, t_train: float,
                 t_start: float) -> dict[str, float]:
    """``perf/*`` timings of one step (``stats``: the collector's counters over the step's sampling rounds)."""
    return {
        "perf/rollout_s": t_rollout,
        "perf/train_s": t_train,
        "perf/generate_s": stats.generate_s,
        "perf/env_s": stats.env_s,
        "perf/prompt_tokens": float(stats.prompt_tokens),
        "perf/generated_tokens": float(stats.generated_tokens),
        "perf/generate_tokens_per_s": stats.generated_tokens / max(stats.generate_s, 1e-9),
        "perf/train_tokens_per_s": sum(len(s) for s in samples) / max(t_train, 1e-9),
        "perf/wall_s": time.perf_counter() - t_start,
        "perf/max_rss_gb": peak_rss_gb(),
    }


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far, in GB (Linux reports KiB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20
