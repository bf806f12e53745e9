"""Suggestions for an unknown key or value: the closest spelling, or another framework's name for the same knob."""

from __future__ import annotations

import difflib
from typing import Any, NamedTuple


class Alias(NamedTuple):
    """Another framework's name for a turnrl knob: the turnrl key(s) to suggest, and what differs."""

    keys: tuple[str, ...]
    source: str  # whose name it is: "TRL", "verl"
    note: str = ""

    def hint(self, name: str) -> str:
        keys, note = " or ".join(f"'{k}'" for k in self.keys), f": {self.note}" if self.note else ""
        return f" Did you mean {keys}? ({self.source}'s {name}{note})"


def _named_by(source: str, names: dict[str, str | tuple[str, str]]) -> dict[str, Alias]:
    """``{their name: "turnrl.key [turnrl.key2]" or (keys, note)}`` -> :class:`Alias` entries of ``source``."""
    return {name: Alias(tuple(keys.split()), source, note) for name, (keys, note) in
            ((n, (v, "") if isinstance(v, str) else v) for n, v in names.items())}


_PER_TURN = "per turn: the limit applies to each response of a multi-turn episode"
_MICRO = ("turnrl splits a batch into micro-batches of at most this many tokens and accumulates their gradients "
          "(the gradient does not depend on the split): set the memory budget, not a count")
_BETAS = "both betas as one pair, e.g. train.betas=[0.9,0.99]"

#: Other frameworks' names for turnrl's knobs, matched on the whole key (verl's dotted names) or on its last
#: component (``learning_rate``, ``train.learning_rate``). Used for suggestions only; docs/coming_from.md lists them.
ALIASES: dict[str, Alias] = {
    **_named_by("TRL", {  # GRPOConfig, PPOConfig and the Trainer's TrainingArguments
        "learning_rate": "train.lr", "num_generations": "rollout.group_size", "temperature": "rollout.temperature",
        "max_completion_length": ("rollout.max_new_tokens", _PER_TURN), "kl_estimator": "algo.kl_type",
        "max_prompt_length": ("rollout.max_context_tokens", "a longer prompt truncates the episode"),
        "beta": ("algo.kl_coef", "also set model.reference=true"), "num_iterations": "algo.ppo_epochs",
        "num_ppo_epochs": "algo.ppo_epochs", "epsilon": "algo.clip_low", "epsilon_high": "algo.clip_high",
        "cliprange": ("algo.clip_low algo.clip_high", "turnrl clips below and above 1 separately"), "cliprange_value": "algo.value_clip",
        "loss_type": ("algo.loss_agg", "grpo = seq-mean-token-mean, bnpo and dapo = token-mean, "
                                       "dr_grpo = seq-mean-token-sum-norm"),
        "scale_rewards": ("algo.norm_std", "false = Dr.GRPO"), "mask_truncated_completions": "algo.mask_overlong",
        "importance_sampling_level": ("algo.ratio_level", "sequence = GSPO"),
        "per_device_train_batch_size": ("rollout.tasks_per_step train.micro_batch_tokens",
                                        "there is no per-device batch: rollout.tasks_per_step sets a step's batch (x "
                                        "rollout.group_size episodes), train.micro_batch_tokens the memory of one "
                                        "forward/backward"),
        "gradient_accumulation_steps": ("train.micro_batch_tokens", _MICRO),
        "max_grad_norm": "train.grad_clip", "warmup_steps": "train.warmup_steps",
        "warmup_ratio": ("train.warmup_steps", "turnrl counts warm-up in steps"),
        "adam_beta1": ("train.betas", _BETAS), "adam_beta2": ("train.betas", _BETAS), "seed": "train.seed",
        "max_steps": "train.steps", "num_train_epochs": ("train.steps", "tasks are generated from seeds: no epochs"),
        "model_name_or_path": ("model.path", "'default' or a local Hugging Face model directory"),
        "bf16": "model.autocast_bf16", "output_dir": "log.run_dir", "run_name": "log.name",
        "save_steps": "log.checkpoint_every", "save_total_limit": "log.keep_checkpoints", "eval_steps": "eval.every",
        "report_to": ("log.tensorboard log.wandb log.mlflow", "one switch per tracker"),
    }),
    **_named_by("verl", {  # and verl-agent: dotted keys of its Hydra config
        **{f"actor_rollout_ref.actor.{name}": v for name, v in {
            "optim.lr": "train.lr", "optim.lr_warmup_steps": "train.warmup_steps", "optim.weight_decay": "train.weight_decay",
            "grad_clip": "train.grad_clip", "ppo_epochs": "algo.ppo_epochs", "entropy_coeff": "algo.entropy_coef",
            "ppo_mini_batch_size": ("rollout.tasks_per_step", "one optimizer step per batch and epoch: "
                                    "rollout.tasks_per_step tasks x rollout.group_size episodes"),
            "ppo_micro_batch_size_per_gpu": ("train.micro_batch_tokens", _MICRO),
            "ppo_max_token_len_per_gpu": "train.micro_batch_tokens", "clip_ratio": "algo.clip_low algo.clip_high",
            "clip_ratio_low": "algo.clip_low", "clip_ratio_high": "algo.clip_high", "clip_ratio_c": "algo.dual_clip",
            "use_kl_loss": ("algo.kl_coef model.reference", "the KL loss is on when algo.kl_coef > 0, with "
                                                            "model.reference=true"),
            "kl_loss_coef": "algo.kl_coef", "kl_loss_type": ("algo.kl_type", "low_var_kl = k3, kl = k1, mse = k2"),
            "loss_agg_mode": ("algo.loss_agg", "same mode names"),
        }.items()},
        "actor_rollout_ref.model.path": "model.path", "actor_rollout_ref.rollout.n": "rollout.group_size",
        "actor_rollout_ref.rollout.temperature": "rollout.temperature",
        "actor_rollout_ref.rollout.response_length": ("rollout.max_new_tokens", _PER_TURN),
        "data.train_batch_size": ("rollout.tasks_per_step", "tasks per step, each rolled out rollout.group_size times"),
        "data.max_prompt_length": "rollout.max_context_tokens",
        "data.max_response_length": ("rollout.max_new_tokens", _PER_TURN),
        "algorithm.adv_estimator": ("algo.estimator", "gae = ppo_token (with algo.critic=head), reinforce_plus_plus = "
                                                      "reinforce_pp"),
        "algorithm.gamma": ("algo.gamma_token algo.gamma", "turnrl discounts per token and per turn separately"),
        "algorithm.lam": "algo.lam", "algorithm.norm_adv_by_std_in_grpo": "algo.norm_std",
        "algorithm.use_kl_in_reward": ("algo.kl_in_reward", "on when algo.kl_in_reward > 0"),
        "algorithm.kl_ctrl.kl_coef": "algo.kl_in_reward", "algorithm.kl_ctrl.target_kl": "algo.kl_target",
        "algorithm.kl_ctrl.horizon": "algo.kl_horizon",
        "algorithm.filter_groups.max_num_gen_batches": "algo.dynamic_sampling_rounds",
        "critic.optim.lr": "algo.critic_lr", "critic.cliprange_value": "algo.value_clip",
        "trainer.total_training_steps": "train.steps", "trainer.save_freq": "log.checkpoint_every",
        "trainer.test_freq": "eval.every", "trainer.default_local_dir": "log.run_dir",
        "trainer.experiment_name": "log.name", "trainer.project_name": "log.wandb_project",
    }),
}

