"""The config's schema: one pydantic section per part of a run, each field documented once, with the checks
that span sections (:meth:`Config._consistent`)."""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from turnrl.config.curriculum import CurriculumConfig
from turnrl.config.experience import ExperienceConfig
from turnrl.config.hierarchy import HierarchyConfig
from turnrl.config.lora import LoraConfig
from turnrl.config.memory import MemoryConfig
from turnrl.config.multiagent import MultiAgentConfig
from turnrl.config.names import _value_hint
from turnrl.config.scale import ScaleConfig
from turnrl.config.section import Section
from turnrl.config.serve import ServeConfig
from turnrl.config.sft import SftConfig


class ConfigError(ValueError):
    """A config file or override is invalid. The message names the key and the fix."""


_Beta = Annotated[float, Field(ge=0.0, lt=1.0)]


class ModelConfig(Section):
    path: str = Field("default", description="'default' (embedded SmolLM2-135M-Instruct) or a local HF model directory")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="dtype of the master weights")
    autocast_bf16: bool | Literal["auto"] = Field(
        "auto", description="run forward passes (generation and training) under bf16 autocast on CPU; 'auto' = on where "
        "this CPU multiplies bf16 matrices clearly faster than fp32 (bf16 units: AMX, AVX512-BF16), off where bf16 is "
        "emulated and several times slower (AVX2-only CPUs) (docs/speed.md)"
    )
    reference: bool = Field(False, description="keep a frozen reference copy for KL (needed when algo.kl_coef > 0)")


class EnvConfig(Section):
    id: str = Field("frozenlake-v0", description="registered env id, see `turnrl envs`")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the env constructor / wrappers")
    max_turns: int = Field(8, ge=1, description="turn limit per episode (truncation)")
    invalid_penalty: float = Field(0.1, ge=0.0, description="reward penalty for a turn with no valid action")
    reward: Literal["env", "success"] = Field(
        "env", description="'env': the env's own reward (e.g. WebShop's partial credit for a near miss); 'success': 1 "
        "on the turn that solves the task, else 0, the binary verifiable reward (progress_reward and invalid_penalty "
        "shaping still add; docs/envs.md)"
    )
    progress_reward: float = Field(
        0.2, ge=0.0, description="dense shaping from the env's oracle per step of progress (0 = off; needs env.solve())"
    )
    step_timeout_s: float = Field(
        60.0, ge=0.0, description="an env reset or step that takes longer ends its episode as an env error (0 = no limit)"
    )


class RolloutConfig(Section):
    engine: Literal["auto", "hf", "native", "vllm"] = Field(
        "auto",
        description="'auto': native for the models it runs, hf for the rest; 'hf': the reference engine (any HF "
        "causal LM); 'native': KV caches kept across turns and continuous batching (Llama/Mistral/Qwen2 models; "
        "bf16 when model.autocast_bf16); 'vllm': vLLM on a GPU (pip install 'turnrl[vllm]'; weights synced in "
        "place after every update)",
    )
    tasks_per_step: int = Field(4, ge=1, description="distinct tasks (seeds) per training step")
    group_size: int = Field(8, ge=1, description="episodes per task (GRPO group size)")
    context: Literal["per_step", "full", "budgeted"] = Field(
        "per_step", description="'per_step': rebuild the prompt each turn (flat context); 'full': one growing "
        "conversation; 'budgeted': every turn since the start (or the last compress summary), the oldest dropped past "
        "rollout.budget_tokens, the budget left shown each turn (docs/memory.md)"
    )
    budget_tokens: int = Field(0, ge=0, description="budgeted: the prompt budget past which the oldest turns are "
                                                   "dropped (0 = unset; must be set for budgeted, <= max_context_tokens)")
    history_turns: int = Field(0, ge=0, description="per_step: previous turns kept in the prompt")
    few_shot: bool = Field(True, description="put the env's example exchanges before the real turn")
    max_new_tokens: int = Field(6, ge=1, description="per-turn response token limit")
    max_context_tokens: int = Field(2048, ge=16, description="prompt budget; a longer prompt truncates the episode (context)")
    max_observation_tokens: int = Field(
        2048, ge=1, description="an observation longer than this is cut (before it is tokenized whole) and the cut is recorded"
    )
    temperature: float = Field(1.0, gt=0.0, description="sampling temperature (the learner uses the same)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling; <1 makes sampling differ from the trained distribution")
    top_k: int = Field(0, ge=0, description="top-k sampling (0 = off)")


