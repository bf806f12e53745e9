"""Does `turnrl train` (the embedded default) visibly learn on this machine within 20 minutes, and beyond what?

Runs a recipe (``-c``, default configs/default.yaml, i.e. `turnrl train` with no arguments) under a wall-time
limit, then writes into bench/RESULTS.md:

- the curve: greedy success on the held-out tasks before training and at every evaluation, the valid-action
  rate, wall time, and the time and tokens per phase;
- the baselines on the same held-out tasks (``bench/baselines.py``, computed in this invocation): uniform random,
  the best simple fixed rule, the base model (the run's step-0 evaluation), the trained model (final and best
  evaluation) and the oracle, each with its 95% Wilson interval over the distinct tasks;
- what held out means in this run, counted from its ``task_keys.jsonl``: distinct held-out tasks, distinct
  training tasks, and how many held-out keys training drew (0: held out by content, not only by seed).

The bar (issue 2): success rises by >= 30 percentage points over the untrained model and the valid-action rate
reaches 95%, within 20 minutes of wall time. ``bench/results/learn_<config>.json`` (``learn_default.json`` for the
default) keeps the numbers.

    python bench/learn_default.py [-c configs/frozenlake_raw.yaml] [--minutes 20] [key=value overrides...]
    python bench/learn_default.py --from-run RUN_DIR      # report a finished run (no training)
    python bench/learn_default.py --speed [--new "train.freeze_layers=15 train.prompt_grad=false"] [--seeds 0 1]
    python bench/learn_default.py --speed --seeds 2 --keep-previous   # add a seed to perf.json's last --speed run
    python bench/learn_default.py --speed --seeds 1 2 --reuse         # seeds whose pair finished: read, not rerun
    python bench/learn_default.py --speed --old model.autocast_bf16=true --new model.autocast_bf16=auto  # precision

``--speed`` (issue 22) trains today's recipe and the recipe with ``--new``'s overrides on the same seeds, each run
stopping at its first evaluation at the bar (``eval.stop_at_success``), and reports the wall time each needs to reach
it (``--old`` gives today's side overrides of its own). A side that never reaches the bar within ``--minutes`` has
no time to it; when that is today's side, the time it ran bounds the ratio from above (``time_ratio_at_most``).
The two sides of a seed run side by side, one thread each, so whatever else loads the machine loads both; a side
that finishes first leaves its core idle rather than lending it (one thread cannot use two). The result goes into
``bench/results/perf.json`` (old/new seconds to the bar, their ratio, the new side's first step over a warm one and
its peak RSS, the machine facts) and RESULTS.md. ``warm_step_ratio`` beside it is the per-step part of the ratio
(time per token on the steps both sides ran, :func:`warm_step_ratio`); the rest is how many steps each side needed.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from baselines import cell, measure  # noqa: E402
from machine import append_results, facts, merge_result, write_result  # noqa: E402


def train_run(args) -> tuple[Path, float]:
    """Train the recipe under the budget; returns the run directory and the set-up seconds (model load, build)."""
    from turnrl.build import build
    from turnrl.config import load_config
    from turnrl.loop import train

    t_start = time.perf_counter()
    overrides = [f"train.max_minutes={args.minutes}", "log.progress=false", "log.checkpoint_every=0", "log.checkpoint_at_end=false", *args.overrides]
    cfg = load_config(args.config, overrides)
    # the budget counts model loading and every evaluation: shrink the trainer's own clock by the set-up time
    c = build(cfg)
    setup_s = time.perf_counter() - t_start
    cfg.train.max_minutes = max(0.1, args.minutes - setup_s / 60 - 1.0)  # keep ~1 min for the final evaluation
    return train(cfg, components=c), setup_s


def held_out_counts(run_dir: Path) -> dict[str, int]:
    """From ``task_keys.jsonl``: distinct held-out keys, distinct training keys, and held-out keys training drew."""
    from turnrl.monitor.files import read_jsonl

    rows = read_jsonl(run_dir / "task_keys.jsonl")
    held = {t["key"] for r in rows if r["split"] == "eval" for t in r["tasks"]}
    trained = {t["key"] for r in rows if r["split"] == "train" for t in r["tasks"]}
    return {"held_out": len(held), "trained": len(trained), "overlap": len(held & trained)}


def eval_row(r: dict) -> dict:
    """A baselines-style row from an evaluation's metrics."""
    return {"success": r["eval/success_rate"], "ci95": [r["eval/success_ci_low"], r["eval/success_ci_high"]],
            "distinct_tasks": int(r.get("eval/distinct_tasks", r["eval/num_tasks"])), "step": r["step"]}


