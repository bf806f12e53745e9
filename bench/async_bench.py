"""Sync vs async training with a slow tool: steps per hour and held-out success after the same number of steps.

Issue 18's target: with a simulated tool latency of 200 ms per env step (:mod:`turnrl.scale.latency`, as web,
search and SQL tools have), async mode (``scale.async_mode=true``: the next step's batch is generated while the
learner updates, :mod:`turnrl.scale.async_rollout`) makes >= 1.5x the sync steps per hour at equal held-out success
within its interval.

Both runs train the same recipe (``-c``, default configs/default.yaml) from the same seed for the same number of
steps, on the same training tasks (a pure function of the step) with the env wrapped in the latency; async adds
``scale.max_staleness`` (default 1) and ``algo.is_correction`` (default none: PPO's clip against the behaviour
logprobs, the one that reached the bar at staleness 1). A run's training time is its wall time
without evaluations (``perf/wall_s`` at the last step minus the earlier ``perf/eval_s``), so steps/hour measures the
training loop only. Held-out success is the final greedy evaluation on ``eval.num_tasks`` tasks held out by task key,
beside uniform random, the best simple fixed rule, the oracle (``bench/baselines.py``) and the base model (the sync
run's step-0 evaluation) on the same tasks, each with its 95% Wilson interval over the distinct tasks.

    python bench/async_bench.py --smoke          # 2 steps x 2 tasks x 2 copies, 8 held-out tasks: the pipeline works
    python bench/async_bench.py                  # the recipe's own budget (configs/default.yaml: 40 steps, 64 tasks)
    python bench/async_bench.py --steps 10 rollout.group_size=4   # any budget; key=value overrides apply to both runs

Writes ``bench/results/scale_async.json`` (``--smoke``: ``scale_async_smoke.json``) with ``sync_steps_per_hour``,
``async_steps_per_hour``, ``ratio``, ``env_latency_ms``, ``sync_success``, ``async_success``, ``distinct_eval_tasks``
and the baselines; :func:`compare` is the measurement, for ``bench/scale.py`` to call.

``--to-bar`` answers the issue's other question, whether async training with staleness 1 and 2 and the IS correction
still reaches the default recipe's learning bar: one ``bench/learn_default.py`` run per staleness (side by side, one
thread each, no simulated latency: the question is what stale batches do to learning), each stopping at its first
evaluation at the bar (held-out success >= 0.30, +30 pp over step 0, >= 95% valid actions) or at ``--minutes``.
``--sync RUN.json`` adds a sync run's record of the same seed (e.g. ``learn_default.py --speed``'s today side) to
the table; ``--from-runs DIR`` reports runs already made (``DIR/async_s{K}.json``). It merges ``staleness_to_bar``
into ``scale_async.json``.

    python bench/async_bench.py --to-bar [--staleness 1 2] [--minutes 40] [--sync /tmp/bench_runs/speed/speed_today_s0.json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from baselines import cell, measure, summary  # noqa: E402
from learn_default import finished, launch  # noqa: E402
from machine import append_results, merge_result, write_result  # noqa: E402

SMOKE = ["train.steps=2", "rollout.tasks_per_step=2", "rollout.group_size=2", "eval.num_tasks=8"]


def slow(cfg, latency_ms: float):
    """``cfg`` with its env wrapped in the simulated tool latency (same tasks, same task keys)."""
    cfg = cfg.model_copy(deep=True)
    cfg.env.kwargs = {"env": cfg.env.id, "latency_ms": latency_ms, **cfg.env.kwargs}
    cfg.env.id = "turnrl.scale.latency:slow_env"
    return cfg


def timed_run(cfg, run_dir: Path, name: str) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir/name``; its training seconds, steps, final and step-0 evaluations and step metrics."""
    from turnrl.build import build
    from turnrl.loop import train
    from turnrl.monitor.sinks import read_metrics

    cfg = cfg.model_copy(deep=True)
    cfg.log.run_dir, cfg.log.name = str(run_dir), name
    rows = read_metrics(train(cfg, components=build(cfg)) / "metrics.jsonl")
    steps = [r for r in rows if "perf/wall_s" in r]
    evals = [r for r in rows if "eval/success_rate" in r]
    earlier_evals = sum(r.get("perf/eval_s", 0.0) for r in rows if r["step"] < steps[-1]["step"])
    seconds = steps[-1]["perf/wall_s"] - earlier_evals
    return {"seconds": seconds, "steps": len(steps), "steps_per_hour": 3600 * len(steps) / seconds,
            "final": summary(evals[-1]), "start": summary(evals[0]) if evals[0]["step"] == 0 else None,
            "staleness_mean": _mean(steps, "train/staleness_mean"), "stale_dropped": _mean(steps, "rollout/stale_dropped"),
            "is_ratio_max": max((r.get("train/is_ratio_max", 0.0) for r in steps), default=0.0),
            "rollout_s": _mean(steps, "perf/rollout_s"), "train_s": _mean(steps, "perf/train_s")}


