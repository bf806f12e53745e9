"""Experience retrieval on vs off: how many steps does retrieval need to reach the no-retrieval arm's final held-out
success (issue 20's target: <= 70% of the off arm's steps)?

Both arms train the default model from the same start on the same training tasks (a pure function of the step) with
the same budget; the only difference is ``experience.retrieve``. Evaluation is greedy on held-out tasks distinct by
task key (``build.TaskSplit``: no training task has a held-out key), so every record the library holds comes from a
training task; at evaluation the library is read, never written. Printed and written (``bench/results/experience.json``;
``experience_smoke.json`` with ``--smoke``, so a smoke never replaces a measurement):

- each arm's held-out success at every evaluation, with its 95% interval over the distinct tasks;
- ``steps_off``: the first evaluation step at which the off arm reaches its own final success; ``steps_on``: the first
  at which the on arm reaches it (None: never); ``steps_ratio = steps_on / steps_off`` (None when the off arm's
  final success is not above its start, so there is nothing to reach, or the on arm never reaches it);
- beside them, on the same held-out tasks: uniform random, the best simple fixed rule, the oracle
  (``bench/baselines.py``, computed in this invocation) and the base model (the off arm's step-0 evaluation).

The default env is FrozenLake with the neighbour hint (configs/default.yaml). Its anchor and its observation hold the
map, and held-out maps are never training maps, so at evaluation neither can match exactly; the on arm therefore looks
records up by the env's situation (``--key situation``: the neighbour cells and the goal's direction, which recur
across maps). ``--parallel`` trains the two arms at once in two processes (on a machine with a core per arm);
``--resume`` reads an arm whose run directory under ``--out`` already holds a finished run of the same config.

    python bench/experience.py --smoke            # end-to-end check: 2 steps, 2 tasks x 2, 4 held-out tasks
    python bench/experience.py                    # the full budget: configs/default.yaml's 40 steps, 64 held-out tasks
    python bench/experience.py -c configs/sokoban.yaml env.kwargs.size=5   # another env (key=value overrides)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from baselines import cell, measure  # noqa: E402
from machine import run_jobs, write_result  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SUMMARY = ("env", "key", "overrides", "steps", "steps_on", "steps_off", "final_on", "final_off", "steps_ratio", "off_learned",
           "distinct_eval_tasks", "budget")

SMOKE = ["train.steps=2", "rollout.tasks_per_step=2", "rollout.group_size=2", "eval.num_tasks=4", "eval.every=1"]


def arm_config(args, retrieve: bool):
    """The config of one arm: the recipe, the budget, the overrides, and whether experience is retrieved."""
    from turnrl.config import load_config

    return load_config(args.config, [
        *(SMOKE if args.smoke else []), "log.progress=false", "log.tensorboard=false", "log.checkpoint_every=0",
        "log.checkpoint_at_end=false", "log.sample_trajectories=0", f"log.run_dir={args.out}",
        f"log.name=experience-{'on' if retrieve else 'off'}", f"experience.retrieve={str(retrieve).lower()}",
        f"experience.key={args.key}", *args.overrides,
    ])


def run_arm(args, retrieve: bool) -> list[dict]:
    """Train one arm; returns its evaluations ``{"step", "success", "ci95", "distinct_tasks"}`` and, from the
    training steps, the experience metrics."""
    from turnrl.build import build
    from turnrl.loop import train
    from turnrl.monitor.sinks import read_metrics

    cfg = arm_config(args, retrieve)
    rows = finished_rows(cfg) if args.resume else None
    if rows is None:
        rows = read_metrics(train(cfg, components=build(cfg)) / "metrics.jsonl")
    hits = {r["step"]: r.get("experience/hit_rate") for r in rows if "perf/train_s" in r}
    return [{"step": r["step"], "success": r["eval/success_rate"], "ci95": [r["eval/success_ci_low"], r["eval/success_ci_high"]],
             "distinct_tasks": int(r["eval/distinct_tasks"]), "train_hit_rate": hits.get(r["step"])}
            for r in rows if "eval/success_rate" in r]


def finished_rows(cfg) -> list[dict] | None:
    """``--resume``: the metrics of the arm's run directory when it holds a finished run of exactly ``cfg`` (its
    ``config.yaml`` loads to the same config, and it evaluated at the last step); None otherwise (train it)."""
    from turnrl.config import load_config
    from turnrl.monitor.sinks import read_metrics

    run_dir = Path(cfg.log.run_dir) / cfg.log.name
    if not (run_dir / "config.yaml").exists() or not (run_dir / "metrics.jsonl").exists():
        return None
    if load_config(run_dir / "config.yaml", []).model_dump() != cfg.model_dump():
        print(f"--resume: {run_dir} ran another config; training the arm again", flush=True)
        return None
    rows = read_metrics(run_dir / "metrics.jsonl")
    if not any(r["step"] == cfg.train.steps and "eval/success_rate" in r for r in rows):
        return None
    print(f"--resume: read the finished arm {run_dir}", flush=True)
    return rows


def first_reaching(curve: list[dict], level: float) -> int | None:
    """The first evaluation step after 0 whose success is at least ``level``."""
    return next((r["step"] for r in curve if r["step"] > 0 and r["success"] >= level), None)


def compare(on: list[dict], off: list[dict]) -> dict:
    """The result fields of the two curves (the module docstring defines them)."""
    final_off, final_on = off[-1]["success"], on[-1]["success"]
    steps_off = first_reaching(off, final_off)
    steps_on = first_reaching(on, final_off)
    learned = final_off > off[0]["success"]
    ratio = steps_on / steps_off if learned and steps_on is not None and steps_off else None
    return {"steps_on": steps_on, "steps_off": steps_off, "final_on": final_on, "final_off": final_off,
            "steps_ratio": ratio, "off_learned": learned}


def report(args, on: list[dict], off: list[dict], baselines: dict, fields: dict) -> str:
    lines = [f"env {fields['env']}, key {args.key}, {fields['distinct_eval_tasks']} distinct held-out tasks",
             "| step | off | on | on: training turns shown a record |", "|---:|---:|---:|---:|"]
    for a, b in zip(off, on):
        hit = "-" if b["train_hit_rate"] is None else f"{b['train_hit_rate']:.2f}"
        lines.append(f"| {a['step']} | {cell(a)} | {cell(b)} | {hit} |")
    lines += ["", "| baseline | success [95% CI] |", "|---|---:|", f"| base model (step 0) | {cell(off[0])} |"]
    lines += [f"| {name} | {cell(row)} |" for name, row in baselines.items()]
    ratio = "n/a" if fields["steps_ratio"] is None else f"{fields['steps_ratio']:.2f}"
    lines += ["", f"off final {fields['final_off']:.3f} first reached at step {fields['steps_off']}; on reaches it at "
              f"step {fields['steps_on']}; steps ratio {ratio} (target <= 0.70)"
              + ("" if fields["off_learned"] else "; the off arm did not rise above its start: nothing to reach")]
    return "\n".join(lines)


def link_into_memory() -> Path | None:
    """Copy the summary of ``bench/results/experience.json`` (a full-budget run only, with its command, date and
    commit) into the ``experience`` field of ``bench/results/memory.json``, which issue 20 asks to hold it; the rest of
    memory.json is left as bench/memory.py wrote it. Returns memory.json's path, or None when either file is missing
    or the run was a smoke."""
    source, memory = RESULTS / "experience.json", RESULTS / "memory.json"
    if not (source.exists() and memory.exists()):
        return None
    run = json.loads(source.read_text())
    if run.get("budget") == "smoke":
        return None
    summary = {k: run.get(k) for k in SUMMARY} | {"source": {"file": "bench/results/experience.json",
                                                             **{k: run.get(k) for k in ("command", "date", "commit")}}}
    memory.write_text(json.dumps(json.loads(memory.read_text()) | {"experience": summary}, indent=2) + "\n")
    return memory


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", type=Path, default=ROOT / "configs" / "default.yaml")
    ap.add_argument("--smoke", action="store_true", help="the reduced budget: " + " ".join(SMOKE))
    ap.add_argument("--key", choices=["anchor", "situation", "observation"], default="situation",
                    help="experience.key of the on arm")
    ap.add_argument("--parallel", action="store_true", help="train the two arms at once, each in its own process")
    ap.add_argument("--resume", action="store_true",
                    help="read an arm whose run directory under --out holds a finished run of the same config instead "
                         "of training it again (after a crash of the other arm)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "experience_bench")
    ap.add_argument("--link-only", action="store_true",
                    help="train nothing: copy bench/results/experience.json's summary into memory.json's experience field")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides for both arms, as for turnrl train")
    args = ap.parse_args()
    if args.link_only:
        linked = link_into_memory()
        print(f"linked into {linked}" if linked else "nothing linked: no full-budget experience.json or no memory.json")
        return 0 if linked else 1

    from turnrl.models import load_tokenizer

    t0 = time.perf_counter()
    arms = run_jobs(run_arm, {"off": (args, False), "on": (args, True)}, 2 if args.parallel else 1)
    off, on = arms["off"], arms["on"]
    cfg = arm_config(args, retrieve=False)
    baselines = measure(cfg, tokenizer=load_tokenizer(cfg.model.path))
    fields = {"env": cfg.env.id, **compare(on, off), "distinct_eval_tasks": off[0]["distinct_tasks"],
              "key": args.key, "budget": "smoke" if args.smoke else "full", "overrides": args.overrides,
              "steps": cfg.train.steps, "tasks_per_step": cfg.rollout.tasks_per_step, "group_size": cfg.rollout.group_size,
              "curve_on": on, "curve_off": off, "baselines": baselines, "wall_s": round(time.perf_counter() - t0, 1)}
    print(report(args, on, off, baselines, fields))
    print(f"wrote {write_result('experience_smoke' if args.smoke else 'experience', fields)}")
    if not args.smoke and (linked := link_into_memory()):
        print(f"linked its summary into {linked}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
