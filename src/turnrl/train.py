"""The training loop, readable top to bottom.

    for step in steps:
        groups     = collect_step(step)                            # multi-turn rollouts, exact token ids;
                                                                   # seeds are a pure function of the step
        advantages = assign_credit(groups)                         # one signature for every estimator
        samples    = build_samples(trajectories, advantages)       # loss mask on the model's own tokens
        learner.update(samples)                                    # micro-batches, grad accumulation, clip
        engine.sync_weights()                                      # the engine samples from the new weights
        monitor.after_step(...)                                    # metrics, trajectories, detectors -> go/stop/rollback
        evaluate on held-out seeds every `eval.every` steps; checkpoint every `log.checkpoint_every`

What it implements, plainly: on-policy policy gradient with a PPO-clip surrogate against the engine's
behaviour logprobs (one optimizer step per batch by default, so the ratio is 1 up to bf16 noise and the
clip only matters with ``ppo_epochs > 1``), per-turn advantages from the configured estimator (the
default ``grpo_turn`` gives each turn its own from discounted turn returns; episode-level estimators give
every turn of a trajectory the same value), each spread over that turn's response tokens, and no KL term
unless ``algo.kl_coef > 0``.

Components come from :mod:`turnrl.build`; everything recorded or watched goes through
:class:`turnrl.monitor.monitor.Monitor`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import yaml

from turnrl import checkpoint, credit
from turnrl.build import Components, build, sampling_params
from turnrl.config import Config
from turnrl.credit.filters import apply_group_mask, keep_informative_groups, mask_overlong
from turnrl.credit.rewards import apply_process_rewards, clip_rewards, load_prm
from turnrl.engines import SamplingParams
from turnrl.learner import ValueBatch, build_samples
from turnrl.monitor.metrics import eval_metrics, rollout_metrics, step_metrics
from turnrl.monitor.monitor import Monitor
from turnrl.types import Advantages, TrajectoryGroup


def train(cfg: Config, resume: Path | None = None, components: Components | None = None, run_dir: Path | None = None) -> Path:
    """Run (or continue) training; returns the run directory."""
    c = components or build(cfg)
    run_dir = Path(resume) if resume else (run_dir or make_run_dir(cfg))
    start = restore(c, _latest(run_dir), rng=True) if resume else 0
    monitor = Monitor(run_dir, cfg, start, c.tokenizer)
    estimator = credit.get_estimator(cfg.algo.estimator)
    params = credit_params(cfg)
    sampling = sampling_params(cfg)
    prm = load_prm(cfg.algo.prm) if cfg.algo.prm else None
    t_start = time.perf_counter()

    if resume:
        monitor.saved(checkpoint.latest_checkpoint(run_dir))
    elif monitor.may_roll_back:  # a rollback needs a checkpoint from before any alert
        monitor.saved(save(c, run_dir, start))
    if start == 0 and cfg.eval.at_start:
        monitor.log(0, evaluate(c))
    for step in range(start, cfg.train.steps):
        t0 = time.perf_counter()
        groups, collected = collect_step(c, step, sampling)
        t_rollout = time.perf_counter() - t0
        trajectories = [t for g in groups for t in g.trajectories]
        step_params = credit_inputs(c, groups, estimator, params)  # critic values / greedy baselines, if declared
        advantages = assign_credit(c, groups, estimator, step_params, prm)
        samples = build_samples(trajectories, advantages)
        if cfg.algo.skip_zero_advantage and cfg.algo.kl_coef == 0 and cfg.algo.entropy_coef == 0:
            samples = [s for s in samples if any(a != 0.0 for a in s.advantages)]
        t1 = time.perf_counter()
        metrics = c.learner.update(samples, value_batch(c, groups, estimator, step_params))
        metrics.update(c.shaper.last_metrics if c.shaper else {})
        t_train = time.perf_counter() - t1
        c.engine.sync_weights()

        metrics.update(rollout_metrics(collected))
        metrics["rollout/train_groups"] = float(len(groups))
        metrics["rollout/collected_groups"] = float(len(collected))
        metrics.update(step_metrics(advantages, samples, c.collector.stats, t_rollout, t_train, t_start))
        done = step + 1
        out_of_time = cfg.train.max_minutes > 0 and (time.perf_counter() - t_start) > 60 * cfg.train.max_minutes
        if (cfg.eval.every and done % cfg.eval.every == 0) or done == cfg.train.steps or out_of_time:
            metrics.update(evaluate(c))
        action = monitor.after_step(done, metrics, groups, advantages, samples)
        if action == "rollback":  # the bad steps' weights are gone; the step counter (hence the task seeds) moves on
            monitor.rolled_back(done, restore(c, monitor.rollback_target), metrics)
            continue
        at_end = (done == cfg.train.steps or out_of_time) and cfg.log.checkpoint_at_end
        if (cfg.log.checkpoint_every and done % cfg.log.checkpoint_every == 0) or at_end or action == "stop":
            monitor.saved(save(c, run_dir, done))
        if out_of_time or action == "stop":
            break
    monitor.close()
    return run_dir


# ---------------------------------------------------------------------------------------------- data


def train_seeds(cfg: Config, step: int, round_: int = 0) -> list[int]:
    """Task seeds of training step ``step`` (0-based), sampling round ``round_``.

    Each step owns a block of ``tasks_per_step * dynamic_sampling_rounds`` seeds, so seeds are a pure
    function of (step, round): disjoint across steps, never eval seeds, and a resumed run draws the same.
    """
    n = cfg.rollout.tasks_per_step
    return [cfg.train.seed_start + (step * cfg.algo.dynamic_sampling_rounds + round_) * n + i for i in range(n)]


def collect_step(c: Components, step: int, sampling: SamplingParams) -> tuple[list[TrajectoryGroup], list[TrajectoryGroup]]:
    """Collect the step's groups; returns ``(train_groups, all_groups)``.

    With ``algo.dynamic_sampling_rounds > 1`` (DAPO's dynamic sampling), groups whose rewards do not vary
    are set aside and further rounds of fresh tasks are collected until ``tasks_per_step`` groups with
    reward variance are found or the rounds run out; the batch is those groups.
    """
    cfg = c.cfg
    rounds = cfg.algo.dynamic_sampling_rounds
    everything: list[TrajectoryGroup] = []
    informative: list[TrajectoryGroup] = []
    for r in range(rounds):
        groups = c.collector.collect(train_seeds(cfg, step, r), cfg.rollout.group_size, sampling, env_id=cfg.env.id)
        everything += groups
        if rounds == 1:
            return groups, groups
        informative += [g for g in groups if len(set(g.rewards)) > 1]
        if len(informative) >= cfg.rollout.tasks_per_step:
            break
    return informative[: cfg.rollout.tasks_per_step], everything


def evaluate(c: Components, seeds: list[int] | None = None) -> dict[str, float]:
    """Success on held-out seeds, one episode each (greedy by default), with a 95% interval."""
    cfg = c.cfg
    seeds = seeds if seeds is not None else [cfg.eval.seed_start + i for i in range(cfg.eval.num_tasks)]
    t0 = time.perf_counter()
    collector = c.eval_collector or c.collector
    groups = collector.collect(seeds, 1, sampling_params(cfg, greedy=cfg.eval.greedy), env_id=cfg.eval.env_id or cfg.env.id)
    return eval_metrics(groups, time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------- credit


def credit_params(cfg: Config) -> credit.CreditParams:
    a = cfg.algo
    return credit.CreditParams(norm_std=a.norm_std, gamma=a.gamma, step_weight=a.step_weight, similarity=a.gigpo_similarity,
                               lam=a.lam, gamma_token=a.gamma_token, whiten=a.whiten_advantages)


def credit_inputs(c: Components, groups: list[TrajectoryGroup], estimator, params: credit.CreditParams) -> credit.CreditParams:
    """``params`` plus what the estimator declares it needs: critic values, greedy-rollout baselines.

    The loop never asks which estimator it holds: ``needs_critic`` makes the critic predict values for the
    batch, ``needs_greedy_baseline`` collects one greedy episode per task (not trained on; raw env reward).
    """
    trajectories = [t for g in groups for t in g.trajectories]
    if credit.estimator_flag(estimator, "needs_critic"):
        params = dataclasses.replace(params, values=c.learner.critic.predict(trajectories))
    if credit.estimator_flag(estimator, "needs_greedy_baseline"):
        greedy = c.collector.collect([g.seed for g in groups], 1, sampling_params(c.cfg, greedy=True), env_id=c.cfg.env.id)
        by_seed = {g.seed: g.trajectories[0].total_reward for g in greedy}
        params = dataclasses.replace(params, baseline_rewards=tuple(by_seed[g.seed] for g in groups))
    return params


def assign_credit(c: Components, groups: list[TrajectoryGroup], estimator, params: credit.CreditParams, prm=None) -> Advantages:
    """Reward transforms (PRM, clipping, KL penalty, normalisation), the estimator, then batch shaping."""
    a = c.cfg.algo
    if prm is not None:
        apply_process_rewards(groups, prm, a.prm_weight)
    if a.reward_clip > 0:
        clip_rewards(groups, a.reward_clip)
    if c.shaper is not None:
        trajectories = [t for g in groups for t in g.trajectories]
        c.shaper.apply(groups, c.learner.reference_turn_kl(trajectories) if a.kl_in_reward > 0 else None)
    advantages = estimator(groups, params)
    if a.group_keep_fraction < 1.0:
        advantages = apply_group_mask(groups, advantages, keep_informative_groups(groups, a.group_keep_fraction))
    if a.mask_overlong:
        advantages = mask_overlong(groups, advantages)
    return advantages


def value_batch(c: Components, groups: list[TrajectoryGroup], estimator, params: credit.CreditParams) -> ValueBatch | None:
    """The critic's training targets from the estimator's ``value_targets`` (None without a critic)."""
    if c.learner.critic is None:
        return None
    returns, mask = estimator.value_targets(groups, params)
    return ValueBatch([t for g in groups for t in g.trajectories], returns, mask, params.values.token_values)


# ---------------------------------------------------------------------------------------------- run directory


def make_run_dir(cfg: Config) -> Path:
    name = cfg.log.name or f"{cfg.env.id}-{cfg.algo.estimator}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.log.run_dir) / name
    if (run_dir / "checkpoints").exists():
        raise FileExistsError(f"run directory {run_dir} already has checkpoints; use `turnrl train --resume {run_dir}` to continue it")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return run_dir


def save(c: Components, run_dir: Path, step: int) -> Path:
    """Checkpoint the weights, optimizer, engine and reward-shaper state (and the RNGs) at ``step``."""
    state = {"learner": c.learner.state_dict(), "engine": c.engine.state_dict()}
    if c.shaper is not None:
        state["reward_shaper"] = c.shaper.state_dict()
    return checkpoint.save_checkpoint(run_dir, step, c.model, c.tokenizer, state, keep=c.cfg.log.keep_checkpoints)


def restore(c: Components, ckpt: Path, rng: bool = False) -> int:
    """Load a checkpoint's weights, optimizer, engine and reward-shaper state (and the RNGs when resuming); returns its step."""
    from safetensors.torch import load_model as load_weights

    state = checkpoint.load_state(ckpt)
    load_weights(c.model, ckpt / "model" / "model.safetensors", strict=False)
    c.learner.load_state_dict(state["learner"])
    c.engine.load_state_dict(state["engine"])
    if c.shaper is not None and "reward_shaper" in state:
        c.shaper.load_state_dict(state["reward_shaper"])
    if rng:
        checkpoint.set_rng_state(state["rng"])
    return int(state["step"])


def _latest(run_dir: Path) -> Path:
    ckpt = checkpoint.latest_checkpoint(run_dir)
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir} has no checkpoint to resume from (looked for {run_dir}/checkpoints/latest)")
    return ckpt