class AlgoConfig(Section):
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
    is_correction: Literal["none", "decoupled", "tis", "mis"] = Field(
        "none", description="off-policy correction for stale (scale.async_mode) or mismatched engine logprobs: 'none' = "
        "PPO's ratio against the behaviour logprobs; otherwise decoupled PPO, the ratio against the learner's own "
        "logprobs before the update and each token weighted by w = pi_learner / pi_behaviour: 'decoupled' = w as is, "
        "'tis' = min(w, is_cap), 'mis' = w where 1/is_cap <= w <= is_cap, else 0 (docs/algorithms.md)"
    )
    is_level: Literal["token", "sequence"] = Field(
        "token", description="the correction's w per token, or per sample ('sequence': the geometric mean over its tokens)"
    )
    is_cap: float = Field(2.0, gt=1.0, description="C of algo.is_correction: tis truncates w at C, mis keeps [1/C, C]")
    entropy_coef: float = Field(0.0, ge=0.0, description="entropy bonus coefficient (0 = entropy is only a metric)")
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="how per-token losses are aggregated"
    )
    kl_coef: float = Field(0.0, ge=0.0, description="KL-to-reference loss coefficient (0 = off)")
    kl_type: Literal["k1", "k2", "k3", "k3+"] = Field("k3", description="KL estimator ('k3+': k3's value, k2's gradient)")
    kl_clamp: float = Field(
        10.0, ge=0.0, description="clamp the k3 / k3+ estimate to [-c, c] per token, as verl's low_var_kl does with 10; "
        "where it clamps, k3's gradient is 0 and k3+ keeps k2's (0 = off)"
    )
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
    fused_value: bool = Field(True, description="critic=head: compute the value loss on the policy's own forward pass "
                              "(the same gradient, one pass fewer); false: a separate pass")
    lam: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda")
    gamma_token: float = Field(1.0, ge=0.0, le=1.0, description="per-token discount of token-level GAE and within a turn (bi-level)")
    whiten_advantages: bool = Field(True, description="GAE estimators: whiten advantages over the batch's response tokens")
    whiten_std: Literal["population", "unbiased"] = Field(
        "population", description="std of batch whitening (GAE estimators and REINFORCE++): 'population' (divide by n, "
        "OpenRLHF's advantage normalisation) or 'unbiased' (n - 1, TRL's and verl's masked_whiten)"
    )
    kl_in_reward: float = Field(
        0.0, ge=0.0, description="beta of a KL(pi || ref) penalty subtracted from each turn's reward before credit (0 = off; needs model.reference)"
    )
    kl_target: float = Field(0.0, ge=0.0, description="adaptive KL-in-reward controller's target KL per turn (0 = fixed beta; Ziegler et al. 2019)")
    kl_horizon: int = Field(10000, ge=1, description="adaptive KL controller horizon (in turns)")
    reward_norm: Literal["none", "running"] = Field(
        "none", description="'running': divide turn rewards by a running (Welford) std over all steps, saved in checkpoints"
    )
    gigpo_similarity: float = Field(
        1.0, gt=0.0, le=1.0, description="GiGPO: anchors whose difflib character similarity ratio is >= this share a "
        "step-level group (1.0 = exact match)"
    )
    gigpo_pooling: Literal["trajectory", "step"] = Field(
        "trajectory", description="GiGPO episode-level statistics: 'trajectory' = one reward per trajectory (the paper); "
        "'step' = one per step row, so a trajectory counts once per turn it took (verl-agent's implementation)"
    )
    demo_coef: float = Field(
        0.0, ge=0.0, description="demonstration-guided RL: weight c of the auxiliary NLL on demonstration tokens, "
        "loss = policy loss + c * demo NLL, logged as train/demo_nll (0 = off; docs/algorithms.md)"
    )
    demo_file: str = Field("", description="algo.demo_coef > 0: the demonstration JSONL (docs/demos.md; `turnrl sft` "
                                           "writes RUN/demos.jsonl)")
    demo_batch: int = Field(8, ge=1, description="demonstration samples in each step's auxiliary loss (cycled in order)")


