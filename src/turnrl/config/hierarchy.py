"""The ``hierarchy`` config section: RewardFlow dense rewards as an estimator input (``docs/hierarchy.md``).

The planner / executor envs themselves (``frozenlake-hier-v0``) take their segment length and milestone and
hindsight rewards as env keywords (``env.kwargs``); this section shapes the rewards credit sees, for any env whose
turns carry anchors (a hierarchy or a flat env).
"""

from __future__ import annotations

from pydantic import Field

from turnrl.config.section import Section


class HierarchyConfig(Section):
    rewardflow: float = Field(
        0.0, ge=0.0, description="weight w of the RewardFlow dense reward added to every turn before the estimator "
        "(component rewardflow): success propagated backwards over the group's graph of visited states (anchors), "
        "as the potential difference w (gamma_f V(next) - V(state)); 0 turns it off"
    )
    rewardflow_gamma: float = Field(0.9, gt=0.0, lt=1.0, description="gamma_f of RewardFlow: a state d steps from "
                                    "success in the group's state graph is worth gamma_f ** d")
