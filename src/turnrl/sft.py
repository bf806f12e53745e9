"""``turnrl sft``: supervised fine-tuning on demonstrations, then a checkpoint that ``turnrl train`` starts RL from.

    demos   = oracle | file | sample demonstrations on TRAINING tasks only (by task key)
    samples = demo_samples(demos)                        # the learner's layout: loss mask on the agent's tokens
    for step in sft.steps:
        learner.sft_update(batch)                        # token-mean NLL over the loss mask, one optimizer step
        engine.sync_weights()
    evaluate on the held-out tasks (loop.evaluate) before and after; checkpoint; RUN/demos.jsonl

What it implements, plainly: behaviour cloning of successful episodes, L = -(1 / N) sum_t log pi(y_t | y_<t) over the
N agent tokens of the batch (logprobs at temperature 1), with the run's chat template and context strategy, so the
model imitates exactly what a rollout would have recorded. Demonstrations of the oracle are made by
:class:`OracleEngine`, a scripted engine the collector drives like any other: its "generation" is the env's next
planned action (``Env.solve()``, as ``bench/baselines.py``'s oracle asks it every turn), tokenized, plus the
end-of-sequence token the model ends a turn with; a multi-agent env's episodes are played by a team of oracles
(``MultiAgentEnv.oracle(role)``, :func:`turnrl.rollout.multiagent.scripted`), each role a demonstration in its own
context. Formats, sources and recipes: ``docs/demos.md``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from turnrl.agent.demos import demo_batch, demos_from_run, read_demos, write_demos
from turnrl.build import Components, build, demo_samples, describe, sampling_params, save
from turnrl.config import Config, ConfigError
from turnrl.engines.base import Completion, SamplingParams, written
from turnrl.envs import Env
from turnrl.envs.wrappers import Wrapper
from turnrl.learner import Learner
from turnrl.loop import evaluate, make_run_dir
from turnrl.monitor.sinks import JsonlSink, MetricLogger
from turnrl.rollout import Collector
from turnrl.rollout.multiagent import MultiAgentCollector, scripted
from turnrl.types import Trajectory, TrajectoryGroup

TASKS_PER_DEMO = 4
"""At most this many training tasks are tried per demonstration asked for (an oracle fails where its plan does not
fit ``rollout.max_new_tokens``; a sampled model fails often)."""


# ---------------------------------------------------------------------------------------------- the oracle engine


class _Registered(Wrapper):
    """An env that, when reset, registers itself under its seed, so the oracle engine can ask it for its plan."""

    def __init__(self, env: Env, envs: dict[int, Env]) -> None:
        super().__init__(env)
        self.envs = envs

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self.envs[seed] = self
        return await super().areset(seed=seed, options=options)


class OracleEngine:
    """A scripted :class:`~turnrl.engines.base.SessionEngine` whose response is the env's oracle action.

    Each session is one episode (the collector opens it with ``(seed, index)``; one episode per seed): every turn it
    answers with the first action of ``Env.solve()`` from the episode's current state, tokenized as the model would
    write it (no special tokens) and ended with EOS, cut to ``max_new_tokens`` (``finish_reason`` "length") when the
    model could not have written it in one turn. An env with no plan from its state gets an empty response (EOS
    only). The behaviour logprobs are 0: a demonstration is trained on by likelihood, never by importance ratio.
    Envs must come from :meth:`envs_from`, which registers each env under the seed it is reset with.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.version = 0
        self._by_seed: dict[int, Env] = {}
        self._sessions: dict[int, Env] = {}
        self._next = 0

    def envs_from(self, factory: Callable[[], Env]) -> Callable[[], Env]:
        """``factory``'s envs, registered with this engine when reset."""
        return lambda: _Registered(factory(), self._by_seed)

    def open(self, sample_key: tuple[int, ...] | None = None) -> int:
        if sample_key is None or sample_key[0] not in self._by_seed:
            raise ValueError("the oracle answers an episode of an env it registered: collect with envs_from(factory)")
        self._next += 1
        self._sessions[self._next] = self._by_seed[sample_key[0]]
        return self._next

    async def agenerate(self, key: int, prompt: list[int], params: SamplingParams) -> Completion:
        plan = self._sessions[key].solve()
        return written(self.tokenizer, plan[0] if plan else "", params, self.version)

    def close(self, key: int) -> None:
        self._sessions.pop(key, None)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        raise TypeError("the oracle answers per episode, in a session: the collector opens one (OracleEngine.open)")

    def sync_weights(self) -> None:
        self.version += 1

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = int(state["version"])