class TrainConfig(Section):
    steps: int = Field(40, ge=0, description="training steps (collect -> advantages -> update)")
    lr: float = Field(2e-5, gt=0.0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay (0 = none)")
    betas: tuple[_Beta, _Beta] = Field((0.9, 0.99), description="AdamW decay rates of the gradient's moments, each in [0, 1)")
    warmup_steps: int = Field(0, ge=0, description="linear LR warm-up steps")
    grad_clip: float = Field(1.0, gt=0.0, description="max global gradient norm")
    micro_batch_tokens: int = Field(
        512, ge=64, description="token budget of one micro-batch (gradient accumulation; the same gradient for any "
        "budget); sets activation memory. 512 keeps the default recipe under 4 GB, and ran a moving policy's update "
        "1.3x faster than 2048 (docs/speed.md)"
    )
    group_by_prompt: bool = Field(True, description="split the batch by prompt before packing micro-batches, where that "
                                  "runs fewer positions (each group's shared prefix computed once; the same gradient; "
                                  "docs/speed.md); false: one group, every micro-batch sharing only the batch's prefix")
    prefix_once: bool = Field(True, description="run the prompt prefix the whole batch shares once per update, its "
                              "gradient summed over the micro-batches (the same gradient; one process only, "
                              "docs/speed.md); false: once per micro-batch")
    seed: int = Field(0, ge=0, lt=2**32, description="seed of every RNG (sampling, task order, init)")
    seed_start: int = Field(0, ge=0, description="first training task seed; tasks are seed_start, seed_start+1, ...")
    max_minutes: float = Field(0.0, ge=0.0, description="stop (and evaluate) after this wall time; 0 = no limit")
    threads: int = Field(0, ge=0, description="torch threads (0 = all cores, or $OMP_NUM_THREADS when set)")
    freeze_layers: int = Field(0, ge=0, description="freeze the embeddings and the first N decoder layers: they run "
                               "forward only and get no update (the gradient of the rest is exact; docs/speed.md)")
    prompt_grad: bool = Field(True, description="false: each micro-batch's context before its first predicting position "
                              "runs without autograd, so the gradient ignores the path through the context's keys and "
                              "values (an approximation, faster; docs/speed.md)")
    activation_checkpointing: bool | Literal["auto"] = Field(
        "auto", description="keep only each decoder layer's input for the backward and recompute the layer there: the "
        "same gradient, much less update memory (default recipe in fp32, with the heap threshold 'auto' sets: 7.6 -> "
        "3.3 GB), about 1.3x the update time; 'auto' = on when the machine (or its container) has less than 8 GB of "
        "memory (docs/speed.md)"
    )
    heap_mmap_threshold_kb: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto", description="glibc: blocks above this many KiB get a mapping of their own, returned to the OS when "
        "freed, instead of staying in the heap (0 = glibc's own threshold, which rises as large blocks are freed); "
        "process-wide; 'auto' = 4096 when activation checkpointing is on, else 0 (docs/speed.md)"
    )


class EvalConfig(Section):
    every: int = Field(5, ge=0, description="evaluate every N steps (0 = only at start and end)")
    num_tasks: int = Field(64, ge=1, description="held-out tasks per evaluation")
    seed_start: int = Field(1_000_000, ge=0, description="first eval seed; must not overlap training seeds (training "
                            "also skips any seed whose task key is held out)")
    greedy: bool = Field(True, description="greedy decoding in evaluation")
    at_start: bool = Field(True, description="evaluate the untrained model before step 1")
    env_id: str = Field("", description="evaluate on this env instead of env.id: a trusted verifier next to a training one")
    env_kwargs: dict[str, Any] = Field(default_factory=dict, description="constructor keywords for eval.env_id (default: env.kwargs)")
    stop_at_success: float = Field(0.0, ge=0.0, le=1.0, description="end training at the first evaluation whose held-out "
                                   "success reaches this (0 = never): early stopping, and time-to-bar benchmarks")


class LogConfig(Section):
    run_dir: str = Field("runs", description="parent directory of run directories")
    name: str = Field("", description="run name (default: env-estimator-timestamp)")
    tensorboard: bool = Field(True, description="also write TensorBoard events under RUN/tb/")
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


