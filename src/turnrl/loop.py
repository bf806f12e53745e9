"""The training loop, readable top to bottom.

    for step in steps:
        groups     = collect_step(step)                            # multi-turn rollouts, exact token ids, on
                                                                   # tasks no evaluation holds (by task key)
        advantages = assign_credit(groups)                         # one signature for every estimator
        samples    = build_samples(trajectories, advantages)       # loss mask on the model's own tokens
        learner.update(samples)                                    # micro-batches, grad accumulation, clip
        engine.sync_weights()                                      # the engine samples from the new weights
        monitor.after_step(...)                                    # metrics, trajectories, detectors -> go/stop/rollback
        evaluate on held-out tasks every `eval.every` steps; checkpoint every `log.checkpoint_every`

With ``scale.async_mode`` the next steps' batches are collected by a background thread while the learner updates
(:mod:`turnrl.scale.async_rollout`); each turn keeps the weight version that sampled it.

What it implements, plainly: on-policy policy gradient with a PPO-clip surrogate against the engine's
behaviour logprobs (one optimizer step per batch by default, so the ratio is 1 up to bf16 noise and the
clip only matters with ``ppo_epochs > 1``), per-turn advantages from the configured estimator (the
default ``grpo_turn`` gives each turn its own from discounted turn returns; episode-level estimators give
every turn of a trajectory the same value), each spread over that turn's response tokens, and no KL term
unless ``algo.kl_coef > 0``.

The run's life: it says where it writes before step 1 and sums up at the end; SIGTERM or Ctrl-C finishes the step
in flight, checkpoints and writes the report (a second signal aborts); an update that leaves a weight NaN or
infinite stops the run before anything is checkpointed; ``--resume`` continues from the newest checkpoint that
loads, with the logs cut back to it.

Components come from :mod:`turnrl.build`; everything recorded or watched goes through
:class:`turnrl.monitor.monitor.Monitor`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from turnrl import checkpoint, credit
from turnrl.agent.demos import demo_batch
from turnrl.build import Components, Task, build, describe, restore, sampling_params, save
from turnrl.config import Config, write_config
from turnrl.credit.base import is_env_error
from turnrl.credit.filters import apply_group_mask, keep_informative_groups, mask_overlong
from turnrl.credit.rewardflow import apply_rewardflow
from turnrl.credit.rewards import apply_process_rewards, clip_rewards, load_prm
from turnrl.engines import SamplingParams
from turnrl.learner import ValueBatch, build_samples
from turnrl.monitor.metrics import credit_metrics, eval_metrics, rollout_metrics, step_metrics
from turnrl.monitor.monitor import Monitor
from turnrl.rollout import RolloutStats
from turnrl.rollout.multiagent import role_metrics
from turnrl.scale.async_rollout import collection, staleness_metrics
from turnrl.types import Advantages, TrainSample, TrajectoryGroup


def train(cfg: Config, resume: Path | None = None, components: Components | None = None, run_dir: Path | None = None) -> Path:
    """Run (or continue) training; returns the run directory.

    ``resume`` continues that run directory from its newest checkpoint that loads (see :func:`resume_from`).
    """
    c = components or build(cfg)
    c.tasks.train_tasks(0)  # an env with no task outside the held-out set fails here, before anything is written
    run_dir = Path(resume) if resume else (run_dir or make_run_dir(cfg))
    ckpt, state = resume_from(c, run_dir) if resume else (None, None)
    start = state["step"] if state else 0
    estimator = credit.get_estimator(cfg.algo.estimator)
    params = credit_params(cfg)
    sampling = sampling_params(cfg)
    prm = load_prm(cfg.algo.prm) if cfg.algo.prm else None
    t_start = time.perf_counter()

    with (Monitor(run_dir, cfg, c.tokenizer, resumed=state) as monitor,
          collection(c, lambda parts, s: collect_step(parts, s, sampling)) as collect):  # async: a producer thread
        monitor.start(describe(c), c.tasks.eval_tasks)
        if ckpt is not None:
            monitor.saved(ckpt)
        elif monitor.may_roll_back:  # a rollback needs a checkpoint from before any alert
            monitor.saved(save(c, run_dir, start, monitor.state_dict()))
        if start == 0 and cfg.eval.at_start and not monitor.evaluated_at_start:
            monitor.log(0, evaluate(c))
        for step in range(start, cfg.train.steps):
            if monitor.stop_requested:  # a signal before this step began: the last checkpoint is the run's state
                break
            t0 = time.perf_counter()
            groups, collected, tasks, stats = collect(step)
            t_rollout = time.perf_counter() - t0
            trajectories = [t for g in groups for t in g.trajectories]
            step_params = credit_inputs(c, groups, estimator, params)  # critic values / greedy baselines, if declared
            advantages = assign_credit(c, groups, estimator, step_params, prm)
            samples = build_samples(trajectories, advantages)
            if cfg.algo.skip_zero_advantage and cfg.algo.kl_coef == 0 and cfg.algo.entropy_coef == 0:
                samples = [s for s in samples if any(a != 0.0 for a in s.advantages)]
            t1 = time.perf_counter()
            demos = demo_batch(c.demos, step, cfg.algo.demo_batch)  # demo-guided RL (algo.demo_coef), else none
            metrics, broken = learn(c, samples, value_batch(c, groups, estimator, step_params), demos)
            metrics.update(c.shaper.last_metrics if c.shaper else {})
            metrics.update(staleness_metrics(samples, c.engine.version) | collect.last_metrics)  # before the sync
            t_train = time.perf_counter() - t1
            done = step + 1
            if broken:  # stop: never sample from, or checkpoint, a model the update broke
                raise monitor.diverged(done, metrics, broken)
            c.engine.sync_weights()

            metrics.update(rollout_metrics(collected) | role_metrics(collected, "rollout"))
            metrics["rollout/train_groups"] = float(len(groups))
            metrics["rollout/collected_groups"] = float(len(collected))
            if c.curriculum is not None:  # the level of the next step's tasks moves with their success (docs/curriculum.md)
                metrics.update(c.curriculum.observe(collected))
            metrics.update(credit_metrics(groups, advantages))
            for library in c.libraries:  # experience and skill libraries learn from the credited batch
                metrics.update(library.learn(groups, advantages, c.engine.version))
            metrics.update(step_metrics(samples, stats, t_rollout, t_train, t_start))
            monitor.record_tasks(done, tasks)
            last = cfg.train.max_minutes > 0 and (time.perf_counter() - t_start) > 60 * cfg.train.max_minutes
            if (cfg.eval.every and done % cfg.eval.every == 0) or done == cfg.train.steps or last:
                metrics.update(evaluate(c))
                # early stopping: the held-out bar is reached (eval.stop_at_success), so this is the run's last step
                last |= 0 < cfg.eval.stop_at_success <= metrics["eval/success_rate"]
            if c.selfplay is not None:  # Elo over the opponent pool, win rate against the base, the pool's next snapshot
                metrics.update(c.selfplay.after_step(done, groups, metrics))
            action = monitor.after_step(done, metrics, groups, advantages, samples)
            if action == "rollback":  # the bad steps' weights are gone; the step counter (hence the tasks) moves on
                monitor.rolled_back(done, restore(c, monitor.rollback_target)["step"], metrics)
                collect.restart()  # batches collected ahead came from the discarded weights
                continue
            at_end = (done == cfg.train.steps or last) and cfg.log.checkpoint_at_end
            if (cfg.log.checkpoint_every and done % cfg.log.checkpoint_every == 0) or at_end or action == "stop":
                monitor.saved(save(c, run_dir, done, monitor.state_dict()))
            if last or action == "stop":
                break
    return run_dir


# ---------------------------------------------------------------------------------------------- data


def collect_step(c: Components, step: int, sampling: SamplingParams
                 ) -> tuple[list[TrajectoryGroup], list[TrajectoryGroup], list[Task], RolloutStats]:
    """Collect the step's groups; returns ``(train_groups, all_groups, their tasks, the collector's counters)``.

    The tasks are :meth:`~turnrl.build.TaskSplit.train_tasks` of the step: a pure function of it, never a held-out
    task. With ``algo.dynamic_sampling_rounds > 1`` (DAPO's dynamic sampling), groups whose rewards do not vary are
    set aside and further rounds of fresh tasks are collected until ``tasks_per_step`` groups with reward variance
    are found or the rounds run out; the batch is those groups. The counters cover every round, nothing else.
    """
    cfg = c.cfg
    rounds = cfg.algo.dynamic_sampling_rounds
    everything: list[TrajectoryGroup] = []
    informative: list[TrajectoryGroup] = []
    tasks: list[Task] = []
    c.collector.take_stats()  # drop what earlier collections (evaluations, greedy baselines) counted
    for r in range(rounds):
        round_tasks = c.tasks.train_tasks(step, r)
        groups = c.collector.collect([t.seed for t in round_tasks], cfg.rollout.group_size, sampling, env_id=cfg.env.id)
        everything += groups
        tasks += round_tasks
        informative += [g for g, clean in zip(groups, credit.without_env_errors(groups)) if len(set(clean.rewards)) > 1]
        if rounds == 1 or len(informative) >= cfg.rollout.tasks_per_step:
            break
    batch = everything if rounds == 1 else informative[: cfg.rollout.tasks_per_step]
    return batch, everything, tasks, c.collector.take_stats()


def evaluate(c: Components, seeds: list[int] | None = None) -> dict[str, float]:
    """Success on the held-out tasks (distinct by task key), one episode each (greedy by default), with a 95% interval."""
    cfg = c.cfg
    seeds = seeds if seeds is not None else [t.seed for t in c.tasks.eval_tasks]
    t0 = time.perf_counter()
    collector = c.eval_collector or c.collector
    groups = collector.collect(seeds, 1, sampling_params(cfg, greedy=cfg.eval.greedy), env_id=cfg.eval.env_id or cfg.env.id)
    return eval_metrics(groups, time.perf_counter() - t0) | role_metrics(groups, "eval")


# ---------------------------------------------------------------------------------------------- credit


def credit_params(cfg: Config) -> credit.CreditParams:
    a = cfg.algo
    return credit.CreditParams(norm_std=a.norm_std, gamma=a.gamma, step_weight=a.step_weight, similarity=a.gigpo_similarity,
                               gigpo_pooling=a.gigpo_pooling, lam=a.lam, gamma_token=a.gamma_token,
                               whiten=a.whiten_advantages, whiten_std=a.whiten_std)


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
        # a greedy episode that ended in an env error gives its task no baseline (advantage 0)
        by_seed = {g.seed: None if is_env_error(g.trajectories[0]) else g.trajectories[0].total_reward for g in greedy}
        params = dataclasses.replace(params, baseline_rewards=tuple(by_seed[g.seed] for g in groups))
    return params


def assign_credit(c: Components, groups: list[TrajectoryGroup], estimator, params: credit.CreditParams, prm=None) -> Advantages:
    """Reward transforms (PRM, clipping, KL penalty, normalisation), the estimator, then batch shaping."""
    a = c.cfg.algo
    if prm is not None:
        apply_process_rewards(groups, prm, a.prm_weight)
    if c.cfg.hierarchy.rewardflow > 0:  # success propagated over each group's state graph (docs/hierarchy.md)
        apply_rewardflow(groups, c.cfg.hierarchy.rewardflow, c.cfg.hierarchy.rewardflow_gamma)
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


def learn(c: Components, samples: list[TrainSample], values: ValueBatch | None, demos: list[TrainSample] | None = None
          ) -> tuple[dict[str, float], str | None]:
    """The learner's update (with the auxiliary NLL of ``demos``, if any); returns its metrics and, when the update
    broke the model, what broke.

    Broken: a non-finite gradient (the learner skips that step) or non-finite weights after it. In a synchronous run
    the engine first frees its copy of the weights where it can (the native engine): the sync after the update reads
    them in again, and the update has the memory meanwhile.
    """
    release = getattr(c.engine, "release_weights", None)
    if release is not None and not c.cfg.scale.async_mode:
        release()
    try:
        metrics = c.learner.update(samples, values, demos or ())
    except FloatingPointError as e:
        return {}, f"a non-finite gradient ({e})"
    bad = checkpoint.non_finite_parameters(c.model)
    return metrics, f"non-finite weights in {', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}" if bad else None


def value_batch(c: Components, groups: list[TrajectoryGroup], estimator, params: credit.CreditParams) -> ValueBatch | None:
    """The critic's training targets from the estimator's ``value_targets`` (None without a critic)."""
    if c.learner.critic is None:
        return None
    returns, mask = estimator.value_targets(groups, params)
    return ValueBatch([t for g in groups for t in g.trajectories], returns, mask, params.values.token_values)


# ---------------------------------------------------------------------------------------------- run directory


def make_run_dir(cfg: Config) -> Path:
    """A new run's directory with its resolved ``config.yaml``. One that holds a checkpoint is refused (resume it);
    one without (a run killed before its first checkpoint) is started afresh."""
    name = cfg.log.name or f"{cfg.env.id}-{cfg.algo.estimator}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.log.run_dir) / name
    if checkpoint.checkpoints(run_dir):
        raise FileExistsError(f"run directory {run_dir} already has checkpoints; use `turnrl train --resume {run_dir}` to continue it")
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint.discard_partial(run_dir)
    write_config(cfg, run_dir / "config.yaml")
    return run_dir


def resume_from(c: Components, run_dir: Path) -> tuple[Path | None, dict[str, Any] | None]:
    """Restore the newest checkpoint of ``run_dir`` that loads (with the RNGs); returns it and its state.

    A damaged newer checkpoint is reported in one line and set aside (renamed ``*.bad``). With no checkpoint at all
    (a run killed before its first) returns ``(None, None)``: the run starts over. When checkpoints exist and none
    loads, raises :class:`~turnrl.checkpoint.CheckpointError` and changes nothing.
    """
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"{run_dir} does not exist; pass the run directory `turnrl train` printed")
    checkpoint.discard_partial(run_dir)
    if problem := checkpoint.pointer_problem(run_dir):
        print(f"{problem}; resuming from the newest complete checkpoint instead", file=sys.stderr)
    damaged: list[tuple[Path, checkpoint.CheckpointError]] = []
    for ckpt in checkpoint.checkpoints(run_dir):
        try:
            state = restore(c, ckpt, rng=True)
        except checkpoint.CheckpointError as e:
            damaged.append((ckpt, e))
            continue
        for bad, e in damaged:
            print(f"{e}; set aside as {checkpoint.set_aside(bad).name}", file=sys.stderr)
        return ckpt, state
    if damaged:
        raise checkpoint.CheckpointError(" | ".join(str(e) for _, e in damaged))
    print(f"{run_dir} has no checkpoint: starting it over from step 0", file=sys.stderr)
    if not (Path(run_dir) / "config.yaml").exists():
        write_config(c.cfg, Path(run_dir) / "config.yaml")
    return None, None