# ---------------------------------------------------------------------------------------------- demonstrations


def oracle_demos(c: Components, num: int) -> list[Trajectory]:
    """Up to ``num`` successful oracle episodes on distinct training tasks, recorded by a collector with the run's
    tokenizer, chat template, context strategy and response limit. A multi-agent env's episodes are played by a team
    of oracles (``MultiAgentEnv.oracle(role)``, each role in its own context), and every role's trajectory is one
    demonstration."""
    collector: Collector
    if isinstance(c.collector, MultiAgentCollector):
        team = scripted(c.tokenizer, "oracle")
        collector = MultiAgentCollector(team, c.tokenizer, c.tasks.train_envs, c.collector.context,  # type: ignore[arg-type]
                                        step_timeout_s=c.collector.step_timeout_s)
    else:
        engine = OracleEngine(c.tokenizer)
        collector = Collector(engine, c.tokenizer, engine.envs_from(c.tasks.train_envs), c.collector.context,
                              step_timeout_s=c.collector.step_timeout_s)
    sampling = sampling_params(c.cfg, greedy=True)
    return successes(c, num, lambda seeds: collector.collect(seeds, 1, sampling, env_id=c.cfg.env.id))


def sampled_demos(c: Components, num: int, attempts: int) -> list[Trajectory]:
    """Rejection sampling: ``attempts`` episodes of ``c``'s engine (the run's model, or a served one through
    :func:`turnrl.build.build_for_eval`) per training task, one successful episode kept per task, up to ``num``."""
    sampling = sampling_params(c.cfg)
    return successes(c, num, lambda seeds: c.collector.collect(seeds, attempts, sampling, env_id=c.cfg.env.id))


def successes(c: Components, num: int, episodes: Callable[[list[int]], list[TrajectoryGroup]]) -> list[Trajectory]:
    """The first successful episode of each training task (blocks of ``TaskSplit.train_tasks``, in order) until ``num``
    are found or ``TASKS_PER_DEMO * num`` tasks were tried."""
    found: list[Trajectory] = []
    step = 0
    while len(found) < num and step * c.cfg.rollout.tasks_per_step < TASKS_PER_DEMO * num:
        for group in episodes([t.seed for t in c.tasks.train_tasks(step)]):
            found += [t for t in group.trajectories if t.success][:1]
        step += 1
    return found[:num]