#: Other frameworks' names for turnrl's values of a key (suggestions only, like :data:`ALIASES`).
VALUE_ALIASES: dict[str, dict[str, str]] = {
    "algo.kl_type": {"low_var_kl": "k3", "kl": "k1", "mse": "k2"},
    "algo.estimator": {"gae": "ppo_token", "reinforce_plus_plus": "reinforce_pp",
                       "reinforce_plus_plus_baseline": "reinforce_pp_baseline"},
    "algo.loss_agg": {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
                      "dr_grpo": "seq-mean-token-sum-norm"},
}


def _value_hint(key: str, value: Any) -> str:
    known = VALUE_ALIASES.get(key, {}).get(value) if isinstance(value, str) else None
    return f" Did you mean '{known}'? ('{value}' is another framework's name for it)" if known else ""


def _closest(key: str) -> str:
    """`` Did you mean ...?`` for an unknown key: another framework's name for it, else the closest spelling."""
    from turnrl.config.schema import valid_keys  # the schema imports this module

    keys = valid_keys()
    leaf = key.rsplit(".", 1)[-1]
    near = difflib.get_close_matches(key, keys, n=1, cutoff=0.85)  # a typo of a turnrl key wins over a leaf alias
    if key in ALIASES or (leaf in ALIASES and not near):
        name = key if key in ALIASES else leaf
        return ALIASES[name].hint(name)
    leaves = {k.rsplit(".", 1)[-1]: k for k in reversed(keys)}  # `lr` -> `train.lr` (the first section's, if shared)
    match = (near or ([leaves[leaf]] if leaf in leaves else []) or difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
             or [leaves[m] for m in difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.6)])
    return f" Did you mean '{match[0]}'?" if match else ""
