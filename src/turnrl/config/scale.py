"""The ``scale`` config section: past one process (``docs/scale.md``). The defaults keep the single-process path."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from turnrl.config.section import Section


class ScaleConfig(Section):
    workers: int = Field(
        0, ge=0, description="rollout workers as Ray actors, each with its own envs and engine (pip install "
        "'turnrl[scale]'); 0 = collect in the training process"
    )
    worker_gpus: float = Field(
        0.0, ge=0.0, description="GPUs each rollout worker actor asks Ray for (its engine, e.g. rollout.engine=vllm, "
        "then runs on them; a fraction packs several workers on one GPU); 0 = CPU workers"
    )
    env_actors: int = Field(
        0, ge=0, description="Ray actors hosting the envs (turnrl.scale.envpool): env steps run outside the training "
        "process, each new env on the actor with the fewest; env.step_timeout_s bounds each call; 0 = envs in the "
        "training process"
    )
    learner_ranks: int = Field(
        1, ge=1, description="data-parallel learner ranks (torch.distributed on gloo, one gradient all-reduce), each taking a contiguous share "
        "of the micro-batches; 1 = update in the training process"
    )
    learner_sharding: Literal["none", "fsdp"] = Field(
        "none", description="with learner_ranks > 1: 'none' replicates the model and optimizer on rank 0 (one "
        "gradient all-reduce); 'fsdp' shards every decoder layer's parameters, gradients and AdamW state over the "
        "ranks (FSDP2, turnrl.scale.sharded; exact to the single process)"
    )
    sync_timeout_s: float = Field(
        120.0, gt=0.0, description="seconds a weight sync to the rollout workers, or a learner all-reduce, may take "
        "before the run stops with an error"
    )
    async_mode: bool = Field(
        False, description="generate the next steps' batches in a background thread while the learner updates "
        "(turnrl.scale.async_rollout); turns keep the weight version that sampled them; pair with algo.is_correction"
    )
    max_staleness: int = Field(
        1, ge=0, description="async mode: the most weight updates a trained turn may lag the learner by; the producer "
        "runs at most this many steps ahead and groups holding an older turn are dropped (rollout/stale_dropped); "
        "0 = no overlap"
    )

    @model_validator(mode="after")
    def _sharding_needs_ranks(self) -> "ScaleConfig":
        if self.learner_sharding != "none" and self.learner_ranks < 2:
            raise ValueError(f"scale.learner_sharding={self.learner_sharding} shards over learner ranks: set "
                             "scale.learner_ranks=2 or more, or scale.learner_sharding=none")
        return self
