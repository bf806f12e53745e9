"""Advantage estimators: one signature, one registry (see ``base.py`` and docs/algorithms.md).

    estimator = get_estimator(cfg.algo.estimator)
    advantages = estimator(groups, CreditParams(norm_std=..., gamma=...))   # one float per turn

Built in: ``grpo`` (and Dr.GRPO via ``norm_std=False``), ``rloo``, ``grpo_turn``, ``gigpo``, ``reinforce_pp``, ``reinforce_pp_baseline``,
``remax``, and with a critic ``ppo_token``, ``ppo_turn``, ``ppo_bilevel`` (GAE, see ``gae.py``).
Multi-agent team credit: ``team_grpo`` and ``counterfactual`` (``multiagent.py``).
Add one with ``@register_estimator("name")`` on a function of the same signature. Trajectories that ended in an
env error are left out of every registered estimator's statistics and get advantage 0 (``base.py``);
``group_counts(groups)`` counts them and the singleton groups left behind, for logging.
"""

from turnrl.credit.base import (
    Advantages,
    CreditParams,
    Estimator,
    GroupCounts,
    ValueInputs,
    estimator_flag,
    available_estimators,
    episode_rewards,
    get_estimator,
    group_counts,
    register_estimator,
    without_env_errors,
)
from turnrl.credit.outcome import grpo, rloo
from turnrl.credit.turn import grpo_turn, turn_returns
from turnrl.credit.gigpo import gigpo
from turnrl.credit.reinforce import reinforce_pp, reinforce_pp_baseline
from turnrl.credit.remax import remax
from turnrl.credit.gae import ppo_bilevel, ppo_token, ppo_turn
from turnrl.credit.multiagent import counterfactual, team_grpo

__all__ = [
    "Advantages",
    "CreditParams",
    "Estimator",
    "available_estimators",
    "episode_rewards",
    "get_estimator",
    "register_estimator",
    "grpo",
    "rloo",
    "grpo_turn",
    "gigpo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "remax",
    "ppo_token",
    "ppo_turn",
    "ppo_bilevel",
    "team_grpo",
    "counterfactual",
    "ValueInputs",
    "estimator_flag",
    "turn_returns",
    "GroupCounts",
    "group_counts",
    "without_env_errors",
]
