"""Agents that learn real tasks (issue 19, "Measure"): SFT on oracle demonstrations, then RL, per env, held out.

For each env (FrozenLake raw grid, Sokoban 5x5 one box, searchqa, webshop, sql, countdown, code) this measures, on
the same held-out tasks (``build.TaskSplit``'s evaluation tasks: distinct by task key, never trained on):

- ``random``, ``rule``, ``oracle``: uniform random, the best simple fixed rule and the env's own plan
  (``bench/baselines.py``'s :func:`measure`);
- ``base``: greedy evaluation of the untrained default model (the SFT run's step-0 evaluation, ``loop.evaluate``);
- ``sft``: ``turnrl sft`` on oracle demonstrations of TRAINING tasks (``sft.demos=oracle``), then held-out eval;
- ``sft_rl``: ``turnrl train`` started from the SFT checkpoint (``model.path=`` its model) on training tasks past the
  demonstrated ones (``train.seed_start=`` ``SftRun.next_seed``: SFT may have memorised those, and a group whose
  episodes all succeed has zero advantage), then held-out eval;
- ``demo_rl`` (``--demo-guided``): the same RL with the SFT demonstrations kept in the loss
  (``algo.demo_coef``, docs/demos.md): demonstration-guided RL against SFT-then-plain-RL from the same checkpoint;

each with its 95% Wilson interval over the distinct held-out tasks. The bench checks that held out means held out:
no demonstration's task key (recomputed from its seed by a training env) and no RL training task is a held-out key;
a non-zero overlap stops it.

Budget per env (``--minutes``, issue: 30): SFT runs ``--sft-steps`` steps (default: the recipe's ``sft.steps``), or
fewer if it reaches ``--sft-share`` of the minutes first (``sft.max_minutes``: an env whose demonstrations are long,
like searchqa's full-context episodes, would otherwise spend the whole budget on SFT), then RL gets the rest of the
minutes (``train.max_minutes``, keeping the time of one evaluation for its last), so
``minutes`` in the record is the wall time the env used, set-up and every evaluation included. ``--smoke`` is a tiny
end-to-end budget (a few demonstrations, 2 SFT steps, 1 RL step, 4 held-out tasks) to show the bench runs.
``--rl KEY=VALUE`` (repeatable) overrides the RL part only: SFT, its demonstrations and the
base model's evaluation stay the recipe's, so the RL arm differs from a plain run in that override alone.
With ``--demo-guided`` the RL minutes are split equally between the plain and the demonstration-guided arm, so both
start from the same checkpoint with the same wall time and the env still fits ``--minutes``.

    python bench/agents.py --smoke                                   # all 7 envs -> bench/results/agents_smoke.json
    python bench/agents.py --minutes 30                              # the issue's budget, all envs (~3.5 h)
    python bench/agents.py --minutes 10 --envs frozenlake_raw countdown --eval-tasks 32
    python bench/agents.py --minutes 30 --envs frozenlake_raw --demo-guided   # + demonstration-guided RL

Each env's record goes to ``--out``/results.json as soon as it is done (``--resume`` skips envs already there); at
the end the bench prints the table and the issue's targets (met / not met), writes
``bench/results/agents.json`` (``agents_smoke.json`` with ``--smoke``) through ``machine.write_result`` and appends a
dated section to bench/RESULTS.md (unless ``--no-write``). Run directories and checkpoints are deleted after each
env unless ``--keep``.
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from baselines import cell, held_out, measure, summary  # noqa: E402
from learn_default import held_out_counts  # noqa: E402
from machine import append_results, commit, cpu_model, write_result  # noqa: E402

#: env name -> (recipe under configs/, overrides that make it the issue's env). The ``*_sft.yaml`` recipes hold both
#: halves; the others are the env's RL recipe with the default ``sft`` section (docs/demos.md).
ENVS: dict[str, tuple[str, tuple[str, ...]]] = {
    "frozenlake_raw": ("frozenlake_raw_sft.yaml", ()),
    "sokoban": ("sokoban_sft.yaml", ("env.kwargs.size=5", "env.kwargs.num_boxes=1")),
    "searchqa": ("searchqa.yaml", ()),
    "webshop": ("webshop.yaml", ()),
    "sql": ("sql_sft.yaml", ()),
    "countdown": ("countdown_sft.yaml", ()),
    "code": ("code.yaml", ()),
}
SMOKE = ("sft.num_demos=4", "sft.steps=2", "sft.batch_size=4", "train.steps=1", "rollout.tasks_per_step=2",
         "rollout.group_size=2")
QUIET = ("log.progress=false", "log.tensorboard=false", "log.checkpoint_every=0", "log.checkpoint_at_end=false",
         "log.sample_trajectories=0", "log.report=false", "eval.every=0")
FULL_COMMAND = "python bench/agents.py --minutes 30"
GAIN, RL_GAIN, SOKOBAN_BAR = 0.20, 0.05, 0.30


def env_config(env: str, args, extra: tuple[str, ...] = ()):
    """The env's recipe with the bench's budget, ``extra`` and the command line's overrides."""
    from turnrl.config import load_config

    recipe, fixed = ENVS[env]
    budget = [f"eval.num_tasks={args.eval_tasks}"] if args.eval_tasks else []
    budget += list(SMOKE) if args.smoke else [f"sft.steps={args.sft_steps}"] if args.sft_steps else []
    return load_config(ROOT / "configs" / recipe, [*fixed, *QUIET, *budget, *extra, *args.overrides])