class MonitorConfig(Section):
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


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)
    experience: ExperienceConfig = Field(default_factory=ExperienceConfig)
    sft: SftConfig = Field(default_factory=SftConfig)
    scale: ScaleConfig = Field(default_factory=ScaleConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    multiagent: MultiAgentConfig = Field(default_factory=MultiAgentConfig)
    hierarchy: HierarchyConfig = Field(default_factory=HierarchyConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)

    @model_validator(mode="after")
    def _consistent(self) -> "Config":
        from turnrl.credit import available_estimators

        if self.algo.estimator not in available_estimators():
            close = difflib.get_close_matches(self.algo.estimator, available_estimators(), n=1, cutoff=0.5)
            hint = _value_hint("algo.estimator", self.algo.estimator) or (f" Did you mean '{close[0]}'?" if close else "")
            raise ValueError(f"algo.estimator={self.algo.estimator!r} is not a registered estimator.{hint} "
                             f"Valid: {', '.join(available_estimators())}")
        if self.algo.kl_coef > 0 and not self.model.reference:
            raise ValueError("algo.kl_coef > 0 needs a reference model: set model.reference=true")
        if self.algo.kl_in_reward > 0 and not self.model.reference:
            raise ValueError("algo.kl_in_reward > 0 needs a reference model: set model.reference=true")
        if self.algo.demo_coef > 0 and not self.algo.demo_file:
            raise ValueError("algo.demo_coef > 0 needs demonstrations: set algo.demo_file=FILE.jsonl (`turnrl sft` writes "
                             "RUN/demos.jsonl; docs/demos.md)")
        if self.sft.demo_levels == "all" and not self.curriculum.enabled:
            raise ValueError("sft.demo_levels=all draws demonstrations at every curriculum level, and the curriculum is "
                             "off: set curriculum.enabled=true with its levels (docs/curriculum.md), or sft.demo_levels=start")
        if self.sft.demo_levels == "all" and self.sft.demos == "file":
            raise ValueError("sft.demo_levels=all draws the oracle's or sampled demonstrations at every level; a file's "
                             "are what it holds: set sft.demos=oracle (or sample), or sft.demo_levels=start")
        from turnrl.credit import estimator_flag, get_estimator

        needs_critic = estimator_flag(get_estimator(self.algo.estimator), "needs_critic")
        if needs_critic and self.algo.critic == "none":
            raise ValueError(f"algo.estimator={self.algo.estimator!r} needs a learned critic: set algo.critic=head (or separate)")
        if not needs_critic and self.algo.critic != "none":
            raise ValueError(f"algo.critic={self.algo.critic!r} is only used by the GAE estimators (ppo_token, ppo_turn, "
                             f"ppo_bilevel), not {self.algo.estimator!r}: set algo.critic=none or pick one of them")
        return self

    @model_validator(mode="after")
    def _runnable(self) -> "Config":
        """What would otherwise fail after the run directory exists: no steps, an ``algo.prm`` that does not import
        (errors raised by its module's own code propagate), training seeds (every dynamic-sampling round of every
        step) that overlap the held-out seeds."""
        if self.train.steps == 0:
            raise ValueError("train.steps=0 trains nothing; to measure a model without training it, run `turnrl eval` "
                             "(the base model) or `turnrl eval --checkpoint RUN`")
        if self.algo.prm:
            from turnrl.credit.rewards import load_prm

            try:
                load_prm(self.algo.prm)
            except ImportError as e:
                raise ValueError(f"algo.prm={self.algo.prm!r} does not import ({e}); make its module importable: run "
                                 "turnrl from the directory that holds it, or install it") from None
        t0, e0 = self.train.seed_start, self.eval.seed_start
        t1, e1 = t0 + self.train.steps * self.rollout.tasks_per_step * self.algo.dynamic_sampling_rounds, e0 + self.eval.num_tasks
        if t0 < e1 and e0 < t1:
            raise ValueError(f"training seeds [{t0}, {t1}) and eval seeds [{e0}, {e1}) overlap: held-out evaluation must use "
                             f"unseen seeds; set eval.seed_start={t1} (or more) or train.seed_start={e1} (or more)")
        return self


# ---------------------------------------------------------------------------------------------- keys and names


def _fields() -> list[tuple[str, str, str, Any]]:
    """``(dotted key, section, name, FieldInfo)`` of every key, in declaration order."""
    return [(f"{section}.{name}", section, name, field)
            for section, sfield in Config.model_fields.items() for name, field in sfield.annotation.model_fields.items()]


def valid_keys() -> list[str]:
    return [key for key, *_ in _fields()]
