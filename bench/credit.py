"""Credit-assignment comparison: GRPO, RLOO, REINFORCE++, turn-level PPO-GAE and GiGPO under one budget.

Each estimator trains the default model (SmolLM2-135M-Instruct) from scratch on each env with the same
budget (steps, tasks per step, group size, evaluation) over several seeds; the training task seeds of a
seed index are the same for every estimator (paired comparison), and evaluation uses held-out seeds.

Envs, sized so that the success a policy *can* reach leaves room to learn (exact dynamic programming over
200 random maps, greedy-optimal policy vs uniform random actions, 8 turns):

- FrozenLake, *slippery* random 3x3 maps (configs/default.yaml + ``env.kwargs.slippery=true
  env.kwargs.size=3``): optimal 0.30, uniform random 0.08. On slippery 4x4 maps with 8 turns the optimal
  policy succeeds only 4.8% of the time (uniform random 0.8%), so no estimator can show anything there;
- Sokoban, 5x5 rooms, one box, puzzles 2-4 pushes/moves from solved, 8 turns (configs/sokoban.yaml +
  ``env.kwargs.size=5 env.kwargs.min_solution=2 env.kwargs.max_solution=4``): uniform random 0.17,
  optimal 1.0. The recipe's 6x6 rooms with 4-10-move puzzles give uniform random 0.013 within 10 turns.

Outputs in ``--out`` (default ``runs/credit_bench``, git-ignored): ``results.md`` (a table of final / best held-out
greedy success per estimator and env, mean over seeds, beside uniform random, the fixed rule and the oracle
(``bench/baselines.py``, computed in the same invocation) and the base model (the runs' step-0 evaluation) on the
same held-out tasks (distinct by task key), each with its 95% interval, and the *steps-to-GRPO-final ratio*: the first
evaluation step at which an estimator's seed-mean success reaches GRPO's final seed-mean success,
divided by the step at which GRPO itself first reaches it; < 1 = faster than GRPO, "never" = not reached,
n/a when GRPO's final success is not above its start, so there is nothing to reach; plus the mean held-out
success over the evaluations after step 0, sampled training success and update seconds per step),
``curves.json`` (every evaluation of every run) and ``success_vs_step.png`` (matplotlib: ``pip install
'turnrl[bench]'``).

    python bench/credit.py                          # default budget, sized for < 2 h on 2 CPU cores
    python bench/credit.py --steps 1 --tasks 1 --group 2 --eval-tasks 2 --seeds 1   # end-to-end check
    # on 2 cores, one single-threaded process per seed finishes sooner than one process using both cores:
    python bench/credit.py --seed-list 0 --out runs/credit/s0 train.threads=1 &
    python bench/credit.py --seed-list 1 --out runs/credit/s1 train.threads=1; wait
    python bench/credit.py --merge runs/credit/s0 runs/credit/s1 --out runs/credit

The projected wall time is printed before anything runs (``--dry-run`` prints it and stops). It is a
rough model calibrated on single-threaded runs of this script (``train.threads=1``, one process per core):
~2.5 s per FrozenLake training episode (rollout + update), ~0.3 s per greedy evaluation episode; the
Sokoban factor is an estimate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from baselines import cell, measure  # noqa: E402

ESTIMATORS: dict[str, list[str]] = {
    "grpo": ["algo.estimator=grpo"],
    "rloo": ["algo.estimator=rloo"],
    "reinforce_pp": ["algo.estimator=reinforce_pp"],
    "ppo_turn": ["algo.estimator=ppo_turn", "algo.critic=head", "algo.lam=0.95"],
    "gigpo": ["algo.estimator=gigpo"],
}
ENVS: dict[str, tuple[str, list[str]]] = {
    "frozenlake-slippery": ("default.yaml", ["env.kwargs.slippery=true", "env.kwargs.size=3"]),
    "sokoban": ("sokoban.yaml", ["env.kwargs.size=5", "env.kwargs.min_solution=2", "env.kwargs.max_solution=4"]),
}
# seconds per training episode (rollout + update) and per greedy eval episode; see the module docstring
SEC_PER_EPISODE = {"frozenlake-slippery": 2.5, "sokoban": 3.5}
SEC_PER_EVAL_EPISODE = {"frozenlake-slippery": 0.3, "sokoban": 0.5}
CRITIC_FACTOR = 1.4  # value passes of the head, with the shared prompt prefix computed once
SETUP_S = 10.0  # model load and first-shape warm-up per run


def projected_seconds(args) -> float:
    total = 0.0
    evals = args.steps // max(1, args.eval_every) + 2  # at start, every N, at the end
    for env in args.envs:
        turn_scale = args.sokoban_turns / 8 if env == "sokoban" else 1.0
        for est in args.estimators:
            train_s = args.steps * args.tasks * args.group * SEC_PER_EPISODE[env] * turn_scale
            train_s *= CRITIC_FACTOR if est == "ppo_turn" else 1.0
            eval_s = evals * args.eval_tasks * SEC_PER_EVAL_EPISODE[env] * turn_scale
            total += args.seeds * (SETUP_S + train_s + eval_s)
    return total


def env_config(env: str, args, overrides: list[str] = ()):
    """The config of ``env``'s runs (its recipe, the env overrides, the eval budget) plus ``overrides``."""
    from turnrl.config import load_config

    config, env_over = ENVS[env]
    turns = [f"env.max_turns={args.sokoban_turns}"] if env == "sokoban" else []
    evaluation = [f"eval.num_tasks={args.eval_tasks}", f"eval.every={args.eval_every}"]
    return load_config(ROOT / "configs" / config, [*env_over, *turns, *evaluation, *overrides, *args.overrides])


