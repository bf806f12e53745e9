"""Recipes: base vs trained held-out success of the default model on each tool env, under a stated budget.

For every env recipe (``configs/<env>.yaml``) this trains the default model (SmolLM2-135M-Instruct) from
scratch with the recipe's own settings, shortened to the budget given here (steps, tasks per step, group
size), and evaluates on held-out task seeds (never trained on) before training and after the last step.
Success is the env's own verifier (full task solved); reward is the mean total episode reward, which also
counts partial credit (column-set match, F1, fraction of tests passed, purchase-match score).

    python bench/recipes.py                                  # the default budget (see --help)
    python bench/recipes.py --envs countdown --steps 1 --tasks 1 --group 2 --eval-tasks 2   # end-to-end check
    python bench/recipes.py --write                          # also append the table to bench/RESULTS.md
    # on 2 cores, two single-threaded processes finish sooner than one process using both cores:
    python bench/recipes.py --envs countdown sql code --out runs/recipes/a train.threads=1 &
    python bench/recipes.py --envs searchqa webshop --out runs/recipes/b train.threads=1; wait
    python bench/recipes.py --merge runs/recipes/a runs/recipes/b --out runs/recipes --write

Results go to ``--out`` (default ``runs/recipes``, git-ignored) as ``results.json`` (written after every
env, so ``--resume`` skips envs already done) and ``results.md``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from baselines import cell, measure  # noqa: E402

ENVS = ("countdown", "searchqa", "sql", "webshop", "code")


def env_config(env: str, args, overrides: list[str] = ()):
    """The recipe ``configs/<env>.yaml`` with the bench's evaluation budget, ``overrides`` and the command line's."""
    from turnrl.config import load_config

    evaluation = [f"eval.num_tasks={args.eval_tasks}", f"eval.every={args.steps}"]
    return load_config(ROOT / "configs" / f"{env}.yaml", [*evaluation, *overrides, *args.overrides])


def run_env(env: str, args) -> dict:
    """Train one recipe under the budget; return its first and last evaluation and the time it took."""
    from turnrl.monitor.sinks import read_metrics
    from turnrl.build import build
    from turnrl.loop import train

    cfg = env_config(env, args, [
        f"train.steps={args.steps}", f"rollout.tasks_per_step={args.tasks}", f"rollout.group_size={args.group}",
        "log.progress=false", "log.tensorboard=false", "log.checkpoint_every=0", "log.checkpoint_at_end=false",
        "log.sample_trajectories=0", "log.report=false", f"log.run_dir={args.out / 'runs'}", f"log.name={env}",
    ])
    t0 = time.perf_counter()
    run_dir = train(cfg, components=build(cfg))
    wall = time.perf_counter() - t0
    rows = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in rows if "eval/success_rate" in r]
    steps = [r for r in rows if "perf/train_s" in r]

    def view(r: dict) -> dict:
        return {
            "step": r["step"], "success": r["eval/success_rate"], "reward": r["eval/reward"],
            "valid": r["eval/valid_action_rate"], "turns": r["eval/turns"],
            "ci95": [r["eval/success_ci_low"], r["eval/success_ci_high"]], "distinct_tasks": r["eval/distinct_tasks"],
        }

    return {
        "env": cfg.env.id, "base": view(evals[0]), "trained": view(evals[-1]), "wall_s": wall,
        "train_success": [r.get("rollout/success_rate") for r in steps],
        "train_reward": [r.get("rollout/reward") for r in steps],
        "estimator": cfg.algo.estimator, "context": cfg.rollout.context, "max_new_tokens": cfg.rollout.max_new_tokens,
        "max_turns": cfg.env.max_turns,
    }


def env_baselines(envs: list[str], args) -> dict[str, dict]:
    """Uniform random, the fixed rule and the oracle on each recipe's held-out tasks (``bench/baselines.py``)."""
    from turnrl.models import load_tokenizer

    out = {}
    for env in envs:
        cfg = env_config(env, args)
        out[env] = measure(cfg, tokenizer=load_tokenizer(cfg.model.path))
    return out


def table(results: dict, baselines: dict, args) -> str:
    lines = [
        f"### Env recipes: base vs trained — {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Command: `python bench/recipes.py {' '.join(sys.argv[1:])}` ({platform.machine()}, CPU only). "
        f"Budget per env: {args.steps} training steps x {args.tasks} tasks x {args.group} episodes "
        f"({args.steps * args.tasks * args.group} training episodes), from the untrained default model, with each recipe's "
        f"own settings otherwise (`configs/<env>.yaml`); greedy evaluation on {args.eval_tasks} held-out tasks "
        "before and after (distinct by task key; training skips them), beside uniform random, the fixed rule and the "
        "oracle on the same tasks (`bench/baselines.py`, this invocation). Success = the env's verifier; reward = mean "
        "episode reward including partial credit; 95% Wilson interval over the distinct tasks in brackets.",
        "",
        "| env | estimator | distinct held-out tasks | random | rule | base success | trained success | oracle | base reward "
        "| trained reward | valid actions base -> trained | train success per step | wall |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for name, r in results.items():
        b, t, fixed = r["base"], r["trained"], baselines[name]
        curve = " ".join(f"{x:.2f}" for x in r["train_success"] if x is not None)
        lines.append(
            f"| {r['env']} | {r['estimator']} | {fixed['oracle']['distinct_tasks']} | {cell(fixed['random'])} | {cell(fixed['rule'])} "
            f"| {cell(b)} | {cell(t)} | {cell(fixed['oracle'])} | {b['reward']:.3f} | {t['reward']:.3f} "
            f"| {b['valid']:.2f} -> {t['valid']:.2f} | {curve} | {r['wall_s'] / 60:.1f} min |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=list(ENVS), choices=ENVS)
    ap.add_argument("--steps", type=int, default=6, help="training steps per env (the budget)")
    ap.add_argument("--tasks", type=int, default=2, help="tasks per step")
    ap.add_argument("--group", type=int, default=4, help="episodes per task")
    ap.add_argument("--eval-tasks", type=int, default=16, help="held-out tasks per evaluation")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "recipes")
    ap.add_argument("--resume", action="store_true", help="skip envs already in OUT/results.json")
    ap.add_argument("--write", action="store_true", help="append the table to bench/RESULTS.md")
    ap.add_argument("--merge", type=Path, nargs="+", help="only report: the results.json of these --out dirs")
    ap.add_argument("overrides", nargs="*", help="extra key=value config overrides for every env")
    args = ap.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    results: dict = json.loads(path.read_text()) if args.resume and path.exists() else {}
    for d in args.merge or []:  # report only: envs run by other processes (e.g. one single-threaded process per env list)
        results.update(json.loads((d / "results.json").read_text()))
    for env in [] if args.merge else args.envs:
        if env in results:
            continue
        results[env] = run_env(env, args)
        path.write_text(json.dumps(results, indent=1))  # a crash in a later env loses nothing already run
        r = results[env]
        print(f"{env}: success {r['base']['success']:.3f} -> {r['trained']['success']:.3f}, reward "
              f"{r['base']['reward']:.3f} -> {r['trained']['reward']:.3f} ({r['wall_s']:.0f} s)", flush=True)
    shown = {e: results[e] for e in args.envs if e in results}
    md = table(shown, env_baselines(list(shown), args), args)
    (args.out / "results.md").write_text(md)
    print(md)
    if args.write:
        with open(ROOT / "bench" / "RESULTS.md", "a") as f:
            f.write("\n" + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