def _mean(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return sum(vals) / len(vals) if vals else float("nan")


def compare(cfg, latency_ms: float = 200.0, max_staleness: int = 1, is_correction: str = "none",
            keep: Path | None = None) -> dict[str, Any]:
    """Sync then async training of ``cfg`` with every env step ``latency_ms`` slower; the scale_async.json fields.

    The async run adds ``scale.async_mode=true``, ``max_staleness`` and ``is_correction``; run directories go under
    ``keep`` (else a temporary directory, deleted after).
    """
    work = Path(keep or tempfile.mkdtemp(prefix="async_bench_"))
    try:
        base = slow(cfg, latency_ms)
        base.eval.every, base.log.checkpoint_every, base.log.checkpoint_at_end = 0, 0, False
        base.log.progress, base.log.tensorboard = False, False
        sync_cfg = base.model_copy(deep=True)
        sync_cfg.eval.at_start = True  # the base model's row
        async_cfg = base.model_copy(deep=True)
        async_cfg.scale.async_mode, async_cfg.scale.max_staleness = True, max_staleness
        async_cfg.algo.is_correction = is_correction
        async_cfg.eval.at_start = False  # the base model is evaluated once, in the sync run
        sync = timed_run(sync_cfg, work, "sync")
        asyn = timed_run(async_cfg, work, "async")
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "sync_steps_per_hour": sync["steps_per_hour"], "async_steps_per_hour": asyn["steps_per_hour"],
        "ratio": asyn["steps_per_hour"] / sync["steps_per_hour"], "env_latency_ms": latency_ms,
        "sync_success": sync["final"]["success"], "async_success": asyn["final"]["success"],
        "distinct_eval_tasks": sync["final"]["distinct_tasks"], "steps": sync["steps"],
        "async_settings": {"max_staleness": async_cfg.scale.max_staleness, "is_correction": async_cfg.algo.is_correction,
                           "is_level": async_cfg.algo.is_level, "is_cap": async_cfg.algo.is_cap},
        "runs": {"sync": sync, "async": asyn},
    }