def every_level(c: Components, num: int, draw: Callable[[int], list[Trajectory]]) -> list[Trajectory]:
    """``sft.demo_levels=all``: ``draw(n)`` at each curriculum level in turn, easiest first, ``num`` split evenly (the
    first ``num % levels`` levels take one more); the curriculum is left at the level it had."""
    curriculum = c.curriculum
    if curriculum is None:
        raise ConfigError("sft.demo_levels=all needs curriculum.enabled=true")
    start, n = curriculum.level, len(curriculum.levels)
    found: list[Trajectory] = []
    try:
        for level in range(n):
            curriculum.level = level  # the collector's envs and tasks follow it (LeveledEnvs, LeveledTasks)
            found += draw(num // n + (level < num % n))
    finally:
        curriculum.level = start
    return found


def load_demos(c: Components) -> tuple[list[Trajectory], str]:
    """``sft.demos``'s demonstrations on training tasks and their source name; a file's held-out ones are dropped."""
    s = c.cfg.sft
    if s.demos in ("oracle", "sample"):
        def draw(num: int) -> list[Trajectory]:
            return oracle_demos(c, num) if s.demos == "oracle" else sampled_demos(c, num, s.attempts)

        demos = every_level(c, s.num_demos, draw) if s.demo_levels == "all" else draw(s.num_demos)
        return demos, "oracle" if s.demos == "oracle" else f"sample:{c.cfg.model.path}"
    path = Path(s.demo_file)
    demos = demos_from_run(path) if path.is_dir() else read_demos(path, len(c.tokenizer))
    other = {d.env_id for d in demos} - {c.cfg.env.id}
    if other:
        raise ConfigError(f"{path} holds demonstrations of {', '.join(sorted(other))}, not env.id={c.cfg.env.id}; "
                          "make demonstrations of this env or set env.id to theirs")
    return c.tasks.training_only(demos)[: s.num_demos], f"file:{path}" if path.is_file() else f"run:{path}"


# ---------------------------------------------------------------------------------------------- supervised fine-tuning


@dataclasses.dataclass(frozen=True)
class SftRun:
    """What :func:`sft` did: the run directory, the checkpoint's model directory (``model.path`` for ``turnrl train``),
    the number of demonstrations, the held-out ``eval/*`` metrics before and after (empty when not measured), the
    optimizer steps run (``sft.steps``, or fewer when ``sft.max_minutes`` ended it), and ``next_seed``: the
    ``train.seed_start`` for RL from this checkpoint, one past the last demonstrated task's seed, so that RL starts on
    tasks it was not shown (SFT may have memorised a demonstrated task; where every episode of a group succeeds, its
    group-relative advantages are zero)."""

    run_dir: Path
    model_path: Path
    num_demos: int
    before: dict[str, float]
    after: dict[str, float]
    steps: int
    next_seed: int


def sft(cfg: Config, components: Components | None = None, run_dir: Path | None = None) -> SftRun:
    """Fine-tune on ``sft.demos`` demonstrations for ``sft.steps`` steps (or until ``sft.max_minutes``); returns the
    :class:`SftRun`.

    Writes ``RUN/demos.jsonl`` (what it trained on), ``RUN/metrics.jsonl`` (``train/demo_nll`` every step, ``eval/*``
    every ``eval.every`` steps and at the end) and ``RUN/checkpoints/step_N``.
    """
    if cfg.multiagent.policies != "shared":
        raise ConfigError("turnrl sft trains one policy on demonstrations, not one per role: set multiagent.policies=shared")
    t_start = time.perf_counter()
    c = components or build(cfg)
    demos, source = load_demos(c)
    if not demos:
        raise ConfigError(f"no successful demonstration on the training tasks of {cfg.env.id} (sft.demos={cfg.sft.demos}); "
                          "raise rollout.max_new_tokens if the oracle's actions are cut, or use another source")
    run_dir = run_dir or make_run_dir(cfg if cfg.log.name else _named(cfg))
    write_demos(run_dir / "demos.jsonl", demos, source, len(c.tokenizer))
    samples = demo_samples(demos)
    c = dataclasses.replace(c, learner=Learner(c.model, dataclasses.replace(c.learner.params, lr=cfg.sft.lr),
                                               c.tokenizer.pad_token_id))
    print(f"sft: {len(demos)} demonstrations ({source}, {len(samples)} samples) -> {run_dir}", file=sys.stderr)
    for k, v in describe(c).items():
        print(f"  {k}: {v}", file=sys.stderr)
    logger = MetricLogger([JsonlSink(run_dir / "metrics.jsonl")])
    before = evaluate(c) if cfg.eval.at_start else {}
    if before:
        logger.log(0, before)
    metrics: dict[str, float] = {}
    t0 = time.perf_counter()
    done = 0
    for step in range(cfg.sft.steps):
        metrics = c.learner.sft_update(demo_batch(samples, step, cfg.sft.batch_size))
        c.engine.sync_weights()
        done = step + 1
        last = done == cfg.sft.steps or 0 < 60 * cfg.sft.max_minutes < time.perf_counter() - t_start
        if (cfg.eval.every and done % cfg.eval.every == 0) or last:
            metrics.update(evaluate(c))
        metrics["perf/elapsed_s"] = time.perf_counter() - t0
        logger.log(done, metrics)
        if last:
            break
    logger.close()
    if done < cfg.sft.steps:
        print(f"sft: stopped after step {done} of {cfg.sft.steps}: sft.max_minutes={cfg.sft.max_minutes:g} passed",
              file=sys.stderr)
    ckpt = save(c, run_dir, done, monitor_state={})
    return SftRun(run_dir, ckpt / "model", len(demos), before, {k: v for k, v in metrics.items() if k.startswith("eval/")},
                  done, max(d.seed for d in demos) + 1)


def _named(cfg: Config) -> Config:
    """``cfg`` with ``log.name`` ENV-sft-TIMESTAMP."""
    out = cfg.model_copy(deep=True)
    out.log.name = f"{cfg.env.id}-sft-{time.strftime('%Y%m%d-%H%M%S')}"
    return out
