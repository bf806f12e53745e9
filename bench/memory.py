"""Memory under a context budget (issue 20): do trained memory actions beat truncation, near the full context?

On configs/memory.yaml (keys-v0: a code colour seen only in the first observation, needed at the door 6 rooms
later), three arms train with the same budget (steps, tasks, group size, seeds) and are evaluated greedily on the
same held-out tasks (distinct by task key; training skips them):

- ``truncation``: the budgeted context, no memory actions: past ``rollout.budget_tokens`` the oldest turns drop;
- ``full_context``: ``rollout.context=full``, no budget (the ceiling);
- ``memory_actions``: the budgeted context with ``note``/``recall``/``compress`` (the config as shipped).

``experience`` (retrieval on/off) is measured by ``bench/experience.py`` (another recipe: it needs RL that learns),
which copies its summary into memory.json's ``experience`` field; a rewrite here keeps that field. Beside the arms,
on the same tasks: uniform random, the best memoryless rule and the oracle (``bench/baselines.py``), and each arm's
untrained model (its step-0 evaluation). ``prompt_tokens_*`` are the prompt tokens the engine was given per held-out
episode in the arm's final evaluation (the last collection on its collector). Every success has its 95% Wilson
interval over the distinct tasks.

    python bench/memory.py -c configs/memory_long.yaml --sft --rl-steps 0 train.threads=1  # 20 rooms, 192 tokens

    python bench/memory.py --smoke            # 1 step, 2 tasks x 2, 4 held-out tasks, 2 rooms: runs end to end
    python bench/memory.py                    # the config's budget (40 steps, 4 tasks x 8, 64 held-out tasks)
    python bench/memory.py --sft --rl-steps 10  # every arm starts from SFT on its own oracle demonstrations

``--sft``: the untrained model never writes a memory action (``--base-only`` below), so RL from it has nothing to
reinforce. With ``--sft`` every arm first fine-tunes on oracle demonstrations of training tasks rendered in the
arm's own context (``sft.*``: 64 demonstrations, 50 steps by default): the memory arm's oracle notes the code
first and recalls it at the door (``MemoryActions.solve``); the truncation arm's says the code at the door from a
context that may have dropped it; the full-context arm's reads it from the first observation, in batches of whole
episodes holding about as many turns as the others' batches (:func:`sft_batch`). Each row then has the untrained
model's and the SFT model's held-out success beside the final one.

writes ``bench/results/memory.json`` (``memory_smoke.json`` with ``--smoke``).

``--base-only`` trains nothing: does the untrained model write memory actions at all? It runs the base model
on the held-out tasks in three prompts (:data:`BASE_ARMS`): no memory actions, the memory actions with the
env's own few-shot exchanges (``memory.few_shot=false``) and with the memory few-shot (docs/memory.md), and reports
per episode the share that used a memory action at least once (each action, and any, with its interval over the
distinct tasks), the valid-action rate and success, beside random, rule and oracle on the same tasks, for one
greedy episode per task (as evaluated) and one sampled at the rollout temperature (as RL samples). It writes
``bench/results/memory_base.json`` (``memory_base_smoke.json`` with ``--smoke``) and a dated bench/RESULTS.md section:

    python bench/memory.py --base-only eval.num_tasks=32 train.threads=1
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
from machine import append_results, run_jobs, write_result  # noqa: E402

ARMS: dict[str, list[str]] = {
    "truncation": ["memory.actions=[]"],
    "full_context": ["memory.actions=[]", "rollout.context=full"],
    "memory_actions": [],
}
BASE_ARMS: dict[str, list[str]] = {
    "no_memory": ARMS["truncation"],
    "memory_plain_few_shot": ["memory.few_shot=false"],
    "memory_few_shot": [],
}
SMOKE = ["train.steps=1", "rollout.tasks_per_step=2", "rollout.group_size=2", "eval.num_tasks=4", "env.kwargs.rooms=2",
         "env.max_turns=5"]
QUIET = ["eval.at_start=true", "eval.every=0", "log.progress=false", "log.report=false", "log.tensorboard=false",
         "log.checkpoint_every=0", "log.checkpoint_at_end=false"]


def previous_experience() -> dict[str, Any] | None:
    """The ``experience`` field bench/experience.py linked into bench/results/memory.json, kept across rewrites."""
    path = ROOT / "bench" / "results" / "memory.json"
    return json.loads(path.read_text()).get("experience") if path.exists() else None


def memory_turn_rate(run_dir: Path) -> float:
    """The share of the sampled training turns (``trajectories.jsonl``) that were memory turns."""
    turns = [t for line in (run_dir / "trajectories.jsonl").read_text().splitlines() for t in json.loads(line)["turns"]]
    return sum("memory" in t for t in turns) / max(1, len(turns))


def run_arm(config: Path, overrides: list[str], run_root: Path) -> dict[str, Any]:
    """Train one arm and read its first (step 0 with ``eval.at_start``) and final evaluations and its final
    evaluation's prompt tokens."""
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


