"""The ``multiagent`` config section: how a multi-agent env is trained (``docs/multiagent.md``).

Which credit each agent gets is ``algo.estimator``: any estimator is per-agent (one group per task and role),
``team_grpo`` shares the team reward, ``counterfactual`` credits it to the agent whose action mattered.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from turnrl.config.section import Section


class MultiAgentConfig(Section):
    policies: Literal["shared", "per_role"] = Field(
        "shared", description="shared: one model plays every role, told apart by its role prompt; per_role: each role has "
        "its own copy of the weights, its own engine and its own optimizer, trained only on that role's turns "
        "(docs/multiagent.md, 'Per-role policies')"
    )
    selfplay: bool = Field(
        False, description="competitive envs: the learner plays one role per task (by seed) against a pool of its frozen "
        "past versions; evaluation plays against the base model, so eval/success is the win rate against it"
    )
    pool_size: int = Field(3, ge=1, description="self-play: past snapshots kept in the pool besides the base model "
                                                "(each a frozen in-memory copy of the weights)")
    league: list[Literal["rule", "oracle"]] = Field(
        default_factory=list, description="self-play: scripted players kept in the pool for good beside the base model, "
        "drawn like any member: rule (the env's simple fixed rule, MultiAgentEnv.rule: always legal) or oracle "
        "(MultiAgentEnv.oracle: perfect play)")
    snapshot_every: int = Field(1, ge=1, description="self-play: add a snapshot of the learner to the pool every this many steps")
    elo_k: float = Field(32.0, gt=0.0, description="self-play: the Elo K-factor of the learner's and the pool's ratings "
                                                   "(selfplay/elo*)")

    @model_validator(mode="after")
    def _league_needs_selfplay(self) -> "MultiAgentConfig":
        if self.league and not self.selfplay:
            raise ValueError(f"multiagent.league={self.league} fills the self-play pool: set multiagent.selfplay=true, or "
                             "multiagent.league=[]")
        return self