def to_bar(args) -> int:
    """``--to-bar``: does async training at each ``--staleness`` reach the learning bar? (module docstring)"""
    out = Path(args.from_runs or args.run_root)
    if not args.from_runs:
        out.mkdir(parents=True, exist_ok=True)
        procs = {f"async_s{k}": launch(args.config, args.minutes, out, f"async_s{k}", [
            f"train.seed={args.seed}", "train.threads=1", "eval.stop_at_success=0.3", "train.steps=500",
            "scale.async_mode=true", f"scale.max_staleness={k}", f"algo.is_correction={args.is_correction}",
            *args.overrides]) for k in args.staleness}
        finished(procs, out)
    runs = {f"async_s{k}": json.loads((out / f"async_s{k}.json").read_text()) for k in args.staleness}
    if args.sync:
        runs = {"sync": json.loads(Path(args.sync).read_text())} | runs
    keep = ("met", "seconds_to_bar", "seconds", "best", "best_step", "steps", "trained", "ci95", "base", "random", "rule", "oracle",
            "distinct_eval_tasks", "held_out_keys_trained_on", "run_dir")
    fields = {"staleness_to_bar": {"is_correction": args.is_correction, "seed": args.seed,
                                   "runs": {n: {k: r.get(k) for k in keep} for n, r in runs.items()}}}
    first = next(iter(runs.values()))
    lines = [
        f"### Async training to the learning bar at staleness {' and '.join(map(str, args.staleness))} — "
        f"{time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Command: `python {shlex.join(sys.argv)}`. Default recipe, seed {args.seed}, one thread per run, runs side by side; "
        f"async: is_correction {args.is_correction}; each run stops at its first evaluation at the bar (held-out "
        f"success >= 0.30 and +30 pp over step 0) or at its wall budget.",
        "",
        "| run | bar met | steps run | seconds (to the bar, else run) | last held-out success [95% CI] | best (step) "
        "| distinct held-out (trained on) |",
        "|---|---|---:|---:|---:|---:|---|",
        *(f"| {n} | {'yes' if r['met'] else 'no'} | {r['steps']} | {r['seconds_to_bar'] or r['seconds']:.0f} "
          f"| {r['trained']:.3f} [{r['ci95']['trained'][0]:.2f}-{r['ci95']['trained'][1]:.2f}] "
          f"| {r['best']:.3f} ({r['best_step']}) | {r['distinct_eval_tasks']} ({r['held_out_keys_trained_on']}) |"
          for n, r in runs.items()),
        "",
        f"On the same held-out tasks: random {first['random']:.3f}, rule {first['rule']:.3f}, base {first['base']:.3f}, "
        f"oracle {first['oracle']:.3f}.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        append_results(text)
        print(f"wrote {merge_result('scale_async', fields)}")
    return 0


def main() -> int:
    from turnrl.config import load_config
    from turnrl.models import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", type=Path, default=ROOT / "configs" / "default.yaml")
    ap.add_argument("--smoke", action="store_true", help="the reduced budget: " + " ".join(SMOKE))
    ap.add_argument("--steps", type=int, help="training steps of each run (default: the recipe's train.steps)")
    ap.add_argument("--latency-ms", type=float, default=200.0, help="simulated tool latency per env step")
    ap.add_argument("--max-staleness", type=int, default=1, help="the async run's scale.max_staleness")
    ap.add_argument("--is-correction", default="none", choices=["none", "decoupled", "tis", "mis"],
                    help="the async run's algo.is_correction")
    ap.add_argument("--keep", type=Path, help="keep the two run directories here (default: deleted)")
    ap.add_argument("--no-write", action="store_true", help="print only; do not append to bench/RESULTS.md")
    ap.add_argument("--to-bar", action="store_true", help="async runs at each --staleness until the learning bar")
    ap.add_argument("--staleness", type=int, nargs="+", default=[1, 2], help="--to-bar: the max_staleness values")
    ap.add_argument("--minutes", type=float, default=40.0, help="--to-bar: wall budget per run")
    ap.add_argument("--seed", type=int, default=0, help="--to-bar: train.seed of every run")
    ap.add_argument("--sync", help="--to-bar: a sync run's learn_default.py JSON to show beside them")
    ap.add_argument("--from-runs", help="--to-bar: report the runs already in this directory (no training)")
    ap.add_argument("--run-root", default="/tmp/bench_runs/stale", help="--to-bar: where the runs go")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for both runs, as for turnrl train")
    args = ap.parse_args()
    if args.to_bar:
        return to_bar(args)
    if not args.config.exists():
        raise SystemExit(f"no config {args.config}: pass -c with a file under configs/")
    overrides = [*(SMOKE if args.smoke else []), *([f"train.steps={args.steps}"] if args.steps else []), *args.overrides]
    cfg = load_config(args.config, overrides)
    t0 = time.perf_counter()
    fields = compare(cfg, args.latency_ms, args.max_staleness, args.is_correction, args.keep)
    rows = measure(cfg, ("random", "rule", "oracle"), tokenizer=load_tokenizer(cfg.model.path))
    table = {"random": rows["random"], "rule": rows["rule"], "base": fields["runs"]["sync"]["start"],
             "sync": fields["runs"]["sync"]["final"], "async": fields["runs"]["async"]["final"], "oracle": rows["oracle"]}
    fields |= {"baselines": {k: v["success"] for k, v in table.items() if v}, "ci95": {k: v["ci95"] for k, v in table.items() if v},
               "budget": "smoke" if args.smoke else f"{args.steps} steps" if args.steps else "full", "seconds": time.perf_counter() - t0}
    text = report(args, fields, table)
    print(text)
    if not args.no_write:
        append_results(text)
    print(f"wrote {write_result('scale_async_smoke' if args.smoke else 'scale_async', fields)}")
    return 0


def report(args, f: dict[str, Any], table: dict[str, dict | None]) -> str:
    """The RESULTS.md section: throughput, success beside the baselines, what the async run did."""
    s, a = f["runs"]["sync"], f["runs"]["async"]
    met = f["ratio"] >= 1.5 and a["final"]["ci95"][0] <= s["final"]["success"] <= a["final"]["ci95"][1]
    return "\n".join([
        f"### Sync vs async with {f['env_latency_ms']:g} ms tool latency ({f['budget']} budget) — {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Command: `python {' '.join(sys.argv)}`. {f['steps']} steps each, same seed and training tasks; async: "
        f"max_staleness {f['async_settings']['max_staleness']}, is_correction {f['async_settings']['is_correction']}.",
        "",
        "| run | training s | steps/hour | rollout wait s/step | update s/step | staleness (mean) | stale dropped | held-out success [95% CI] |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {k} | {r['seconds']:.0f} | {r['steps_per_hour']:.0f} | {r['rollout_s']:.1f} | {r['train_s']:.1f} "
          f"| {r['staleness_mean']:.2f} | {r['stale_dropped']:.0f} | {cell(r['final'])} |" for k, r in (("sync", s), ("async", a))),
        "",
        f"On the same {f['distinct_eval_tasks']} held-out tasks: " + ", ".join(f"{k} {cell(r)}" for k, r in table.items()) + ".",
        f"Ratio async/sync steps per hour: **{f['ratio']:.2f}x**; target (>= 1.5x at equal success within the interval): "
        + ("not judged: a smoke budget shows only that the pipeline runs." if f["budget"] == "smoke"
           else f"**{'met' if met else 'not met'}**."),
        "",
    ])


if __name__ == "__main__":
    sys.exit(main())
