"""Env pool vs inline envs: episodes per second when every env step computes ~50 ms of Python.

The env is ``turnrl.scale.envpool:busy_env`` (frozenlake whose every step first spins ``--busy-ms`` of Python,
holding the GIL). Inline (``scale.env_actors=0``, the baseline, measured in the same run) each step runs in the
training process and stalls generation; with ``scale.env_actors=N`` the steps run in N Ray actor processes while the
engine generates. Both arms collect the same tasks with the training collector, ``--rounds`` times each, alternating.
Prints episodes/s, the collector's generation seconds and the ratio, and writes bench/results/envpool.json (its
``smoke`` field says which budget) and a dated bench/RESULTS.md section.

    python bench/envpool.py --smoke     # tiny random model, 4 tasks x 2, 3 turns (a couple of minutes)
    python bench/envpool.py             # the default model, 8 tasks x 4, 5 turns
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import ray  # noqa: E402

from machine import append_results, write_result  # noqa: E402
from turnrl.build import build, sampling_params  # noqa: E402
from turnrl.config import load_config  # noqa: E402
from turnrl.models import load_model, load_tokenizer, tiny_model  # noqa: E402


def _cfg(args: argparse.Namespace, env_actors: int):
    cfg = load_config(None, [
        "env.id=turnrl.scale.envpool:busy_env", f"env.max_turns={args.turns}", f"rollout.max_new_tokens={args.new_tokens}",
        f"rollout.tasks_per_step={args.tasks}", f"rollout.group_size={args.group}", "eval.num_tasks=2",
        f"scale.env_actors={env_actors}", "train.threads=1",
    ])
    cfg.env.kwargs = {"env": "frozenlake-v0", "busy_ms": args.busy_ms}
    return cfg


def _round(c, seeds: list[int], group: int) -> tuple[float, float, int]:
    """One collection: (wall seconds, generation seconds, episodes)."""
    c.collector.take_stats()
    t0 = time.perf_counter()
    groups = c.collector.collect(seeds, group, sampling_params(c.cfg), env_id=c.cfg.env.id)
    wall = time.perf_counter() - t0
    return wall, c.collector.take_stats().generate_s, sum(len(g.trajectories) for g in groups)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny random model, small budget")
    ap.add_argument("--actors", type=int, default=2, help="scale.env_actors of the pool arm")
    ap.add_argument("--busy-ms", type=float, default=50.0, help="Python computed per env step")
    ap.add_argument("--rounds", type=int, default=None, help="collections per arm (default 2 smoke, 3 full)")
    args = ap.parse_args()
    args.tasks, args.group, args.turns, args.new_tokens = (4, 2, 3, 8) if args.smoke else (8, 4, 5, 32)
    rounds = args.rounds or (2 if args.smoke else 3)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    tokenizer = load_tokenizer("default")

    def model():
        return tiny_model(tokenizer, seed=0) if args.smoke else load_model("default")

    arms = {"inline": build(_cfg(args, 0), model=model(), tokenizer=tokenizer),
            "actors": build(_cfg(args, args.actors), model=model(), tokenizer=tokenizer)}
    seeds = arms["inline"].tasks.train_tasks(0)
    seeds = [t.seed for t in seeds]
    runs: dict[str, list[tuple[float, float, int]]] = {arm: [] for arm in arms}
    _round(arms["actors"], seeds[:1], 1)  # warm: the actors' first env build and import
    for _ in range(rounds):
        for arm, c in arms.items():
            runs[arm].append(_round(c, seeds, args.group))
    fields = {"smoke": args.smoke, "model": "tiny" if args.smoke else "default", "env_actors": args.actors,
              "busy_ms": args.busy_ms, "tasks": args.tasks, "group_size": args.group, "max_turns": args.turns,
              "max_new_tokens": args.new_tokens, "rounds": rounds}
    for arm, rs in runs.items():
        fields[f"{arm}_episodes_per_s"] = round(statistics.mean(n / wall for wall, _, n in rs), 3)
        fields[f"{arm}_generate_s"] = round(statistics.mean(gen for _, gen, _ in rs), 3)
        fields[f"{arm}_wall_s"] = round(statistics.mean(wall for wall, _, _ in rs), 3)
    fields["ratio"] = round(fields["actors_episodes_per_s"] / fields["inline_episodes_per_s"], 3)
    for arm in runs:
        print(f"{arm:7s} {fields[f'{arm}_episodes_per_s']:.3f} episodes/s, generation {fields[f'{arm}_generate_s']:.2f} s "
              f"of {fields[f'{arm}_wall_s']:.2f} s per collection")
    print(f"ratio (env actors / inline episodes per s): {fields['ratio']:.2f}x")
    path = write_result("envpool", fields)
    print(f"wrote {path}")
    _append(fields, path.name)
    ray.shutdown()
    return 0


def _append(f: dict, result: str) -> None:
    """The dated bench/RESULTS.md section of this run."""
    append_results(f"""## {time.strftime('%Y-%m-%d')}: env pool (scale.env_actors={f['env_actors']}) vs inline envs, {f['busy_ms']:g} ms of Python per step{' (smoke)' if f['smoke'] else ''}

Command: `python bench/envpool.py{' --smoke' if f['smoke'] else ''}` ({f['model']} model, {f['tasks']} tasks x {f['group_size']}, {f['max_turns']} turns,
{f['max_new_tokens']} new tokens, {f['rounds']} collections per arm, alternating; bench/results/{result}).

| arm | episodes/s | generation s per collection | wall s per collection |
| --- | --- | --- | --- |
| inline (scale.env_actors=0) | {f['inline_episodes_per_s']} | {f['inline_generate_s']} | {f['inline_wall_s']} |
| env actors ({f['env_actors']}) | {f['actors_episodes_per_s']} | {f['actors_generate_s']} | {f['actors_wall_s']} |

Ratio (env actors / inline, episodes per second): **{f['ratio']}x**.
""")


if __name__ == "__main__":
    sys.exit(main())
