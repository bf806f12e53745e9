"""The training loop, readable top to bottom.

    for step in steps:
        groups     = collect_step(step)                            # multi-turn rollouts, exact token ids;
                                                                   # seeds are a pure function of the step
        advantages = assign_credit(groups)                         # one signature for every estimator
        samples    = build_samples(trajectories, advantages)       # loss mask on the model's own tokens
        learner.update(samples)                                    # micro-batches, grad accumulation, clip
        engine.sync_weights()                                      # the engine samples from the new weights
        evaluate on held-out seeds every `eval.every` steps; checkpoint every `log.checkpoint_every`

What it implements, plainly: on-policy policy gradient with a PPO-clip surrogate against the engine's
behaviour logprobs (one optimizer step per batch by default, so the ratio is 1 up to bf16 noise and the
clip only matters with ``ppo_epochs > 1``), per-turn advantages from the configured estimator (the
default ``grpo_turn`` gives each turn its own from discounted turn returns; episode-level estimators give
every turn of a trajectory the same value), each spread over that turn's response tokens, and no KL term
unless ``algo.kl_coef > 0``.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from turnrl import checkpoint, credit
from turnrl.config import Config, ConfigError
from turnrl.credit.filters import apply_group_mask, keep_informative_groups, mask_overlong
from turnrl.credit.rewards import RewardShaper, apply_process_rewards, clip_rewards, load_prm
from turnrl.learner.critic import Critic, ValueBatch
from turnrl.engines import Engine, HFEngine, SamplingParams
from turnrl.envs import make
from turnrl.learner import Learner, build_samples
from turnrl.models import frozen_copy, load_model, load_tokenizer, resolve_model_path
from turnrl.monitor.detectors import Alert, default_detectors
from turnrl.monitor.sinks import JsonlSink, MetricLogger, MlflowSink, TensorBoardSink, WandbSink
from turnrl.rollout import Collector, ContextSpec
from turnrl.types import Termination, TrajectoryGroup


@dataclass
class Components:
    """Everything a run holds, built from the config by :func:`build`."""

    cfg: Config
    model: object
    tokenizer: object
    engine: Engine
    collector: Collector
    learner: Learner
    shaper: RewardShaper | None = None  # KL-in-reward and running reward normalisation (None when both are off)
    eval_collector: Collector | None = None  # eval.env_id's collector (None: the training collector)


def build(cfg: Config, model=None, tokenizer=None) -> Components:
    """Build model, engine, collector and learner. ``model``/``tokenizer`` override ``cfg.model.path`` (tests)."""
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    seed_everything(cfg.train.seed)
    env_kwargs = dict(
        cfg.env.kwargs,
        max_turns=cfg.env.max_turns,
        invalid_penalty=cfg.env.invalid_penalty,
        progress_reward=cfg.env.progress_reward,
    )
    try:  # fail now, before loading anything big, with the env's own message on a bad id or keyword
        probe = make(cfg.env.id, **env_kwargs)
        probe.reset(seed=cfg.train.seed_start)
        probe.close()
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"env.id={cfg.env.id!r} with env.kwargs={cfg.env.kwargs}: {e}") from None
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg.model.path)
    if model is None:
        model = load_model(cfg.model.path, dtype=getattr(torch, cfg.model.dtype))
    ref = frozen_copy(model) if cfg.model.reference else None
    engine = make_engine(cfg, model, tokenizer)
    ctx = ContextSpec(cfg.rollout.context, cfg.rollout.history_turns, cfg.rollout.few_shot, cfg.rollout.max_context_tokens)
    collector = Collector(engine, tokenizer, lambda: make(cfg.env.id, **env_kwargs), ctx)
    eval_collector = collector
    if cfg.eval.env_id:
        eval_kwargs = {**env_kwargs, **cfg.eval.env_kwargs} if cfg.eval.env_kwargs else env_kwargs
        try:
            make(cfg.eval.env_id, **eval_kwargs).close()
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"eval.env_id={cfg.eval.env_id!r}: {e}") from None
        eval_collector = Collector(engine, tokenizer, lambda: make(cfg.eval.env_id, **eval_kwargs), ctx)
    a = cfg.algo
    critic = None
    if a.critic != "none":
        critic = Critic(model, a.critic, lr=a.critic_lr, value_clip=a.value_clip, grad_clip=cfg.train.grad_clip,
                        pad_id=tokenizer.pad_token_id, micro_batch_tokens=cfg.train.micro_batch_tokens,
                        autocast_bf16=cfg.model.autocast_bf16)
    learner = Learner(model, cfg, pad_id=tokenizer.pad_token_id, ref_model=ref, critic=critic)
    shaper = None
    if a.kl_in_reward > 0 or a.reward_norm == "running":
        shaper = RewardShaper(a.kl_in_reward, a.kl_target, a.kl_horizon, normalise=a.reward_norm == "running")
    return Components(cfg, model, tokenizer, engine, collector, learner, shaper, eval_collector)


def make_engine(cfg: Config, model, tokenizer):
    """The rollout engine ``rollout.engine`` names, sampling from ``model`` (the learner's module).

    ``auto`` takes the native engine where it runs the model (the Llama family, the default model among
    them: 2-5x the HF engine's tokens/s in bench/RESULTS.md) and the HF reference engine otherwise.
    """
    if cfg.rollout.engine in ("native", "auto"):
        from turnrl.engines.native import NativeEngine, UnsupportedModelError

        try:
            return NativeEngine(
                model,
                tokenizer,
                dtype="bf16" if cfg.model.autocast_bf16 else "fp32",
                max_slots=max(cfg.rollout.tasks_per_step * cfg.rollout.group_size, cfg.eval.num_tasks),
                max_len=cfg.rollout.max_context_tokens,
                seed=cfg.train.seed,
            )
        except UnsupportedModelError as e:
            if cfg.rollout.engine == "native":
                raise ConfigError(f"rollout.engine=native: {e}") from None
            print(f"rollout.engine=auto: {e}; generating with the HF engine", file=sys.stderr)
    if cfg.rollout.engine == "vllm":
        from turnrl.engines.vllm_engine import VLLMEngine

        return VLLMEngine(str(resolve_model_path(cfg.model.path)), learner_model=model, seed=cfg.train.seed)
    return HFEngine(model, tokenizer, autocast_bf16=cfg.model.autocast_bf16, seed=cfg.train.seed)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def sampling_params(cfg: Config, greedy: bool = False) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        max_new_tokens=r.max_new_tokens, temperature=0.0 if greedy else r.temperature, top_p=r.top_p, top_k=r.top_k
    )


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


def eval_seeds(cfg: Config) -> list[int]:
    return [cfg.eval.seed_start + i for i in range(cfg.eval.num_tasks)]


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a success rate."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def rollout_metrics(groups: list[TrajectoryGroup], prefix: str = "rollout") -> dict[str, float]:
    trajs = [t for g in groups for t in g.trajectories]
    turns = [turn for t in trajs for turn in t.turns]
    n = max(1, len(trajs))
    m = {
        f"{prefix}/success_rate": sum(t.success for t in trajs) / n,
        f"{prefix}/reward": sum(t.total_reward for t in trajs) / n,
        f"{prefix}/turns": sum(t.num_turns for t in trajs) / n,
        f"{prefix}/valid_action_rate": sum(t.valid for t in turns) / max(1, len(turns)),
        f"{prefix}/response_tokens": sum(len(t.response_ids) for t in turns) / max(1, len(turns)),
        f"{prefix}/response_truncated_rate": sum(t.finish_reason == "length" for t in turns) / max(1, len(turns)),
    }
    for why in Termination:
        m[f"{prefix}/termination/{why.value}"] = sum(t.termination == why for t in trajs) / n
    similarity = cross_input_similarity(groups)
    if similarity is not None:
        m[f"{prefix}/cross_input_similarity"] = similarity
    comps: dict[str, float] = {}
    for t in trajs:
        for k, v in t.reward_components.items():
            comps[k] = comps.get(k, 0.0) + v
    for k, v in comps.items():
        m[f"{prefix}/reward/{k}"] = v / n
    return m


def cross_input_similarity(groups: list[TrajectoryGroup], max_pairs: int = 256) -> float | None:
    """Mean token-set Jaccard similarity of first-turn responses to different tasks (the echo-trap signal).

    Pairs are taken across groups (different tasks) in a fixed order, at most ``max_pairs``. None with fewer
    than two groups.
    """
    firsts = [[set(t.turns[0].response_ids) for t in g.trajectories if t.turns] for g in groups]
    sims = []
    for i in range(len(firsts)):
        for j in range(i + 1, len(firsts)):
            for a, b in zip(firsts[i], firsts[j]):
                sims.append(len(a & b) / len(a | b) if a | b else 1.0)
                if len(sims) >= max_pairs:
                    return sum(sims) / len(sims)
    return sum(sims) / len(sims) if sims else None


def evaluate(c: Components, seeds: list[int] | None = None) -> dict[str, float]:
    """Success on held-out seeds, one episode each (greedy by default), with a 95% interval."""
    cfg = c.cfg
    seeds = seeds if seeds is not None else eval_seeds(cfg)
    t0 = time.perf_counter()
    collector = c.eval_collector or c.collector
    groups = collector.collect(seeds, 1, sampling_params(cfg, greedy=cfg.eval.greedy), env_id=cfg.eval.env_id or cfg.env.id)
    m = rollout_metrics(groups, prefix="eval")
    wins = sum(t.success for g in groups for t in g.trajectories)
    lo, hi = wilson_interval(wins, len(seeds))
    m.update({"eval/success_ci_low": lo, "eval/success_ci_high": hi, "eval/num_tasks": float(len(seeds))})
    m["perf/eval_s"] = time.perf_counter() - t0
    return m


def make_run_dir(cfg: Config) -> Path:
    name = cfg.log.name or f"{cfg.env.id}-{cfg.algo.estimator}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.log.run_dir) / name
    if (run_dir / "checkpoints").exists():
        raise FileExistsError(f"run directory {run_dir} already has checkpoints; use `turnrl train --resume {run_dir}` to continue it")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return run_dir


def write_trajectories(run_dir: Path, step: int, groups: list[TrajectoryGroup], advantages, tokenizer, limit: int,
                       samples=None, algo=None) -> None:
    """Append the step's first ``limit`` trajectories to ``trajectories.jsonl`` for ``turnrl report``.

    Each turn carries its tokens, behaviour logprobs, the turn advantage, and per response token:
    ``token_advantages`` (the advantage :func:`build_samples` spreads over the turn) and ``loss_mask`` (1 when
    the token's policy-gradient term is trained: it is in a sample handed to the learner and no filter zeroed
    its advantage). ``masked_by`` names why a turn is not trained (``env_error``, ``group_filter``,
    ``overlong``, ``zero_advantage`` (skipped sample), ``not_trained``) or is null. ``entropies`` appears only
    when the engine recorded per-token entropies in ``Turn.info["token_entropies"]``. ``samples`` are the
    samples the learner received and ``algo`` the AlgoConfig; without them the mask is left out.
    Format: docs/metrics.md, "trajectories.jsonl".
    """
    if limit <= 0:
        return
    flat = [t for g in groups for t in g.trajectories]
    group_kept = [True] * len(groups)
    if algo is not None and algo.group_keep_fraction < 1.0:
        group_kept = keep_informative_groups(groups, algo.group_keep_fraction)  # as assign_credit chose
    traj_kept = [k for g, k in zip(groups, group_kept) for _ in g.trajectories]
    trained = {(s.traj_index, s.turn_index) for s in samples} if samples is not None else None

    def masked_by(i: int, j: int, traj, turn) -> str | None:
        if traj.termination == Termination.ENV_ERROR:
            return "env_error"
        if not traj_kept[i]:
            return "group_filter"
        if algo is not None and algo.mask_overlong and turn.finish_reason == "length":
            return "overlong"
        if (i, j) not in trained and (i, -1) not in trained:
            return "zero_advantage" if algo is not None and algo.skip_zero_advantage else "not_trained"
        return None

    rows = []
    for i, (traj, adv) in enumerate(zip(flat, advantages)):
        if i >= limit:
            break
        turns = []
        for j, (t, a) in enumerate(zip(traj.turns, adv)):
            n = len(t.response_ids)
            row = {
                "observation": t.observation,
                "response": t.response_text,
                "response_tokens": tokenizer.convert_ids_to_tokens(t.response_ids),
                "response_ids": t.response_ids,
                "logprobs": t.logprobs,
                "advantage": a,
                "token_advantages": [float(x) for x in a] if isinstance(a, list) else [float(a)] * n,  # token-level estimators give a list
                "actions": t.actions,
                "valid": t.valid,
                "reward": t.reward,
                "reward_components": t.reward_components,
                "finish_reason": t.finish_reason,
            }
            entropies = t.info.get("token_entropies")
            if entropies is not None and len(entropies) == n:
                row["entropies"] = [float(e) for e in entropies]
            if trained is not None:
                why = masked_by(i, j, traj, t)
                row["masked_by"] = why
                row["loss_mask"] = [int(why is None)] * n
            turns.append(row)
        rows.append(
            {
                "step": step,
                "index": i,
                "group_index": traj.group_index,
                "env_id": traj.env_id,
                "seed": traj.seed,
                "success": traj.success,
                "termination": traj.termination.value,
                "reward": traj.total_reward,
                "turns": turns,
            }
        )
    with (run_dir / "trajectories.jsonl").open("a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def credit_inputs(c: Components, groups: list[TrajectoryGroup], estimator, params: credit.CreditParams) -> credit.CreditParams:
    """``params`` plus what the estimator declares it needs: critic values, greedy-rollout baselines.

    The loop never asks which estimator it holds: ``needs_critic`` makes the critic predict values for the
    batch, ``needs_greedy_baseline`` collects one greedy episode per task (not trained on; raw env reward).
    """
    import dataclasses

    trajectories = [t for g in groups for t in g.trajectories]
    if credit.estimator_flag(estimator, "needs_critic"):
        params = dataclasses.replace(params, values=c.learner.critic.predict(trajectories))
    if credit.estimator_flag(estimator, "needs_greedy_baseline"):
        greedy = c.collector.collect([g.seed for g in groups], 1, sampling_params(c.cfg, greedy=True), env_id=c.cfg.env.id)
        by_seed = {g.seed: g.trajectories[0].total_reward for g in greedy}
        params = dataclasses.replace(params, baseline_rewards=tuple(by_seed[g.seed] for g in groups))
    return params


def value_batch(c: Components, groups: list[TrajectoryGroup], estimator, params: credit.CreditParams) -> ValueBatch | None:
    """The critic's training targets from the estimator's ``value_targets`` (None without a critic)."""
    if c.learner.critic is None:
        return None
    returns, mask = estimator.value_targets(groups, params)
    return ValueBatch([t for g in groups for t in g.trajectories], returns, mask, params.values.token_values)


def assign_credit(cfg: Config, groups: list[TrajectoryGroup], estimator, params, prm, c: Components | None = None) -> list[list[float]]:
    """Per-turn advantages: reward transforms (PRM, clipping, KL penalty, normalisation), the estimator, then batch shaping."""
    if prm is not None:
        apply_process_rewards(groups, prm, cfg.algo.prm_weight)
    if cfg.algo.reward_clip > 0:
        clip_rewards(groups, cfg.algo.reward_clip)
    if c is not None and c.shaper is not None:
        trajectories = [t for g in groups for t in g.trajectories]
        kl = c.learner.reference_turn_kl(trajectories) if cfg.algo.kl_in_reward > 0 else None
        c.shaper.apply(groups, kl)
    advantages = estimator(groups, params)
    if cfg.algo.group_keep_fraction < 1.0:
        advantages = apply_group_mask(groups, advantages, keep_informative_groups(groups, cfg.algo.group_keep_fraction))
    if cfg.algo.mask_overlong:
        advantages = mask_overlong(groups, advantages)
    return advantages


def step_metrics(c: Components, advantages, samples, t_rollout: float, t_train: float, t_start: float) -> dict[str, float]:
    """Advantage statistics and perf/* timings of one step."""
    flat_adv = [x for adv in advantages for a in adv for x in (a if isinstance(a, list) else [a])]
    st = c.collector.stats
    return {
        "train/advantage_mean": float(np.mean(flat_adv)) if flat_adv else 0.0,
        "train/advantage_std": float(np.std(flat_adv)) if flat_adv else 0.0,
        "perf/rollout_s": t_rollout,
        "perf/train_s": t_train,
        "perf/generate_s": st.generate_s,
        "perf/env_s": st.env_s,
        "perf/prompt_tokens": float(st.prompt_tokens),
        "perf/generated_tokens": float(st.generated_tokens),
        "perf/generate_tokens_per_s": st.generated_tokens / max(st.generate_s, 1e-9),
        "perf/train_tokens_per_s": sum(len(s) for s in samples) / max(t_train, 1e-9),
        "perf/wall_s": time.perf_counter() - t_start,
        "perf/max_rss_gb": peak_rss_gb(),
    }


def write_run_report(run_dir: Path, progress: "_progress") -> None:
    """``RUN/report.html``; a failure here is reported, never allowed to lose the finished run."""
    from turnrl.monitor.report import write_report

    try:
        write_report(run_dir)
    except Exception as e:  # noqa: BLE001 - the checkpoint and metrics are already on disk
        progress.write(f"could not write {run_dir / 'report.html'} ({type(e).__name__}: {e}); try `turnrl report {run_dir}`")


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far, in GB (Linux reports KiB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


def train(cfg: Config, resume: Path | None = None, components: Components | None = None, run_dir: Path | None = None) -> Path:
    """Run (or continue) training; returns the run directory."""
    c = components or build(cfg)
    run_dir = Path(resume) if resume else (run_dir or make_run_dir(cfg))
    start = 0
    if resume:
        ckpt = checkpoint.latest_checkpoint(run_dir)
        if ckpt is None:
            raise FileNotFoundError(f"{run_dir} has no checkpoint to resume from (looked for {run_dir}/checkpoints/latest)")
        start = restore(c, ckpt, rng=True)
    sinks = [JsonlSink(run_dir / "metrics.jsonl")]
    if cfg.log.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tb"))
    if cfg.log.wandb:
        sinks.append(WandbSink(run_dir, cfg.log.wandb_project, cfg.model_dump(mode="json")))
    if cfg.log.mlflow:
        sinks.append(MlflowSink(run_dir, cfg.log.mlflow_tracking_uri, cfg.log.mlflow_experiment, cfg.model_dump(mode="json")))
    logger = MetricLogger(sinks)
    estimator = credit.get_estimator(cfg.algo.estimator)
    a = cfg.algo
    params = credit.CreditParams(norm_std=a.norm_std, gamma=a.gamma, step_weight=a.step_weight, similarity=a.gigpo_similarity,
                                 lam=a.lam, gamma_token=a.gamma_token, whiten=a.whiten_advantages)
    sampling = sampling_params(cfg)
    progress = _progress(cfg, start)
    detectors = default_detectors() if cfg.monitor.detectors else []
    prm = load_prm(cfg.algo.prm) if cfg.algo.prm else None
    t_start = time.perf_counter()

    rollbacks, alerted = 0, False
    good_checkpoint = checkpoint.latest_checkpoint(run_dir) if resume else None
    if good_checkpoint is None and "rollback" in (cfg.monitor.on_alert, *cfg.monitor.actions.values()):
        good_checkpoint = checkpoint.save_checkpoint(run_dir, start, c.model, c.tokenizer, checkpoint_state(c), keep=cfg.log.keep_checkpoints)
    if start == 0 and cfg.eval.at_start:
        logger.log(0, evaluate(c))
    step = start
    for step in range(start, cfg.train.steps):
        t0 = time.perf_counter()
        groups, collected = collect_step(c, step, sampling)
        t_rollout = time.perf_counter() - t0
        trajectories = [t for g in groups for t in g.trajectories]
        step_params = credit_inputs(c, groups, estimator, params)  # critic values / greedy baselines, if declared
        advantages = assign_credit(cfg, groups, estimator, step_params, prm, c)
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
        metrics.update(step_metrics(c, advantages, samples, t_rollout, t_train, t_start))
        done = step + 1
        out_of_time = cfg.train.max_minutes > 0 and (time.perf_counter() - t_start) > 60 * cfg.train.max_minutes
        if (cfg.eval.every and done % cfg.eval.every == 0) or done == cfg.train.steps or out_of_time:
            metrics.update(evaluate(c))
        metrics["monitor/rollbacks"] = float(rollbacks)
        logger.log(done, metrics)
        write_trajectories(run_dir, done, groups, advantages, c.tokenizer, cfg.log.sample_trajectories, samples, cfg.algo)
        alerts = [a for d in detectors if (a := d.update(done, metrics))]
        write_alerts(run_dir, alerts, progress)
        action = alert_action(cfg, alerts, rollbacks)
        if action == "rollback" and (good_checkpoint is None or not good_checkpoint.exists()):
            progress.write("no checkpoint from before the alert is left to roll back to (raise log.keep_checkpoints); stopping")
            action = "stop"
        if action == "rollback":
            rollbacks += 1
            to_step = restore(c, good_checkpoint)
            record_rollback(run_dir, done, to_step, alerts, progress)
            detectors = default_detectors() if cfg.monitor.detectors else []  # their windows held the bad steps
            alerted = False
            progress.update(metrics)
            continue  # the bad steps' weights are gone; the step counter (hence the task seeds) moves on
        stop = action == "stop"
        if alerts:
            alerted = True
        at_end = (done == cfg.train.steps or out_of_time) and cfg.log.checkpoint_at_end
        save = (cfg.log.checkpoint_every and done % cfg.log.checkpoint_every == 0) or at_end or stop
        if save:
            saved = checkpoint.save_checkpoint(run_dir, done, c.model, c.tokenizer, checkpoint_state(c), keep=cfg.log.keep_checkpoints)
            if not alerted:  # a rollback target: saved before any alert fired
                good_checkpoint = saved
        progress.update(metrics)
        if out_of_time or stop:
            break
    progress.close()
    if cfg.log.report:
        write_run_report(run_dir, progress)
    logger.close()
    return run_dir


def checkpoint_state(c: Components) -> dict:
    state = {"learner": c.learner.state_dict(), "engine": c.engine.state_dict()}
    if c.shaper is not None:
        state["reward_shaper"] = c.shaper.state_dict()
    return state


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


def alert_action(cfg: Config, alerts: list[Alert], rollbacks: int) -> str:
    """The strongest action the alerts call for (stop > rollback > warn), by ``monitor.actions`` or ``on_alert``."""
    actions = {cfg.monitor.actions.get(a.name, cfg.monitor.on_alert) for a in alerts}
    if "stop" in actions:
        return "stop"
    if "rollback" in actions:
        return "rollback" if rollbacks < cfg.monitor.max_rollbacks else "stop"
    return "warn"


def record_rollback(run_dir: Path, step: int, to_step: int, alerts: list[Alert], progress: "_progress") -> None:
    names = [a.name for a in alerts]
    with (run_dir / "alerts.jsonl").open("a") as f:
        f.write(json.dumps({"step": step, "name": "rollback", "message": f"rolled back to step {to_step} after {', '.join(names)}",
                            "evidence": {"to_step": to_step, "alerts": names}}) + "\n")
    progress.write(f"ROLLBACK step {step}: restored the step-{to_step} checkpoint (after {', '.join(names)})")


def write_alerts(run_dir: Path, alerts: list[Alert], progress: "_progress") -> bool:
    """Append alerts to ``alerts.jsonl`` and show them; True when there was any."""
    for a in alerts:
        with (run_dir / "alerts.jsonl").open("a") as f:
            f.write(json.dumps({"step": a.step, "name": a.name, "message": a.message, "evidence": a.evidence}) + "\n")
        progress.write(f"ALERT [{a.name}] step {a.step}: {a.message}")
    return bool(alerts)


class _progress:
    """A tqdm bar showing step, success rate, reward and ETA (silent when disabled)."""

    def __init__(self, cfg: Config, start: int) -> None:
        self.bar = None
        if cfg.log.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.train.steps, initial=start, desc="train", unit="step", dynamic_ncols=True)

    def update(self, m: dict[str, float]) -> None:
        if self.bar is None:
            return
        post = {"succ": f"{m.get('rollout/success_rate', 0):.2f}", "rew": f"{m.get('rollout/reward', 0):.2f}",
                "valid": f"{m.get('rollout/valid_action_rate', 0):.2f}"}
        if "eval/success_rate" in m:
            post["eval"] = f"{m['eval/success_rate']:.2f}"
        self.bar.set_postfix(post)
        self.bar.update(1)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