def sft_arm(config: Path, overrides: list[str], run_root: Path, rl_steps: int) -> dict[str, Any]:
    """``--sft``: the untrained model's held-out evaluation, then ``turnrl sft`` on the arm's own oracle demonstrations
    of training tasks (the memory arm's write ``note: code C`` first and ``recall`` at the door:
    :meth:`~turnrl.agent.memory.MemoryActions.solve`), its evaluation, then ``rl_steps`` RL steps from the SFT
    checkpoint (none when 0). The row is the last stage's; ``base`` and ``sft`` rows beside it."""
    import gc

    from turnrl.build import build
    from turnrl.config import load_config
    from turnrl.loop import evaluate
    from turnrl.sft import sft

    t0 = time.perf_counter()
    cfg = load_config(config, [*overrides, "sft.demos=oracle", "eval.at_start=false", f"log.run_dir={run_root}"])
    c = build(cfg)
    collector = c.eval_collector or c.collector
    base = evaluate(c)
    collector.take_stats()  # count the SFT model's final evaluation only
    run = sft(cfg, components=c)
    prompt_tokens = collector.take_stats().prompt_tokens / run.after["eval/num_tasks"]
    sft_row = {**summary(run.after), "prompt_tokens_per_episode": prompt_tokens, "demos": run.num_demos,
               "sft_steps": run.steps}
    del c
    gc.collect()
    row = {**sft_row, "steps": 0}
    if rl_steps:
        row = run_arm(config, [*overrides, f"model.path={run.model_path}", f"train.seed_start={run.next_seed}",
                               f"train.steps={rl_steps}", "eval.at_start=false"], run_root)
    return {**row, "base": summary(base), "sft": sft_row, "seconds": time.perf_counter() - t0}


def arm_job(config: Path, overrides: list[str], run_root: Path, rl_steps: int | None) -> dict[str, Any]:
    """One arm: :func:`sft_arm` with ``rl_steps`` RL steps after SFT, or :func:`run_arm` from the untrained model
    (``rl_steps`` None)."""
    run_root.mkdir(parents=True, exist_ok=True)
    return run_arm(config, overrides, run_root) if rl_steps is None else sft_arm(config, overrides, run_root, rl_steps)


def sft_batch(cfg, arm: str) -> list[str]:
    """The full-context arm's ``sft.batch_size``: a sample there is a whole episode (``rooms`` + 1 turns), elsewhere
    one turn, so its batch is the budgeted arms' divided by the turns of an episode (at least 1). Every arm's SFT
    step then trains on about the same number of demonstrated turns, and sees each about as often (at 20 rooms the
    shipped batch of 16 episodes made a full-context step 21x the turns and ~150 s on one thread)."""
    if arm != "full_context":
        return []
    from turnrl.envs.keys import KeysAndDoors

    turns = cfg.env.kwargs.get("rooms", KeysAndDoors().rooms) + 1
    return [f"sft.batch_size={max(1, round(cfg.sft.batch_size / turns))}"]


def memory_use(groups: list) -> dict[str, Any]:
    """Of the episodes in ``groups``: the share that used each memory action (and any) at least once, and the 95%
    Wilson interval of "any" over the distinct tasks (each task counted once, at its episodes' mean)."""
    from turnrl.agent.memory import ACTIONS
    from turnrl.monitor.metrics import wilson_interval

    episodes = [(t.task_key, {turn.info.get("memory") for turn in t.turns}) for g in groups for t in g.trajectories]
    by_task: dict[Any, list[bool]] = {}
    for key, used in episodes:
        by_task.setdefault(key, []).append(bool(used - {None}))
    lo, hi = wilson_interval(sum(sum(u) / len(u) for u in by_task.values()), len(by_task))
    n = max(1, len(episodes))
    return {"memory_use": sum(bool(u - {None}) for _, u in episodes) / n, "memory_use_ci95": [lo, hi],
            **{f"{a}_use": sum(a in u for _, u in episodes) / n for a in ACTIONS}}


