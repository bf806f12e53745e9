"""The ``lora`` config section: low-rank adapters (LoRA) instead of full fine-tuning (``docs/lora.md``)."""

from __future__ import annotations

from pydantic import Field, field_validator

from turnrl.config.section import Section

#: The attention and MLP projections of the Llama family (Llama, Mistral, Qwen2, the embedded SmolLM2).
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(Section):
    enabled: bool = Field(
        False, description="train low-rank adapters on the frozen base weights instead of every weight; the KL reference "
        "is then the base (the adapter disabled, no second copy) and checkpoints hold only the adapter (docs/lora.md)"
    )
    rank: int = Field(16, ge=1, description="r, the inner dimension of each adapter: W + (alpha / r) * B A, A (r x in), B (out x r)")
    alpha: float = Field(32.0, gt=0.0, description="the adapter's scale numerator: the update is (alpha / r) * B A "
                                                   "(alpha / sqrt(r) with use_rslora)")
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="dropout on the adapter's input in the learner's forward passes only; > 0 makes "
        "the learner's logprobs differ from the engine's, so on-policy PPO ratios are no longer exactly 1"
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(LLAMA_PROJECTIONS),
        description="names of the linear layers that get an adapter (the last part of the module name, as peft "
        "matches them); default: the Llama family's attention and MLP projections",
    )
    use_rslora: bool = Field(False, description="rank-stabilised LoRA (Kalajdzievski 2023): scale by alpha / sqrt(r) "
                                                "instead of alpha / r")

    @field_validator("target_modules")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        if not names:
            raise ValueError("lora.target_modules is empty: name at least one linear layer, e.g. [q_proj, v_proj]")
        bad = [n for n in names if not n.replace(".", "_").isidentifier()]
        if bad:
            raise ValueError(f"lora.target_modules: {bad[0]!r} is not a module name; give names such as q_proj")
        if len(set(names)) != len(names):
            raise ValueError(f"lora.target_modules names a module twice: {names}")
        return names