def run_one(env: str, est: str, seed: int, args) -> list[dict]:
    """Train one (env, estimator, seed) and return its evaluation rows."""
    from turnrl.monitor.sinks import read_metrics
    from turnrl.build import build
    from turnrl.loop import train

    cfg = env_config(env, args, [
        *ESTIMATORS[est], f"train.steps={args.steps}", f"rollout.tasks_per_step={args.tasks}", f"rollout.group_size={args.group}",
        f"train.seed={seed}", f"train.seed_start={10_000 * seed}", "log.progress=false", "log.tensorboard=false",
        "log.checkpoint_every=0", "log.checkpoint_at_end=false", f"log.run_dir={args.out / 'runs'}",
        f"log.name={env}-{est}-seed{seed}", "log.sample_trajectories=0",
    ])
    run_dir = train(cfg, components=build(cfg))
    rows = read_metrics(run_dir / "metrics.jsonl")
    train = {r["step"]: r for r in rows if "perf/train_s" in r}
    return [
        {
            "step": r["step"], "success": r["eval/success_rate"], "wall_s": r.get("perf/wall_s", 0.0),
            "ci95": [r["eval/success_ci_low"], r["eval/success_ci_high"]], "distinct_tasks": r["eval/distinct_tasks"],
            # sampled training success and update time of the steps since the previous evaluation
            "train_success": [t["rollout/success_rate"] for k, t in train.items() if k <= r["step"]],
            "update_s": [t["perf/train_s"] for k, t in train.items() if k <= r["step"]],
        }
        for r in rows if "eval/success_rate" in r
    ]


def env_baselines(args) -> dict[str, dict]:
    """Uniform random, the fixed rule and the oracle on each env's held-out tasks (``bench/baselines.py``)."""
    from turnrl.models import load_tokenizer

    out = {}
    for env in args.envs:
        cfg = env_config(env, args)
        out[env] = measure(cfg, tokenizer=load_tokenizer(cfg.model.path))
    return out