def demo_overlap(cfg, demos_file: Path) -> int:
    """Held-out task keys among the demonstrations of ``demos_file``, each key recomputed from its seed by a training
    env (as ``TaskSplit.training_only`` does; the file's own key is not trusted). Under a curriculum
    (``sft.demo_levels=all``) a demonstration's level is the one whose env gives its seed the file's key; a
    demonstration no level reproduces stops the bench."""
    from turnrl.build import env_factories, task_keys
    from turnrl.rollout.curriculum import Curriculum

    split, _, _ = held_out(cfg)
    rows = [json.loads(line) for line in demos_file.read_text().splitlines() if line.strip()]
    seeds = sorted({r["seed"] for r in rows})
    curriculum = Curriculum.from_config(cfg)
    levels = env_factories(cfg, curriculum=curriculum)[0].factories if curriculum else [split.train_envs]
    keys = [{t.seed: t.key for t in task_keys(factory, seeds)} for factory in levels]
    demo_keys = set()
    for r in rows:
        at = [k[r["seed"]] for k in keys if k[r["seed"]] == r["task_key"]] if curriculum else [keys[0][r["seed"]]]
        if not at:
            raise SystemExit(f"{demos_file}: the demonstration of seed {r['seed']} ({r['task_key']!r}) is no curriculum "
                             "level's task for that seed")
        demo_keys.add(at[0])
    return len(demo_keys & {t.key for t in split.eval_tasks})


def run_sft(env: str, args, run_root: Path, minutes: float):
    """``turnrl sft`` on oracle demonstrations of training tasks, for at most ``minutes`` (0: no limit); evaluates the
    base model first (``eval.at_start``)."""
    from turnrl.sft import sft

    cfg = env_config(env, args, ("sft.demos=oracle", "eval.at_start=true", f"sft.max_minutes={minutes:.2f}",
                                 f"log.run_dir={run_root}", f"log.name={env}-sft"))
    result = sft(cfg)
    if overlap := demo_overlap(cfg, result.run_dir / "demos.jsonl"):
        raise SystemExit(f"{env}: {overlap} demonstrations are on held-out task keys; the comparison would not be held out")
    return result


