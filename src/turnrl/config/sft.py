"""The ``sft`` config section: supervised fine-tuning on demonstrations, ``turnrl sft`` (``docs/demos.md``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from turnrl.config.section import Section


class SftConfig(Section):
    demos: Literal["oracle", "file", "sample"] = Field(
        "oracle", description="where demonstrations come from: 'oracle' (the env's own plan, Env.solve(), played "
        "through the collector), 'file' (sft.demo_file: a demonstration set, or a run directory whose successful "
        "recorded trajectories are taken), 'sample' (rejection sampling: the model's own successful episodes, "
        "sft.attempts per task); always on training tasks, never on held-out task keys"
    )
    demo_levels: Literal["start", "all"] = Field(
        "start", description="with curriculum.enabled, which levels the oracle and sampled demonstrations are drawn at: "
        "'start' (curriculum.start's), 'all' (sft.num_demos split evenly over every level, easiest first), so SFT "
        "shows the policy each difficulty RL will meet"
    )
    demo_file: str = Field("", description="sft.demos=file: a demonstration JSONL (docs/demos.md) or a training run "
                                           "directory (its trajectories.jsonl)")
    num_demos: int = Field(64, ge=1, description="demonstrations (successful episodes, on distinct training tasks) to train on")
    attempts: int = Field(4, ge=1, description="sft.demos=sample: episodes sampled per task; the successful ones are kept")
    steps: int = Field(50, ge=1, description="SFT optimizer steps")
    max_minutes: float = Field(0.0, ge=0.0, description="stop (then evaluate and checkpoint) after the step during which "
                                                       "the SFT run's wall time (demonstrations and the first evaluation "
                                                       "included) passed this many minutes; 0 = no limit")
    batch_size: int = Field(16, ge=1, description="training samples (turns under per_step, episodes under full) per step")
    lr: float = Field(5e-5, gt=0.0, description="AdamW learning rate of SFT (train.* sets the rest of the optimizer)")

    @model_validator(mode="after")
    def _file_named(self) -> "SftConfig":
        if self.demos == "file" and not self.demo_file:
            raise ValueError("sft.demos=file needs sft.demo_file=FILE.jsonl (or a training run directory)")
        return self