def mean_curve(runs: list[list[dict]]) -> list[tuple[int, float]]:
    """Seed-mean success at each evaluation step present in every run."""
    steps = sorted(set.intersection(*[{r["step"] for r in run} for run in runs])) if runs else []
    return [(s, statistics.fmean(next(r["success"] for r in run if r["step"] == s) for run in runs)) for s in steps]


def first_reaching(curve: list[tuple[int, float]], level: float) -> int | None:
    return next((s for s, v in curve if s > 0 and v >= level), None)


def summarise(curves: dict, baselines: dict, args) -> str:
    lines = [
        f"### Credit assignment comparison — {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Command: `python bench/credit.py {' '.join(sys.argv[1:])}`. Budget per run: {args.steps} steps x {args.tasks} tasks "
        f"x {args.group} episodes; greedy eval on {args.eval_tasks} held-out tasks every {args.eval_every} steps; "
        f"{args.seeds} seed(s). Success = seed-mean held-out greedy success. On the same held-out tasks (distinct by task "
        "key; training skips them): uniform random, the fixed rule and the oracle (`bench/baselines.py`, this "
        "invocation) and the base model (every run's step-0 evaluation: the same untrained weights), each with its 95% "
        "Wilson interval over the distinct tasks.",
        "",
        "| env | distinct held-out tasks | random | rule | base | oracle | estimator | final | best | mean after step 0 "
        "| steps-to-GRPO-final ratio | sampled train success, last 3 steps | update s/step |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for env in args.envs:
        grpo = mean_curve(curves[env].get("grpo", []))
        target = grpo[-1][1] if grpo else None
        grpo_steps = first_reaching(grpo, target) if target is not None else None
        for est in args.estimators:
            curve = mean_curve(curves[env][est])
            if not curve:
                continue
            ratio = "n/a"
            if target is not None and target <= grpo[0][1]:
                ratio = "n/a (GRPO did not improve on its start)"
            elif target is not None and grpo_steps:
                reach = first_reaching(curve, target)
                ratio = f"{reach / grpo_steps:.2f}" if reach else "never"
            elif target is not None:
                ratio = "n/a (GRPO final not reached after step 0)"
            best = max(v for _, v in curve)
            later = statistics.fmean(v for step, v in curve if step > 0) if len(curve) > 1 else float("nan")
            last = [run[-1] for run in curves[env][est]]
            train = statistics.fmean(statistics.fmean(r.get("train_success", [])[-3:] or [float("nan")]) for r in last)
            update = statistics.fmean(statistics.fmean(r.get("update_s", []) or [float("nan")]) for r in last)
            base = curves[env][est][0][0]  # the first seed's step-0 evaluation
            base_text = cell(base) if "ci95" in base else f"{base['success']:.3f}"  # curves from before intervals were kept
            fixed = baselines[env]
            lines.append(f"| {env} | {fixed['oracle']['distinct_tasks']} | {cell(fixed['random'])} | {cell(fixed['rule'])} "
                         f"| {base_text} "
                         f"| {cell(fixed['oracle'])} | {est} | {curve[-1][1]:.3f} | {best:.3f} | {later:.3f} | {ratio} "
                         f"| {train:.3f} | {update:.1f} |")
    return "\n".join(lines) + "\n"


def plot(curves: dict, args, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("bench/credit.py plots with matplotlib, which is not installed. Fix: pip install 'turnrl[bench]'") from None
    fig, axes = plt.subplots(1, len(args.envs), figsize=(6 * len(args.envs), 4), squeeze=False)
    for ax, env in zip(axes[0], args.envs):
        for est in args.estimators:
            curve = mean_curve(curves[env][est])
            if curve:
                ax.plot([s for s, _ in curve], [v for _, v in curve], marker="o", label=est)
        ax.set_title(f"{env} ({args.seeds} seed(s))")
        ax.set_xlabel("training step")
        ax.set_ylabel("held-out greedy success")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="training steps per run (the budget)")
    ap.add_argument("--tasks", type=int, default=2, help="tasks per step")
    ap.add_argument("--group", type=int, default=8, help="episodes per task")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per (env, estimator)")
    ap.add_argument("--eval-tasks", type=int, default=32, help="held-out tasks per evaluation")
    ap.add_argument("--eval-every", type=int, default=2, help="evaluate every N steps")
    ap.add_argument("--sokoban-turns", type=int, default=8, help="Sokoban turn limit (configs/sokoban.yaml has 20)")
    ap.add_argument("--estimators", nargs="+", default=list(ESTIMATORS), choices=list(ESTIMATORS))
    ap.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "credit_bench")
    ap.add_argument("--dry-run", action="store_true", help="print the projected time and stop")
    ap.add_argument("--resume", action="store_true", help="reuse the runs already in OUT/curves.json (same budget)")
    ap.add_argument("--seed-list", type=int, nargs="+", help="run only these seed indices (e.g. one process per seed)")
    ap.add_argument("--merge", type=Path, nargs="+", help="only report: concatenate the curves.json of these --out dirs")
    ap.add_argument("overrides", nargs="*", help="extra key=value config overrides for every run")
    args = ap.parse_args()
    if "grpo" not in args.estimators:
        args.estimators = ["grpo", *args.estimators]  # the ratio is relative to GRPO

    seeds = args.seed_list if args.seed_list is not None else list(range(args.seeds))
    args.out.mkdir(parents=True, exist_ok=True)
    curves: dict = {env: {est: [] for est in args.estimators} for env in args.envs}
    if args.merge:
        return report(merge_curves(args.merge, curves), args)
    args.seeds = len(seeds)
    runs = len(args.envs) * len(args.estimators) * len(seeds)
    proj = projected_seconds(args)
    print(f"{runs} runs; projected total time ~{proj / 60:.0f} min ({proj / 3600:.1f} h) on this machine", flush=True)
    if args.dry_run:
        return 0
    done_path = args.out / "curves.json"
    done: dict = json.loads(done_path.read_text()) if args.resume and done_path.exists() else {}
    t0 = time.perf_counter()
    # seeds outermost: if the budget runs out, every estimator has the same number of finished seeds
    for i, seed in enumerate(seeds):
        for env in args.envs:
            for est in args.estimators:
                previous = done.get(env, {}).get(est, [])
                if i < len(previous):  # --resume: this run finished in an earlier invocation
                    curves[env][est].append(previous[i])
                    continue
                t = time.perf_counter()
                curves[env][est].append(run_one(env, est, seed, args))
                done_path.write_text(json.dumps(curves, indent=1))  # a crash later loses nothing already run
                print(f"[{time.perf_counter() - t0:6.0f} s] {env} {est} seed {seed}: final success "
                      f"{curves[env][est][-1][-1]['success']:.3f} ({time.perf_counter() - t:.0f} s)", flush=True)
    print(f"all runs done in {time.perf_counter() - t0:.0f} s", flush=True)
    return report(curves, args)


def merge_curves(dirs: list[Path], curves: dict) -> dict:
    """Concatenate the runs of several ``--out`` directories (e.g. one process per seed), in the order given."""
    for d in dirs:
        part = json.loads((d / "curves.json").read_text())
        for env in curves:
            for est in curves[env]:
                curves[env][est].extend(part.get(env, {}).get(est, []))
    return curves


def report(curves: dict, args) -> int:
    args.seeds = min((len(runs) for by_est in curves.values() for runs in by_est.values()), default=0)
    (args.out / "curves.json").write_text(json.dumps(curves, indent=1))
    table = summarise(curves, env_baselines(args), args)
    (args.out / "results.md").write_text(table)
    plot(curves, args, args.out / "success_vs_step.png")
    print(table)
    print(f"wrote {args.out / 'results.md'}, {args.out / 'curves.json'}, {args.out / 'success_vs_step.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
