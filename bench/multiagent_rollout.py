"""Multi-agent rollout speed: the base model evaluated greedily on a multi-agent env's held-out tasks.

Times one ``turnrl.loop.evaluate`` (the multi-agent collector, the run's engine) on ``--tasks`` held-out tasks of
``--env`` (default ``frozenlake-hier-v0``: a planner and an executor on 8x8 FrozenLake, up to 40 joint turns) and
prints the wall seconds, the success, and the native engine's counters: tokens prefilled (computed) against tokens
reused from a cache, decode passes. Run it at two commits to compare collector or engine changes on one machine:

    python bench/multiagent_rollout.py [--env frozenlake-hier-v0] [--tasks 8] [--threads 1] [--max-turns 40]
    git stash; git checkout OLD -- src; python bench/multiagent_rollout.py; git checkout HEAD -- src; git stash pop
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import commit, facts  # noqa: E402 - bench/ is not a package

from turnrl.build import build  # noqa: E402
from turnrl.config import Config  # noqa: E402
from turnrl.loop import evaluate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="frozenlake-hier-v0")
    ap.add_argument("--tasks", type=int, default=8, help="held-out tasks (one greedy episode each)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-turns", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=10)
    args = ap.parse_args()
    cfg = Config.model_validate({
        "env": {"id": args.env, "max_turns": args.max_turns, "progress_reward": 0.0},
        "rollout": {"max_new_tokens": args.max_new_tokens}, "eval": {"num_tasks": args.tasks},
        "train": {"threads": args.threads}, "log": {"tensorboard": False},
    })
    c = build(cfg)
    t0 = time.perf_counter()
    metrics = evaluate(c)
    seconds = time.perf_counter() - t0
    counters = getattr(c.engine, "counters", {})
    print(json.dumps({"env": args.env, "tasks": args.tasks, "seconds": round(seconds, 1),
                      "success": metrics["eval/success_rate"], "engine": type(c.engine).__name__,
                      "prefill_tokens": counters.get("prefill_tokens"), "reused_tokens": counters.get("reused_tokens"),
                      "decode_tokens": counters.get("decode_tokens"), "ticks": counters.get("ticks"),
                      "commit": commit(), **facts(measure=False)}, indent=1))


if __name__ == "__main__":
    main()