def run_rl(env: str, args, run_root: Path, model_path: Path, minutes: float,
           extra: tuple[str, ...] = (), name: str = "rl") -> tuple[dict[str, float], Path, int]:
    """RL from the SFT checkpoint for ``minutes`` (0: the recipe's or smoke's steps) with ``extra`` overrides: the last
    held-out evaluation, the run directory and the number of distinct tasks RL trained on (none held out: checked)."""
    from turnrl.build import build
    from turnrl.loop import train
    from turnrl.monitor.sinks import read_metrics

    clock = [f"train.max_minutes={minutes:.2f}", "train.steps=100000"] if minutes else []
    cfg = env_config(env, args, (f"model.path={model_path}", "eval.at_start=false", *clock, *extra,
                                 f"log.run_dir={run_root}", f"log.name={env}-{name}"))
    run_dir = train(cfg, components=build(cfg))
    counts = held_out_counts(run_dir)
    if counts["overlap"]:
        raise SystemExit(f"{env}: RL trained on {counts['overlap']} held-out task keys ({run_dir / 'task_keys.jsonl'})")
    rows = read_metrics(run_dir / "metrics.jsonl")
    return [r for r in rows if "eval/success_rate" in r][-1], run_dir, counts["trained"]


def run_env(env: str, args) -> dict[str, Any]:
    """One env's record: baselines, base, SFT and SFT + RL on the same held-out tasks, and the minutes it took."""
    from turnrl.models import load_tokenizer

    t0 = time.perf_counter()
    cfg = env_config(env, args)
    fixed = measure(cfg, tokenizer=load_tokenizer(cfg.model.path))
    run_root = args.out / "runs"
    sft_minutes = 0.0 if args.smoke else max(0.5, args.minutes * args.sft_share - (time.perf_counter() - t0) / 60)
    s = run_sft(env, args, run_root, sft_minutes)
    gc.collect()
    spent = (time.perf_counter() - t0) / 60
    arms = 2 if args.demo_guided else 1
    rl_minutes = 0.0 if args.smoke else max(0.5, (args.minutes - spent) / arms - s.before["perf/eval_s"] / 60)
    # RL on tasks the demonstrations did not show (SftRun.next_seed), with the RL part's own overrides (--rl)
    fresh = (f"train.seed_start={s.next_seed}", *args.rl)
    last, rl_dir, rl_tasks = run_rl(env, args, run_root, s.model_path, rl_minutes, fresh)
    rows = {"random": fixed["random"], "rule": fixed["rule"], "base": summary(s.before), "sft": summary(s.after),
            "sft_rl": summary(last), "oracle": fixed["oracle"]}
    run_dirs = [s.run_dir, rl_dir]
    if args.demo_guided:
        demo = (*fresh, f"algo.demo_coef={args.demo_coef}", f"algo.demo_file={s.run_dir / 'demos.jsonl'}")
        demo_last, demo_dir, _ = run_rl(env, args, run_root, s.model_path, rl_minutes, demo, "demo-rl")
        rows["demo_rl"] = summary(demo_last)
        run_dirs.append(demo_dir)
    distinct = {r["distinct_tasks"] for r in rows.values()}
    if len(distinct) != 1:
        raise SystemExit(f"{env}: the rows ran on different numbers of held-out tasks {sorted(distinct)}")
    record = {"env": env, "distinct_eval_tasks": distinct.pop(), **{k: r["success"] for k, r in rows.items()},
              "ci95_sft_rl": rows["sft_rl"]["ci95"], "minutes": (time.perf_counter() - t0) / 60,
              **({"demo_coef": args.demo_coef, "demo_rl_steps": int(demo_last["step"])} if args.demo_guided else {}),
              "env_id": cfg.env.id, "env_kwargs": cfg.env.kwargs, "recipe": ENVS[env][0], "demos": s.num_demos,
              "held_out_keys_in_demos_or_rl": 0, "rl_train_tasks": rl_tasks, "rl_seed_start": s.next_seed, "sft_steps": s.steps,
              "rl_steps": int(last["step"]), "rl_minutes_budget": rl_minutes, "rl_overrides": list(args.rl),
              "ci95": {k: r["ci95"] for k, r in rows.items()}, "valid": {k: r["valid"] for k, r in rows.items()},
              "source": source()}
    if not args.keep:
        for run_dir in run_dirs:
            shutil.rmtree(run_dir)
    return record


