"""One typed config for `turnrl train` / `turnrl eval`: YAML files plus ``key=value`` overrides.

Every field is documented here and nowhere else; ``turnrl train --help-config`` prints these docs.
Validation happens before any work: an unknown key or a bad value stops with a message that names the
key and, for a typo, the closest valid key.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config file or override is invalid. The message names the key and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    path: str = Field("default", description="'default' (embedded SmolLM2-135M-Instruct) or a local HF model directory")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="dtype of the master weights")
    autocast_bf16: bool = Field(True, description="run forward passes (generation and training) under bf16 autocast on CPU")
    reference: bool = Field(False, description="keep a frozen reference copy for KL (needed when algo.kl_coef > 0)")


class EnvConfig(_Section):
    id: str = Field("frozenlake-v0", description="registered env id, see `turnrl envs`")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the env constructor / wrappers")
    max_turns: int = Field(8, ge=1, description="turn limit per episode (truncation)")
    invalid_penalty: float = Field(0.1, ge=0.0, description="reward penalty for a turn with no valid action")
    progress_reward: float = Field(
        0.2, ge=0.0, description="dense shaping from the env's oracle per step of progress (0 = off; needs env.solve())"
    )


class RolloutConfig(_Section):
    engine: Literal["auto", "hf", "native", "vllm"] = Field(
        "auto",
        description="'auto': native for the models it runs, hf for the rest; 'hf': the reference engine (any HF "
        "causal LM); 'native': KV caches kept across turns and continuous batching (Llama/Mistral/Qwen2 models; "
        "bf16 when model.autocast_bf16); 'vllm': vLLM on a GPU (pip install 'turnrl[vllm]'; weights synced in "
        "place after every update)",
    )
    tasks_per_step: int = Field(4, ge=1, description="distinct tasks (seeds) per training step")
    group_size: int = Field(8, ge=1, description="episodes per task (GRPO group size)")
    context: Literal["per_step", "full"] = Field(
        "per_step", description="'per_step': rebuild the prompt each turn (flat context); 'full': one growing conversation"
    )
    history_turns: int = Field(0, ge=0, description="per_step: previous turns kept in the prompt")
    few_shot: bool = Field(True, description="put the env's example exchanges before the real turn")
    max_new_tokens: int = Field(6, ge=1, description="per-turn response token limit")
    max_context_tokens: int = Field(2048, ge=16, description="prompt budget; a longer prompt truncates the episode (context)")
    temperature: float = Field(1.0, gt=0.0, description="sampling temperature (the learner uses the same)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling; <1 makes sampling differ from the trained distribution")
    top_k: int = Field(0, ge=0, description="top-k sampling (0 = off)")


class AlgoConfig(_Section):
    estimator: str = Field("grpo_turn", description="advantage estimator, see `turnrl.credit.available_estimators()`")
    norm_std: bool = Field(True, description="GRPO: divide by the group std (False = Dr.GRPO)")
    gamma: float = Field(0.5, ge=0.0, le=1.0, description="turn discount for estimators that use per-turn returns")
    step_weight: float = Field(1.0, ge=0.0, description="GiGPO: weight of the anchor-state step-level advantage")
    clip_low: float = Field(0.2, ge=0.0, description="PPO ratio clip below 1")
    clip_high: float = Field(0.28, ge=0.0, description="PPO ratio clip above 1 (DAPO clip-higher)")
    dual_clip: float | None = Field(None, gt=1.0, description="dual-clip constant c > 1 for negative advantages (None = off)")
    ratio_level: Literal["token", "sequence"] = Field(
        "token", description="'token': PPO's per-token ratio; 'sequence': GSPO's length-normalised sequence ratio"
    )
    entropy_coef: float = Field(0.0, ge=0.0, description="entropy bonus coefficient (0 = entropy is only a metric)")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="how per-token losses are aggregated"
    )
    kl_coef: float = Field(0.0, ge=0.0, description="KL-to-reference loss coefficient (0 = off)")
    kl_type: Literal["k1", "k2", "k3", "k3+"] = Field("k3", description="KL estimator ('k3+': k3's value, k2's gradient)")
    ppo_epochs: int = Field(1, ge=1, description="passes over each batch")
    prm: str = Field("", description="process-reward model 'package.module:function(trajectory, turn) -> float' ('' = none)")
    prm_weight: float = Field(1.0, description="weight of the process-reward model's score in each turn's reward")
    reward_clip: float = Field(0.0, ge=0.0, description="clip every turn reward to [-c, c] before credit (0 = off)")
    dynamic_sampling_rounds: int = Field(
        1, ge=1, description="DAPO dynamic sampling: up to N rounds of fresh tasks to fill the batch with groups whose rewards vary (1 = off)"
    )
    group_keep_fraction: float = Field(
        1.0, gt=0.0, le=1.0, description="train only on this top fraction of groups by reward spread (zero-spread groups never)"
    )
    mask_overlong: bool = Field(False, description="zero the advantage of responses cut by rollout.max_new_tokens")
    skip_zero_advantage: bool = Field(
        True, description="drop samples whose advantages are all zero (no policy gradient) before training"
    )
    critic: Literal["none", "head", "separate"] = Field(
        "none", description="learned value function for the GAE estimators (ppo_token/ppo_turn/ppo_bilevel): 'head' = "
        "a linear value head on the policy's last hidden state, trained jointly; 'separate' = a copy of the base model with a scalar head"
    )
    vf_coef: float = Field(0.5, ge=0.0, description="value-loss coefficient")
    value_clip: float = Field(0.2, ge=0.0, description="PPO value clipping: |V - V_old| <= c in the value loss (0 = off)")
    critic_lr: float = Field(5e-5, gt=0.0, description="learning rate of the value head ('head') or the whole value model ('separate')")
    lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda")
    gamma_token: float = Field(1.0, ge=0.0, le=1.0, description="per-token discount of token-level GAE and within a turn (bi-level)")
    whiten_advantages: bool = Field(True, description="GAE estimators: whiten advantages over the batch's response tokens")
    kl_in_reward: float = Field(
        0.0, ge=0.0, description="beta of a KL(pi || ref) penalty subtracted from each turn's reward before credit (0 = off; needs model.reference)"
    )
    kl_target: float = Field(0.0, ge=0.0, description="adaptive KL-in-reward controller's target KL per turn (0 = fixed beta; Ziegler et al. 2019)")
    kl_horizon: int = Field(10000, ge=1, description="adaptive KL controller horizon (in turns)")
    reward_norm: Literal["none", "running"] = Field(
        "none", description="'running': divide turn rewards by a running (Welford) std over all steps, saved in checkpoints"
    )
    gigpo_similarity: float = Field(
        1.0, gt=0.0, le=1.0, description="GiGPO: anchors with token-Jaccard similarity >= this share a step-level group (1.0 = exact match)"
    )


class TrainConfig(_Section):
    steps: int = Field(40, ge=0, description="training steps (collect -> advantages -> update)")
    lr: float = Field(2e-5, gt=0.0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0.0)
    betas: tuple[float, float] = Field((0.9, 0.99))
    warmup_steps: int = Field(0, ge=0, description="linear LR warm-up steps")
    grad_clip: float = Field(1.0, gt=0.0, description="max global gradient norm")
    micro_batch_tokens: int = Field(
        2048, ge=64, description="token budget of one micro-batch (gradient accumulation); sets activation memory"
    )
    seed: int = Field(0, description="seed of every RNG (sampling, task order, init)")
    seed_start: int = Field(0, ge=0, description="first training task seed; tasks are seed_start, seed_start+1, ...")
    max_minutes: float = Field(0.0, ge=0.0, description="stop (and evaluate) after this wall time; 0 = no limit")
    threads: int = Field(0, ge=0, description="torch threads (0 = all cores)")


class EvalConfig(_Section):
    every: int = Field(5, ge=0, description="evaluate every N steps (0 = only at start and end)")
    num_tasks: int = Field(64, ge=1, description="held-out tasks per evaluation")
    seed_start: int = Field(1_000_000, ge=0, description="first eval seed; must not overlap training seeds")
    greedy: bool = Field(True, description="greedy decoding in evaluation")
    at_start: bool = Field(True, description="evaluate the untrained model before step 1")
    env_id: str = Field("", description="evaluate on this env instead of env.id: a trusted verifier next to a training one")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="constructor keywords for eval.env_id (default: env.kwargs)")


class LogConfig(_Section):
    run_dir: str = Field("runs", description="parent directory of run directories")
    name: str = Field("", description="run name (default: env-estimator-timestamp)")
    tensorboard: bool = Field(True)
    progress: bool = Field(True, description="show a progress bar")
    checkpoint_every: int = Field(10, ge=0, description="save a checkpoint every N steps (0 = only at the end)")
    checkpoint_at_end: bool = Field(True, description="save a checkpoint when the last step or train.max_minutes is "
                                                      "reached (false: runs that keep only metrics, such as benchmarks; a "
                                                      "monitor 'stop' action still checkpoints)")
    keep_checkpoints: int = Field(2, ge=1, description="how many recent checkpoints to keep")
    sample_trajectories: int = Field(4, ge=0, description="trajectories per step written to trajectories.jsonl")
    report: bool = Field(True, description="write RUN/report.html (curves, alerts, trajectory viewer) when training ends or stops")
    wandb: bool = Field(False, description="also log metrics to Weights & Biases (pip install 'turnrl[wandb]'; "
                                           "WANDB_MODE=offline keeps them local)")
    wandb_project: str = Field("turnrl", description="W&B project (the run is named after the run directory)")
    mlflow: bool = Field(False, description="also log metrics to MLflow (pip install 'turnrl[mlflow]')")
    mlflow_tracking_uri: str = Field("", description="MLflow tracking URI, e.g. http://host:5000 (empty: MLflow's own "
                                                     "default, MLFLOW_TRACKING_URI if set)")
    mlflow_experiment: str = Field("turnrl", description="MLflow experiment name")


class MonitorConfig(_Section):
    detectors: bool = Field(True, description="run the pathology detectors (collapse, KL blow-up, reward hacking, ...)")
    on_alert: Literal["warn", "stop", "rollback"] = Field(
        "warn",
        description="on an alert: 'warn' (log it to alerts.jsonl and the terminal), 'stop' (checkpoint and stop) or "
        "'rollback' (restore the last checkpoint saved before any alert, drop the bad steps' updates, go on with new tasks)",
    )
    actions: dict[str, Literal["warn", "stop", "rollback"]] = Field(
        default_factory=dict, description="per-detector override of on_alert, e.g. {reward_hacking: stop, grad_spike: rollback}"
    )
    max_rollbacks: int = Field(3, ge=0, description="after this many rollbacks, a rollback alert stops the run instead")

    @model_validator(mode="after")
    def _known_detectors(self) -> "MonitorConfig":
        from turnrl.monitor.detectors import default_detectors

        names = [d.name for d in default_detectors()]
        for name in self.actions:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f" Did you mean '{close[0]}'?" if close else ""
                raise ValueError(f"monitor.actions names an unknown detector '{name}'.{hint} Detectors: {', '.join(names)}")
        return self


class Config(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)

    @model_validator(mode="after")
    def _consistent(self) -> "Config":
        from turnrl.credit import available_estimators

        if self.algo.estimator not in available_estimators():
            close = difflib.get_close_matches(self.algo.estimator, available_estimators(), n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ValueError(f"algo.estimator={self.algo.estimator!r} is not a registered estimator.{hint} "
                             f"Valid: {', '.join(available_estimators())}")
        if self.algo.kl_coef > 0 and not self.model.reference:
            raise ValueError("algo.kl_coef > 0 needs a reference model: set model.reference=true")
        if self.algo.kl_in_reward > 0 and not self.model.reference:
            raise ValueError("algo.kl_in_reward > 0 needs a reference model: set model.reference=true")
        from turnrl.credit import estimator_flag, get_estimator

        needs_critic = estimator_flag(get_estimator(self.algo.estimator), "needs_critic")
        if needs_critic and self.algo.critic == "none":
            raise ValueError(f"algo.estimator={self.algo.estimator!r} needs a learned critic: set algo.critic=head (or separate)")
        if not needs_critic and self.algo.critic != "none":
            raise ValueError(f"algo.critic={self.algo.critic!r} is only used by the GAE estimators (ppo_token, ppo_turn, "
                             f"ppo_bilevel), not {self.algo.estimator!r}: set algo.critic=none or pick one of them")
        train_end = self.train.seed_start + self.train.steps * self.rollout.tasks_per_step * self.algo.dynamic_sampling_rounds
        if self.train.seed_start <= self.eval.seed_start < train_end:
            raise ValueError(
                f"eval.seed_start={self.eval.seed_start} overlaps training seeds [{self.train.seed_start}, {train_end}): "
                "held-out evaluation must use unseen seeds; raise eval.seed_start"
            )
        return self


def _all_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_all_keys(ann, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return keys


def valid_keys() -> list[str]:
    return _all_keys(Config)


def _closest(key: str) -> str:
    keys = valid_keys()
    match = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    if not match:  # try on the last component alone: `lr` -> `train.lr`
        leaf = key.rsplit(".", 1)[-1]
        match = [k for k in keys if k.rsplit(".", 1)[-1] == leaf] or difflib.get_close_matches(
            leaf, [k.rsplit(".", 1)[-1] for k in keys], n=1, cutoff=0.6
        )
        if match and "." not in match[0]:
            match = [k for k in keys if k.endswith("." + match[0])]
    return f" Did you mean '{match[0]}'?" if match else ""


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"'{key}': '{p}' is a value, not a section.{_closest(key)}")
        node = nxt
    node[parts[-1]] = value


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override '{item}' is not key=value (example: train.lr=1e-5)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key.startswith("env.kwargs.") and key not in valid_keys():
        raise ConfigError(f"unknown config key '{key}'.{_closest(key)} Run `turnrl train --help-config` for all keys.")
    return key, yaml.safe_load(raw) if raw != "" else ""


def _format_validation(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown config key '{key}'.{_closest(key)}")
        elif key:
            lines.append(f"'{key}': {e['msg']} (got {e.get('input')!r})")
        else:
            lines.append(e["msg"].removeprefix("Value error, "))
    return "invalid config: " + "; ".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build the config from an optional YAML file and ``key=value`` overrides (later wins)."""
    tree: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        try:
            tree = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(tree).__name__}")
    for item in overrides:
        key, value = _parse_override(item)
        _set_dotted(tree, key, value)
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation(e)) from None


def config_help() -> str:
    lines = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
            else:
                default = field.default if field.default_factory is None else field.default_factory()
                lines.append(f"  {prefix}{name} = {default!r}\n      {field.description or ''}")

    walk(Config, "")
    return "\n".join(lines)