def speed_fields(rows: list[dict], evals: list[dict], setup_s: float) -> dict:
    """Seconds to the bar (the first evaluation with >= +30 pp over step 0 and >= 95% sampled valid actions over
    the three steps before it; None if never), the first step's time over the median later step, and peak RSS."""
    train_rows = [r for r in rows if "perf/train_s" in r]
    to_bar = None
    for r in evals[1:]:
        tail = [t["rollout/valid_action_rate"] for t in train_rows if t["step"] <= r["step"]][-3:]
        if r["eval/success_rate"] - evals[0]["eval/success_rate"] >= 0.30 and sum(tail) / max(1, len(tail)) >= 0.95:
            to_bar = r["perf/wall_s"] + setup_s
            break
    step_s = [r["perf/rollout_s"] + r["perf/train_s"] for r in train_rows]
    warm = sorted(step_s[1:])[len(step_s[1:]) // 2] if len(step_s) > 1 else None
    # the first batch is usually the largest (the untrained policy walks all its turns): per token, set-up shows alone
    per_token = [s / max(1.0, r.get("perf/prompt_tokens", 0.0) + r.get("perf/generated_tokens", 0.0))
                 for s, r in zip(step_s, train_rows)]
    warm_per_token = sorted(per_token[1:])[len(per_token[1:]) // 2] if len(per_token) > 1 else None
    ran = max((r.get("perf/wall_s", 0.0) for r in evals), default=0.0) + setup_s  # what a run that never got there had
    return {"seconds_to_bar": to_bar, "seconds_run": ran, "first_step_s": step_s[0] if step_s else None, "warm_step_s": warm,
            "first_step_over_warm": step_s[0] / warm if warm else None,
            "first_step_per_token_over_warm": per_token[0] / warm_per_token if warm_per_token else None,
            "peak_rss_gb": max((r.get("perf/max_rss_gb", 0.0) for r in rows), default=0.0),
            "step_seconds_per_token": {str(r["step"]): s for r, s in zip(train_rows, per_token)}}


def report(args, run_dir: Path, setup_s: float, total_s: float | None) -> dict:
    """The curve and baseline tables (printed, appended to RESULTS.md unless ``--no-write``) and the result fields."""
    from turnrl.config import load_config
    from turnrl.models import load_tokenizer
    from turnrl.monitor.sinks import read_metrics

    cfg = load_config(run_dir / "config.yaml")
    rows = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in rows if "eval/success_rate" in r]
    if not evals or evals[0]["step"] != 0:
        raise SystemExit(f"{run_dir} has no step-0 evaluation (eval.at_start=false?): the base model's row needs it")
    base, last = evals[0], evals[-1]
    best = max(evals[1:], key=lambda r: r["eval/success_rate"]) if len(evals) > 1 else base
    train_rows = [r for r in rows if "perf/train_s" in r]
    total_s = total_s if total_s is not None else last.get("perf/wall_s", 0.0)  # --from-run: the run's own wall time
    baselines = measure(cfg, tokenizer=load_tokenizer(cfg.model.path))
    table = {"random": baselines["random"], "rule": baselines["rule"], "base": eval_row(base), "trained": eval_row(last),
             "best": eval_row(best), "oracle": baselines["oracle"]}
    counts = held_out_counts(run_dir)

    def mean(key):
        vals = [r[key] for r in train_rows if key in r]
        return sum(vals) / max(1, len(vals))

    gain = last["eval/success_rate"] - base["eval/success_rate"]
    # greedy decoding always emits *something* well-formed, so the valid-action bar is judged on the sampled
    # training rollouts (temperature 1), averaged over the last three steps
    tail = [r["rollout/valid_action_rate"] for r in train_rows[-3:]]
    valid_sampled = sum(tail) / max(1, len(tail))
    met = gain >= 0.30 and valid_sampled >= 0.95 and total_s <= args.minutes * 60 + 30
    lines = [
        f"### Learning curve, {args.label} — {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Command: `python {' '.join(sys.argv)}` ({args.label}; {platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}). Run: `{run_dir}`.",
        f"Held-out eval: {int(base['eval/distinct_tasks'])} distinct {cfg.eval.env_id or cfg.env.id} tasks (seeds from "
        f"{cfg.eval.seed_start}), distinct by content from training: the run trained on {counts['trained']} distinct tasks, "
        f"{counts['overlap']} of them held-out tasks (task_keys.jsonl). Greedy, one episode each; 95% Wilson interval "
        "over the distinct tasks in brackets.",
        "",
        "| step | wall (s) | eval success | 95% CI | eval valid-action rate (greedy) | train success (sampled) | train valid-action rate (sampled) |",
        "|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in evals:
        lines.append(
            f"| {r['step']} | {r.get('perf/wall_s', 0.0) + setup_s:.0f} | {r['eval/success_rate']:.3f} "
            f"| {r['eval/success_ci_low']:.2f}-{r['eval/success_ci_high']:.2f} | {r['eval/valid_action_rate']:.3f} "
            f"| {r.get('rollout/success_rate', float('nan')):.3f} | {r.get('rollout/valid_action_rate', float('nan')):.3f} |"
        )
    lines += [
        "",
        "On the same held-out tasks (random, rule, oracle: `bench/baselines.py`, run in this invocation; base = step 0):",
        "",
        "| " + " | ".join(table) + " |",
        "|" + "---:|" * len(table),
        "| " + " | ".join(cell(r) for r in table.values()) + " |",
        "",
        f"Base success {base['eval/success_rate']:.3f} -> final {last['eval/success_rate']:.3f} "
        f"(gain {100 * gain:+.1f} pp; best {best['eval/success_rate']:.3f} at step {best['step']}); "
        f"valid-action rate {last['eval/valid_action_rate']:.3f} greedy, {valid_sampled:.3f} sampled (last 3 steps); "
        f"total wall time {total_s:.0f} s "
        f"(set-up {setup_s:.0f} s). Bar (>= +30 pp and >= 95% valid within {args.minutes:g} min): **{'met' if met else 'not met'}**.",
        f"Per training step (mean over {len(train_rows)} steps): rollout {mean('perf/rollout_s'):.1f} s "
        f"(generate {mean('perf/generate_s'):.1f} s, {mean('perf/prompt_tokens'):.0f} prompt + {mean('perf/generated_tokens'):.0f} generated tokens), "
        f"update {mean('perf/train_s'):.1f} s ({mean('train/num_tokens'):.0f} trained response tokens over {mean('train/num_samples'):.0f} samples, "
        f"{mean('perf/train_tokens_per_s'):.0f} sample tokens/s).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        append_results(text)
    return {
        **speed_fields(rows, evals, setup_s),
        "config": str(args.config), "run_dir": str(run_dir), "distinct_eval_tasks": int(base["eval/distinct_tasks"]),
        "distinct_train_tasks": counts["trained"], "held_out_keys_trained_on": counts["overlap"],
        **{name: row["success"] for name, row in table.items()},
        "ci95": {name: row["ci95"] for name, row in table.items()},
        "best_step": best["step"], "steps": train_rows[-1]["step"] if train_rows else 0, "seconds": total_s,
        "gain": gain, "met": met,
    }


def launch(config: Path, minutes: float, out_dir: Path, name: str, overrides: list[str]) -> subprocess.Popen:
    """One run of this script in a child process: ``config`` for ``minutes``, its result fields in OUT_DIR/NAME.json,
    its run directory OUT_DIR/NAME, its output in OUT_DIR/NAME.log (the command is printed first)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "-c", str(config), "--minutes", str(minutes), "--no-write",
           "--out", str(out_dir / f"{name}.json"), f"log.run_dir={out_dir}", f"log.name={name}", *overrides]
    log = out_dir / f"{name}.log"
    print(f"{name}: {shlex.join(cmd[1:])} (log {log})", flush=True)
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)


def finished(procs: dict[str, subprocess.Popen], out_dir: Path) -> dict[str, dict]:
    """The result fields of every :func:`launch` ed run, by name, once all have ended; SystemExit naming the log of
    the first that failed."""
    for name, p in procs.items():
        if p.wait() != 0:
            raise SystemExit(f"the run {name} failed (exit {p.returncode}): see {out_dir / name}.log")
    return {name: json.loads((out_dir / f"{name}.json").read_text()) for name in procs}


def time_ratios(old: list[dict], new: list[dict]) -> tuple[float | None, float | None, float | None, float | None]:
    """``(old median seconds to the bar, new median, new / old, at most)`` over the seeds' runs. A side with a seed that
    never reached the bar has no median (None). When only the old side failed, its time to the bar exceeds the
    shortest time any of its runs ran, so new / that time bounds the ratio from above (``at most``)."""

    def median_to_bar(runs):
        vals = [r["seconds_to_bar"] for r in runs]
        return None if None in vals else statistics.median(vals)

    old_s, new_s = median_to_bar(old), median_to_bar(new)
    ratio = new_s / old_s if old_s and new_s else None
    at_most = new_s / min(r["seconds_run"] for r in old) if new_s and old_s is None else None
    return old_s, new_s, ratio, at_most


def warm_step_ratio(old: list[dict], new: list[dict]) -> float | None:
    """The per-step part of the time ratio: the new side's time per token over today's, step by step over the warm
    steps both sides of a seed ran (step 1 up to the shorter run's last), the median over those steps and then over
    the seeds. The rest of the time ratio is how many steps each side needed, which, when the two compute the same
    gradient, only the seeds' luck moves.

    Matched steps, per token: a side that stops at the bar early has run only the untrained policy's long episodes,
    and the other side's later steps are cheaper because its policy walks fewer turns, so medians of raw step times
    over each side's own steps compare different batches (seed 0 of the 13:19 run in RESULTS.md: 0.98x from them,
    where one batch's update runs 1.72x faster). Records without per-step times fall back to the two medians."""
    pairs = []
    for o, n in zip(old, new):
        a, b = o.get("step_seconds_per_token"), n.get("step_seconds_per_token")
        steps = sorted(set(a) & set(b) - {"0"}, key=int) if a and b else []
        if steps:
            pairs.append(statistics.median(b[k] / a[k] for k in steps))
        elif o["warm_step_s"] and n["warm_step_s"]:
            pairs.append(n["warm_step_s"] / o["warm_step_s"])
    return statistics.median(pairs) if pairs else None


def earlier_runs(path: Path, args) -> dict[str, list[dict]]:
    """The runs of ``path``'s ``learn_speed`` (a perf.json) made with the same sides, bar and threads as ``args`` on
    seeds this invocation does not run, by side, for ``--keep-previous``; empty when they differ in any of these."""
    if not path.exists():
        return {"today": [], "new": [], "seeds": []}
    prev = json.loads(path.read_text()).get("learn_speed") or {}
    same = (prev.get("old_overrides"), prev.get("new_overrides"), prev.get("bar_stop_at_success"), prev.get("threads_per_side"))
    if same != (args.old, args.new, args.bar, args.threads):
        raise SystemExit(f"--keep-previous: {path}'s runs were made with old={same[0]!r} new={same[1]!r} bar={same[2]} "
                         f"threads={same[3]}, not this invocation's: run without --keep-previous, or with its settings")
    keep = [i for i, seed in enumerate(prev["seeds"]) if seed not in args.seeds]
    return {"today": [prev["runs"]["today"][i] for i in keep], "new": [prev["runs"]["new"][i] for i in keep],
            "seeds": [prev["seeds"][i] for i in keep]}


def speed(args) -> int:
    """Today's recipe against ``--new`` on the same seeds, side by side; seconds to the bar for each (module doc)."""
    machine = facts()  # measured before the runs, on the machine as they find it
    runs: dict[str, list[dict]] = {"today": [], "new": []}
    extra = {"today": shlex.split(args.old), "new": shlex.split(args.new)}
    out_dir = Path(args.run_root)
    out_dir.mkdir(parents=True, exist_ok=True)
    seeds = []
    if args.keep_previous:  # seeds run by an earlier invocation with the same sides count in the medians
        prev = earlier_runs(ROOT / "bench" / "results" / "perf.json", args)
        runs, seeds = {"today": prev["today"], "new": prev["new"]}, prev["seeds"]
    for seed in args.seeds:
        names = [f"speed_{side}_s{seed}" for side in runs]
        if args.reuse and all((out_dir / f"{name}.json").exists() for name in names):  # a pair that already finished
            print(f"seed {seed}: reusing {', '.join(str(out_dir / f'{name}.json') for name in names)}", flush=True)
            done = {name: json.loads((out_dir / f"{name}.json").read_text()) for name in names}
        else:
            procs = {f"speed_{side}_s{seed}": launch(args.config, args.minutes, out_dir, f"speed_{side}_s{seed}", [
                f"train.seed={seed}", f"train.threads={args.threads}", f"eval.stop_at_success={args.bar}",
                f"train.steps={args.max_steps}",  # the wall budget binds, not the step count (the lr is constant)
                *args.overrides, *extra[side]]) for side in runs}
            done = finished(procs, out_dir)
        for side in runs:
            runs[side].append(done[f"speed_{side}_s{seed}"])
        seeds.append(seed)

    old_s, new_s, ratio, at_most = time_ratios(runs["today"], runs["new"])
    step_ratio = warm_step_ratio(runs["today"], runs["new"])
    fields = {"cpu": machine["cpu"], "peak_gflops_bf16": machine["peak_gflops_bf16"],
              "peak_gflops_fp32": machine["peak_gflops_fp32"], "bandwidth_gbs": machine["bandwidth_gbs"],
              "old_seconds_to_bar": old_s, "new_seconds_to_bar": new_s, "time_ratio": ratio, "time_ratio_at_most": at_most,
              "warm_step_ratio": step_ratio,
              "first_step_over_warm": statistics.median(r["first_step_over_warm"] for r in runs["new"]),
              "first_step_per_token_over_warm": statistics.median(r["first_step_per_token_over_warm"] for r in runs["new"]),
              "peak_rss_gb": max(r["peak_rss_gb"] for r in runs["new"]),
              "peak_rss_source": f"the largest perf/max_rss_gb (GiB) of the new side's runs ({args.new or 'the recipe as shipped'}; "
                                 f"seeds {', '.join(map(str, seeds))}, {args.threads} thread(s) each), this --speed invocation",
              "learn_speed": {"old_overrides": args.old, "new_overrides": args.new, "seeds": seeds, "threads_per_side": args.threads,
                              "bar_stop_at_success": args.bar, "runs": runs}}
    fmt = lambda v, f="{:.0f}": "never" if v is None else f.format(v)  # noqa: E731
    today = f"today's default with `{args.old}`" if args.old else "today's default"
    lines = [f"### Time to the bar, {today} against `{args.new}` — {time.strftime('%Y-%m-%d %H:%M')}", "",
             f"Command: `python {' '.join(shlex.quote(a) for a in sys.argv)}` ({machine['cpu']}, {machine['cores']} cores, "
             f"{machine['peak_gflops_bf16']:.0f} GFLOP/s bf16, {machine['peak_gflops_fp32']:.0f} fp32, {machine['bandwidth_gbs']:.1f} GB/s; torch {torch.__version__}). "
             f"Each seed's two sides ran side by side, {args.threads} thread each, each stopping at its first evaluation "
             f"with held-out success >= {args.bar:g} (the bar also needs +30 pp over step 0 and >= 95% sampled valid actions).", "",
             "| seed | side | seconds to bar | step | final eval success | base | distinct held-out / trained tasks (overlap) "
             "| first step s | warm step s | peak RSS GB |", "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for i, seed in enumerate(seeds):
        for side in runs:
            r = runs[side][i]
            lines.append(f"| {seed} | {side} | {fmt(r['seconds_to_bar'])} | {r['steps']} | {r['trained']:.3f} | {r['base']:.3f} "
                         f"| {r['distinct_eval_tasks']} / {r['distinct_train_tasks']} ({r['held_out_keys_trained_on']}) "
                         f"| {fmt(r['first_step_s'], '{:.1f}')} | {fmt(r['warm_step_s'], '{:.1f}')} | {r['peak_rss_gb']:.2f} |")
    lines += ["", f"Median seconds to the bar: today {fmt(old_s)}, new {fmt(new_s)}; ratio new/today "
                  f"**{fmt(ratio, '{:.2f}')}** (target <= 0.5); a warm step takes {fmt(step_ratio, '{:.2f}')}x today's "
                  "(the rest of the ratio is the steps each side needed)"
                  + (f"; today's side did not reach the bar in the {min(r['seconds_run'] for r in runs['today']):.0f} s it ran, "
                     f"so the ratio is **at most {at_most:.2f}**" if at_most else "") + ". New side: first step / warm step "
                  f"{fields['first_step_over_warm']:.2f} ({fields['first_step_per_token_over_warm']:.2f} per token: "
                  f"the first batch is the largest), peak RSS {fields['peak_rss_gb']:.2f} GB.", ""]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        append_results(text)
        print(f"wrote {merge_result('perf', fields, measure=False)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-c", "--config", type=Path, default=ROOT / "configs" / "default.yaml", help="the recipe to train")
    ap.add_argument("--minutes", type=float, default=20.0, help="wall-time budget, model load and evaluations included")
    ap.add_argument("--from-run", type=Path, help="report this finished run directory instead of training one")
    ap.add_argument("--name", help="result file bench/results/NAME.json (default: learn_default for configs/default.yaml, "
                                   "else learn_<config stem>, or learn_<run dir name> with --from-run)")
    ap.add_argument("--no-write", action="store_true", help="print only; do not append to bench/RESULTS.md")
    ap.add_argument("--out", type=Path, help="write the result fields to this JSON file instead of bench/results/NAME.json")
    ap.add_argument("--speed", action="store_true", help="today's recipe against --new: seconds to the bar (module doc)")
    ap.add_argument("--old", default="", help="--speed: today's side's overrides (default none: the recipe as shipped)")
    ap.add_argument("--new", default="train.freeze_layers=15 train.prompt_grad=false", help="--speed: the new side's overrides")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="--speed: train.seed of each pair of runs")
    ap.add_argument("--threads", type=int, default=1, help="--speed: torch threads per side")
    ap.add_argument("--bar", type=float, default=0.30, help="--speed: eval.stop_at_success of every run")
    ap.add_argument("--max-steps", type=int, default=500, help="--speed: train.steps of every run (--minutes ends it first)")
    ap.add_argument("--keep-previous", action="store_true",
                    help="--speed: count the seeds of bench/results/perf.json's last --speed run (same sides, bar, threads) too")
    ap.add_argument("--reuse", action="store_true",
                    help="--speed: take a seed's pair from the run root's result files when both exist instead of running it")
    ap.add_argument("--run-root", default="/tmp/bench_runs/speed", help="--speed: parent of the runs and their logs")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.speed:
        return speed(args)
    if not (args.from_run or args.config).exists():
        raise SystemExit(f"{args.from_run or args.config} does not exist: pass a config under configs/ or a run directory")

    t_start = time.perf_counter()
    if args.from_run:
        run_dir, setup_s, total_s = args.from_run, 0.0, None
        name = args.name or f"learn_{run_dir.name}"
        args.config, args.label = args.from_run / "config.yaml", f"run {run_dir.name}"
    else:
        run_dir, setup_s = train_run(args)
        args.label = args.config.name
        total_s = time.perf_counter() - t_start
        name = args.name or ("learn_default" if args.config.stem == "default" else f"learn_{args.config.stem}")
    fields = report(args, run_dir, setup_s, total_s)
    print(json.dumps(fields))
    if args.out:
        args.out.write_text(json.dumps(fields, indent=2) + "\n")
    else:
        print(f"wrote {write_result(name, fields)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