def source() -> dict[str, str]:
    """Where a record comes from: this invocation's command, the date it finished, the commit and the CPU. A merged
    agents.json (records of several runs, ``--resume`` over a hand-assembled results.json) keeps each one's own."""
    return {"command": f"python bench/agents.py {shlex.join(sys.argv[1:])}", "date": time.strftime("%Y-%m-%d %H:%M"),
            "commit": commit(), "cpu": cpu_model()}


def provenance(records: list[dict[str, Any]]) -> list[str]:
    """One line per record that another invocation produced (a merge), with its command, date, commit and CPU."""
    here = source()["command"]
    other = [r for r in records if "source" not in r or r["source"]["command"] != here]
    if not other:
        return []
    lines = ["", "Records from other runs (merged):", ""]
    for r in other:
        src = r.get("source")
        lines.append(f"- {r['env']}: " + (f"`{src['command']}` ({src['date']}, commit {src['commit']}, {src['cpu']})"
                                          if src else "no source recorded (a record from before records carried one)"))
    return lines


def targets(records: list[dict[str, Any]]) -> list[tuple[str, bool, str]]:
    """The issue's targets: (name, met, evidence). "Beyond its interval": SFT's success lies below SFT + RL's 95%
    interval, i.e. the interval's lower end is above it."""
    gain = [r["env"] for r in records if r["sft_rl"] >= r["base"] + GAIN]
    rl = [r["env"] for r in records if r["sft_rl"] >= r["sft"] + RL_GAIN and r["ci95_sft_rl"][0] > r["sft"]]
    soko = [r["sft_rl"] for r in records if r["env"] == "sokoban"]
    return [
        (f"SFT + RL >= base + {GAIN:.2f} on >= 4 of 7 envs", len(gain) >= 4, f"{len(gain)} of {len(records)} run: {gain}"),
        (f"RL adds >= {RL_GAIN:.2f} over SFT beyond its interval on >= 3 envs", len(rl) >= 3,
         f"{len(rl)} of {len(records)} run: {rl}"),
        (f"Sokoban held-out greedy success >= {SOKOBAN_BAR:.2f}", bool(soko) and soko[0] >= SOKOBAN_BAR,
         f"{soko[0]:.3f}" if soko else "Sokoban not run"),
    ]


