"""Memory under a context budget (issue 20): do trained memory actions beat truncation, near the full context?

On configs/memory.yaml (keys-v0: a code colour seen only in the first observation, needed at the door 6 rooms
later), three arms train with the same budget (steps, tasks, group size, seeds) and are evaluated greedily on the
same held-out tasks (distinct by task key; training skips them):

- ``truncation``: the budgeted context, no memory actions: past ``rollout.budget_tokens`` the oldest turns drop;
- ``full_context``: ``rollout.context=full``, no budget (the ceiling);
- ``memory_actions``: the budgeted context with ``note``/``recall``/``compress`` (the config as shipped).

``experience`` (retrieval on/off) is null: the experience library (issue 20 items 3-4) is another part of the
project and not wired in here. Beside the arms, on the same tasks: uniform random, the best memoryless rule and the
oracle (``bench/baselines.py``), and each arm's untrained model (its step-0 evaluation). ``prompt_tokens_*`` are
the prompt tokens the engine was given per held-out episode in the arm's final evaluation (the last collection on
its collector). Every success has its 95% Wilson interval over the distinct tasks.

    python bench/memory.py --smoke            # 1 step, 2 tasks x 2, 4 held-out tasks, 2 rooms: runs end to end
    python bench/memory.py                    # the config's budget (40 steps, 4 tasks x 8, 64 held-out tasks)

writes ``bench/results/memory.json`` (``memory_smoke.json`` with ``--smoke``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from baselines import POLICIES, cell, measure, summary  # noqa: E402
from machine import write_result  # noqa: E402

ARMS: dict[str, list[str]] = {
    "truncation": ["memory.actions=[]"],
    "full_context": ["memory.actions=[]", "rollout.context=full"],
    "memory_actions": [],
}
SMOKE = ["train.steps=1", "rollout.tasks_per_step=2", "rollout.group_size=2", "eval.num_tasks=4", "env.kwargs.rooms=2",
         "env.max_turns=5"]
QUIET = ["eval.at_start=true", "eval.every=0", "log.progress=false", "log.report=false", "log.tensorboard=false",
         "log.checkpoint_every=0", "log.checkpoint_at_end=false"]


def memory_turn_rate(run_dir: Path) -> float:
    """The share of the sampled training turns (``trajectories.jsonl``) that were memory turns."""
    turns = [t for line in (run_dir / "trajectories.jsonl").read_text().splitlines() for t in json.loads(line)["turns"]]
    return sum("memory" in t for t in turns) / max(1, len(turns))


def run_arm(config: Path, overrides: list[str], run_root: Path) -> dict[str, Any]:
    """Train one arm and read its step-0 and final evaluations and its final evaluation's prompt tokens."""
    from turnrl.build import build
    from turnrl.config import load_config
    from turnrl.loop import train
    from turnrl.monitor.sinks import read_metrics

    t0 = time.perf_counter()
    cfg = load_config(config, [*overrides, f"log.run_dir={run_root}"])
    c = build(cfg)
    run_dir = train(cfg, components=c)
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval/success_rate" in r]
    episodes = evals[-1]["eval/num_tasks"]
    return {**summary(evals[-1]), "base": summary(evals[0]), "steps": cfg.train.steps,
            "prompt_tokens_per_episode": c.collector.take_stats().prompt_tokens / episodes,
            "memory_turn_rate_training": memory_turn_rate(run_dir), "seconds": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", type=Path, default=ROOT / "configs" / "memory.yaml")
    ap.add_argument("--smoke", action="store_true",
                    help="the reduced budget: 1 step, 2 tasks x 2 episodes, 4 held-out tasks, 2 rooms, 5 env turns")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("overrides", nargs="*", help="key=value config overrides for every arm, as for turnrl train")
    args = ap.parse_args()

    from turnrl.build import quiet_transformers
    from turnrl.config import load_config
    from turnrl.models import load_tokenizer

    common = [*(SMOKE if args.smoke else []), *QUIET, *args.overrides]
    cfg = load_config(args.config, [*common, *ARMS["truncation"]])
    with quiet_transformers():
        tokenizer = load_tokenizer(cfg.model.path)
    baselines = measure(cfg, POLICIES, tokenizer)
    run_root = Path(tempfile.mkdtemp(prefix="turnrl-memory-bench-"))
    try:
        arms = {name: run_arm(args.config, [*common, *ARMS[name]], run_root) for name in args.arms}
    finally:
        shutil.rmtree(run_root)  # metrics are kept in the result, not the runs

    print(f"{cfg.env.id}, budget {cfg.rollout.budget_tokens} tokens, {cfg.train.steps} steps per arm; "
          f"{baselines['oracle']['distinct_tasks']} distinct held-out tasks")
    print("| policy | held-out success [95% CI] | untrained | prompt tokens / episode | memory turns (training) |")
    print("|---|---:|---:|---:|---:|")
    for name, r in baselines.items():
        print(f"| {name} | {cell(r)} | - | - | - |")
    for name, r in arms.items():
        print(f"| {name} | {cell(r)} | {cell(r['base'])} | {r['prompt_tokens_per_episode']:.0f} "
              f"| {r['memory_turn_rate_training']:.2f} |")
    arm = arms.get
    path = write_result("memory_smoke" if args.smoke else "memory", {
        "config": str(args.config), "overrides": args.overrides, "smoke": args.smoke, "env": cfg.env.id,
        "budget_tokens": cfg.rollout.budget_tokens, "steps": cfg.train.steps,
        "truncation": arm("truncation"), "full_context": arm("full_context"), "memory_actions": arm("memory_actions"),
        "experience": None,
        "prompt_tokens_full": (arm("full_context") or {}).get("prompt_tokens_per_episode"),
        "prompt_tokens_memory": (arm("memory_actions") or {}).get("prompt_tokens_per_episode"),
        "distinct_eval_tasks": baselines["oracle"]["distinct_tasks"], "baselines": baselines,
    })
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