def base_arm(config: Path, overrides: list[str], tokenizer) -> dict[str, Any]:
    """The untrained model's held-out episodes under ``overrides``, greedy (as evaluated) and sampled at the rollout
    temperature (as RL samples its training episodes): success, valid actions, memory use, prompt tokens."""
    from turnrl.build import build, sampling_params
    from turnrl.config import load_config
    from turnrl.monitor.metrics import eval_metrics

    cfg = load_config(config, overrides)
    c = build(cfg, tokenizer=tokenizer)
    collector = c.eval_collector or c.collector
    seeds = [t.seed for t in c.tasks.eval_tasks]
    rows = {}
    for mode in ("greedy", "sampled"):
        t0 = time.perf_counter()
        groups = collector.collect(seeds, 1, sampling_params(cfg, greedy=mode == "greedy"), env_id=cfg.eval.env_id or cfg.env.id)
        seconds = time.perf_counter() - t0
        rows[mode] = {**summary(eval_metrics(groups, seconds)), **memory_use(groups), "seconds": seconds,
                      "prompt_tokens_per_episode": collector.take_stats().prompt_tokens / max(1, len(groups))}
    return rows


def base_only(args: argparse.Namespace, common: list[str], baselines: dict[str, Any], tokenizer) -> None:
    """``--base-only``: the base model in each of :data:`BASE_ARMS` beside the baselines; result file and RESULTS.md."""
    from turnrl.config import load_config

    cfg = load_config(args.config, common)
    arms = {name: base_arm(args.config, [*common, *extra], tokenizer) for name, extra in BASE_ARMS.items()}
    lines = [f"{cfg.env.id} ({cfg.env.kwargs or 'default rooms'}), budgeted context of {cfg.rollout.budget_tokens} "
             f"tokens, base model {cfg.model.path} (untrained) on {baselines['oracle']['distinct_tasks']} distinct "
             f"held-out tasks, one greedy and one sampled (temperature {cfg.rollout.temperature:g}) episode per task",
             "", "| policy | decoding | success [95% CI] | valid actions | memory action used per episode [95% CI] | "
             "note / recall / compress | prompt tokens / episode |", "|---|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | - | {cell(r)} | {r['valid']:.3f} | - | - | - |" for name, r in baselines.items()]
    lines += [f"| base, {name} | {mode} | {cell(r)} | {r['valid']:.3f} | {r['memory_use']:.3f} "
              f"[{r['memory_use_ci95'][0]:.2f}-{r['memory_use_ci95'][1]:.2f}] | {r['note_use']:.2f} / "
              f"{r['recall_use']:.2f} / {r['compress_use']:.2f} | {r['prompt_tokens_per_episode']:.0f} |"
              for name, rows in arms.items() for mode, r in rows.items()]
    print("\n".join(lines))
    path = write_result("memory_base_smoke" if args.smoke else "memory_base", {
        "config": str(args.config), "overrides": args.overrides, "smoke": args.smoke, "env": cfg.env.id,
        "budget_tokens": cfg.rollout.budget_tokens, "arms": {n: {"overrides": BASE_ARMS[n], **r} for n, r in arms.items()},
        "baselines": baselines, "distinct_eval_tasks": baselines["oracle"]["distinct_tasks"]})
    command = " ".join(["python bench/memory.py --base-only", *(["--smoke"] if args.smoke else []), *args.overrides])
    smoke = " (smoke)" if args.smoke else ""
    append_results("\n".join([f"### Memory actions of the untrained model, with and without the memory few-shot{smoke} — "
                               f"{time.strftime('%Y-%m-%d %H:%M')}", "", f"Command: `{command}`. Result: "
                               f"`{path.relative_to(ROOT)}`.", "", *lines]))
    print(f"wrote {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", type=Path, default=ROOT / "configs" / "memory.yaml")
    ap.add_argument("--smoke", action="store_true",
                    help="the reduced budget: 1 step, 2 tasks x 2 episodes, 4 held-out tasks, 2 rooms, 5 env turns")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--base-only", action="store_true",
                    help="train nothing: the base model's memory-action use, valid actions and success, with and "
                         "without the memory few-shot, beside the baselines (bench/results/memory_base.json)")
    ap.add_argument("--sft", action="store_true",
                    help="start every arm from SFT on its own oracle demonstrations (sft.* settings; the memory arm's "
                         "demos use note/recall), then --rl-steps RL steps")
    ap.add_argument("--rl-steps", type=int, default=None,
                    help="with --sft: RL steps after SFT (0: SFT only; default: the config's train.steps)")
    ap.add_argument("--parallel", type=int, default=1, metavar="N",
                    help="train N arms at once, each in its own process (a core per arm; with train.threads=1)")
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
    if args.base_only:
        base_only(args, common, baselines, tokenizer)
        return 0
    run_root = Path(tempfile.mkdtemp(prefix="turnrl-memory-bench-"))
    try:
        rl_steps = (cfg.train.steps if args.rl_steps is None else args.rl_steps) if args.sft else None
        jobs = {name: (args.config, [*common, *ARMS[name], *(sft_batch(cfg, name) if args.sft else [])],
                       run_root / name, rl_steps) for name in args.arms}
        arms = run_jobs(arm_job, jobs, args.parallel)
    finally:
        shutil.rmtree(run_root)  # metrics are kept in the result, not the runs

    steps = (cfg.train.steps if args.rl_steps is None else args.rl_steps) if args.sft else cfg.train.steps
    start = (f"SFT on each arm's own oracle demonstrations ({cfg.sft.num_demos} asked, {cfg.sft.steps} steps), then "
             f"{steps} RL steps" if args.sft else f"{steps} RL steps from the untrained model")
    lines = [f"{cfg.env.id} ({cfg.env.kwargs or 'default rooms'}), budgeted context of {cfg.rollout.budget_tokens} "
             f"tokens; every arm: {start}; greedy, {baselines['oracle']['distinct_tasks']} distinct held-out tasks", "",
             "| policy | held-out success [95% CI] | untrained | after SFT | prompt tokens / episode | memory turns "
             "(training) |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | {cell(r)} | - | - | - | - |" for name, r in baselines.items()]
    lines += [f"| {name} | {cell(r)} | {cell(r['base'])} | {cell(r['sft']) if 'sft' in r else '-'} "
              f"| {r['prompt_tokens_per_episode']:.0f} | {r.get('memory_turn_rate_training', 0.0):.2f} |"
              for name, r in arms.items()]
    print("\n".join(lines))
    arm = arms.get
    path = write_result("memory_smoke" if args.smoke else "memory", {
        "config": str(args.config), "overrides": args.overrides, "smoke": args.smoke, "env": cfg.env.id,
        "budget_tokens": cfg.rollout.budget_tokens, "start": "sft" if args.sft else "base", "steps": steps,
        "truncation": arm("truncation"), "full_context": arm("full_context"), "memory_actions": arm("memory_actions"),
        "experience": previous_experience(),
        "prompt_tokens_full": (arm("full_context") or {}).get("prompt_tokens_per_episode"),
        "prompt_tokens_memory": (arm("memory_actions") or {}).get("prompt_tokens_per_episode"),
        "distinct_eval_tasks": baselines["oracle"]["distinct_tasks"], "baselines": baselines,
    })
    config_path = args.config.resolve()
    config = [] if config_path == ROOT / "configs" / "memory.yaml" else [
        "-c", str(config_path.relative_to(ROOT) if config_path.is_relative_to(ROOT) else config_path)]
    command = " ".join(["python bench/memory.py", *config, *(["--smoke"] if args.smoke else []), *(["--sft"] if args.sft else []),
                        *([f"--rl-steps {args.rl_steps}"] if args.rl_steps is not None else []),
                        *(["--arms", *args.arms] if args.arms != list(ARMS) else []),
                        *([f"--parallel {args.parallel}"] if args.parallel > 1 else []), *args.overrides])
    smoke = " (smoke)" if args.smoke else ""
    append_results("\n".join([f"### Memory under a context budget: truncation, full context, memory actions{smoke} — "
                               f"{time.strftime('%Y-%m-%d %H:%M')}", "", f"Command: `{command}`. Result: "
                               f"`{path.relative_to(ROOT)}`.", "", *lines]))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