def demo_table(records: list[dict[str, Any]]) -> list[str]:
    """Demonstration-guided RL against plain RL from the same SFT checkpoint, same RL minutes (``--demo-guided``)."""
    if not records:
        return []
    lines = ["", "Demonstration-guided RL (`algo.demo_coef`) vs SFT then plain RL, from the same SFT checkpoint, each arm "
                 "with the same RL budget (half of the env's RL minutes at a --minutes budget):", "",
             "| env | SFT | SFT + RL | SFT + demo-guided RL | demo-guided - plain | RL steps plain / demo-guided | demo_coef |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for r in records:
        c = {k: cell({"success": r[k], "ci95": r["ci95"][k]}) for k in ("sft", "sft_rl", "demo_rl")}
        lines.append(f"| {r['env']} | {c['sft']} | {c['sft_rl']} | {c['demo_rl']} | {r['demo_rl'] - r['sft_rl']:+.3f} "
                     f"| {r['rl_steps']} / {r['demo_rl_steps']} | {r['demo_coef']:g} |")
    return lines


def report(records: list[dict[str, Any]], args) -> str:
    """The dated RESULTS.md section: command, table, targets, and what was not run."""
    budget = "smoke budget (" + ", ".join(SMOKE) + ")" if args.smoke else f"{args.minutes:g} min per env"
    ran = [r["env"] for r in records]
    lines = [f"### Agents: SFT then RL on held-out tasks{' (smoke)' if args.smoke else ''} — {time.strftime('%Y-%m-%d %H:%M')}", "",
             f"Command: `python bench/agents.py {shlex.join(sys.argv[1:])}` ({budget}; envs: {', '.join(ran)}). "
             "Greedy, one episode per held-out task (distinct by task key; demonstrations and RL tasks held-out-free, "
             "checked); success with its 95% Wilson interval over the distinct tasks.", "",
             "| env | tasks | random | rule | base | SFT | SFT + RL | oracle | valid base / SFT / SFT+RL | demos | SFT steps | RL steps | min |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in records:
        c = {k: cell({"success": r[k], "ci95": r["ci95"][k]}) for k in ("random", "rule", "base", "sft", "sft_rl", "oracle")}
        v = r["valid"]
        lines.append(f"| {r['env']} | {r['distinct_eval_tasks']} | {c['random']} | {c['rule']} | {c['base']} | {c['sft']} "
                     f"| {c['sft_rl']} | {c['oracle']} | {v['base']:.2f} / {v['sft']:.2f} / {v['sft_rl']:.2f} | {r['demos']} "
                     f"| {r['sft_steps']} | {r['rl_steps']} | {r['minutes']:.1f} |")
    lines += demo_table([r for r in records if "demo_rl" in r])
    lines += provenance(records)
    lines += ["", "Targets (issue 19):", ""]
    lines += [f"- {name}: **{'met' if met else 'not met'}** ({why})" for name, met, why in targets(records)]
    if args.smoke or args.minutes < 30 or len(ran) < len(ENVS):
        lines += ["", f"Not run here: the issue's budget, `{FULL_COMMAND}` (all {len(ENVS)} envs, 30 min each, ~3.5 h); "
                      "the numbers above are of the budget stated, not evidence about the targets at the full budget."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=list(ENVS), choices=list(ENVS))
    ap.add_argument("--minutes", type=float, default=30.0, help="wall-time budget per env (SFT, then RL for the rest)")
    ap.add_argument("--smoke", action="store_true", help="the tiny end-to-end budget (module doc)")
    ap.add_argument("--sft-steps", type=int, default=0, help="SFT steps (default: the recipe's sft.steps)")
    ap.add_argument("--sft-share", type=float, default=0.5,
                    help="SFT stops at this share of --minutes (sft.max_minutes), so RL always gets time")
    ap.add_argument("--eval-tasks", type=int, default=0, help="held-out tasks (default: the recipe's eval.num_tasks; smoke 4)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_runs/agents"), help="per-env records and the runs")
    ap.add_argument("--resume", action="store_true", help="skip envs already in OUT/results.json")
    ap.add_argument("--keep", action="store_true", help="keep the run directories and checkpoints")
    ap.add_argument("--demo-guided", action="store_true",
                    help="also run demonstration-guided RL (algo.demo_coef) from the same SFT checkpoint; the RL "
                         "minutes are split equally between the two arms")
    ap.add_argument("--demo-coef", type=float, default=0.1, help="algo.demo_coef of the --demo-guided arm")
    ap.add_argument("--no-write", action="store_true", help="print only: no bench/results file, no RESULTS.md section")
    ap.add_argument("--rl", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for the RL part only (repeatable), e.g. a curriculum over the RL tasks: "
                         "--rl curriculum.enabled=true --rl 'curriculum.levels=[{num_numbers: 2},{num_numbers: 4}]'")
    ap.add_argument("overrides", nargs="*", help="extra key=value config overrides for every run")
    args = ap.parse_args()
    if args.smoke and not args.eval_tasks:
        args.eval_tasks = 4
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    done: dict[str, dict] = json.loads(path.read_text()) if args.resume and path.exists() else {}
    for env in args.envs:
        if env not in done:
            done[env] = run_env(env, args)
            path.write_text(json.dumps(done, indent=1))  # a crash in a later env loses nothing already run
            print(f"{env}: base {done[env]['base']:.3f}, sft {done[env]['sft']:.3f}, sft+rl {done[env]['sft_rl']:.3f} "
                  f"({done[env]['minutes']:.1f} min)", flush=True)
    records = [done[e] for e in args.envs]
    text = report(records, args)
    print(text)
    if not args.no_write:
        fields = {"budget": "smoke" if args.smoke else f"{args.minutes:g} min per env", "records": records,
                  "targets": [{"target": n, "met": m, "evidence": w} for n, m, w in targets(records)]}
        print(f"wrote {write_result('agents_smoke' if args.smoke else 'agents', fields)}")
        append_results(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
