"""Rollout workers: 1 vs 2 Ray workers on the same workload, every env step delayed 200 ms (a simulated slow tool,
:mod:`turnrl.scale.latency`).

The same FrozenLake tasks (``--tasks`` seeds x ``--group`` episodes, sampled at the default temperature) are collected ``--rounds`` times through :class:`~turnrl.scale.workers.RayCollector` with
``scale.workers=1`` and then ``=2`` (the baseline is the 1-worker pool, measured in the same run). Measured: episodes
per second of each, their ratio, and the learner's wait (the wall time one collection blocks the training loop).
Nothing is trained and no run directory is written.

    python bench/scale.py --smoke     # end-to-end check: a tiny random model, 4 tasks x 2 episodes, 1 round
    python bench/scale.py             # the default model (SmolLM2-135M-Instruct), 16 tasks x 4 episodes, 3 rounds

writes ``bench/results/scale.json`` (``workers_1_episodes_per_s``, ``workers_2_episodes_per_s``, ``workers_ratio``,
``env_latency_ms``, ``workers_1_learner_wait_s``, ``workers_2_learner_wait_s``, ``episodes``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from machine import write_result  # noqa: E402

LATENCY_MS = 200.0


def measure(workers: int, args, tokenizer, model_factory) -> tuple[float, float, int]:
    """``(episodes per second, mean learner wait per collection in s, episodes)`` with ``workers`` Ray workers."""
    from turnrl.build import build, sampling_params
    from turnrl.config import load_config

    cfg = load_config(None, ["env.id=turnrl.scale.latency:slow_env", f"scale.workers={workers}",
                             f"rollout.tasks_per_step={args.tasks}", f"rollout.group_size={args.group}",
                             "eval.num_tasks=1"])
    cfg.env.kwargs = {"env": "frozenlake-v0", "latency_ms": LATENCY_MS}
    c = build(cfg, model=model_factory(), tokenizer=tokenizer)
    seeds = list(range(args.tasks))
    c.collector.collect(seeds[:1], 1, sampling_params(cfg))  # the workers are up before the clock starts
    waits, episodes = [], 0
    for r in range(args.rounds):
        t0 = time.perf_counter()
        groups = c.collector.collect([s + 100 * r for s in seeds], args.group, sampling_params(cfg), env_id=cfg.env.id)
        waits.append(time.perf_counter() - t0)
        episodes += sum(len(g.trajectories) for g in groups)
    c.collector.pool.close()
    return episodes / sum(waits), sum(waits) / len(waits), episodes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny random model, 4 tasks x 2 episodes, 1 round")
    p.add_argument("--tasks", type=int, default=None)
    p.add_argument("--group", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None)
    args = p.parse_args()
    args.tasks = args.tasks or (4 if args.smoke else 16)
    args.group = args.group or (2 if args.smoke else 4)
    args.rounds = args.rounds or (1 if args.smoke else 3)

    import ray

    from turnrl.models import load_model, load_tokenizer, tiny_model

    tokenizer = load_tokenizer("default")
    model_factory = (lambda: tiny_model(tokenizer, seed=0)) if args.smoke else (lambda: load_model("default"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    one = measure(1, args, tokenizer, model_factory)
    two = measure(2, args, tokenizer, model_factory)
    ray.shutdown()
    fields = {"workers_1_episodes_per_s": one[0], "workers_2_episodes_per_s": two[0], "workers_ratio": two[0] / one[0],
              "env_latency_ms": LATENCY_MS, "workers_1_learner_wait_s": one[1], "workers_2_learner_wait_s": two[1],
              "episodes": one[2], "budget": "smoke" if args.smoke else "full"}
    print(f"1 worker : {one[0]:.2f} episodes/s, learner waits {one[1]:.2f} s per collection")
    print(f"2 workers: {two[0]:.2f} episodes/s, learner waits {two[1]:.2f} s per collection")
    print(f"ratio    : {fields['workers_ratio']:.2f}x ({one[2]} episodes each, env step latency {LATENCY_MS:g} ms)")
    print(f"wrote {write_result('scale', fields)}")


if __name__ == "__main__":
    main()
