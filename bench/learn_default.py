"""Does `turnrl train` (the embedded default) visibly learn on this machine within 20 minutes?

Runs the default recipe (configs/default.yaml, i.e. `turnrl train` with no arguments) under a wall-time
limit, then writes the curve into bench/RESULTS.md: greedy success on held-out random maps (seeds never
used in training) before training and at every evaluation, the valid-action rate, wall time, and the
time and tokens per phase. The bar (issue 2): success rises by >= 30 percentage points over the untrained
model and the valid-action rate reaches 95%, within 20 minutes of wall time.

    python bench/learn_default.py [--minutes 20] [key=value overrides...]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=20.0, help="wall-time budget, model load and evaluations included")
    ap.add_argument("--no-write", action="store_true", help="print only; do not append to bench/RESULTS.md")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    from turnrl.config import load_config
    from turnrl.monitor.sinks import read_metrics
    from turnrl.build import build
    from turnrl.loop import train

    t_start = time.perf_counter()
    overrides = [f"train.max_minutes={args.minutes}", "log.progress=false", "log.checkpoint_every=0", "log.checkpoint_at_end=false", *args.overrides]
    cfg = load_config(ROOT / "configs" / "default.yaml", overrides)
    # the budget counts model loading and every evaluation: shrink the trainer's own clock by the set-up time
    c = build(cfg)
    setup_s = time.perf_counter() - t_start
    cfg.train.max_minutes = max(0.1, args.minutes - setup_s / 60 - 1.0)  # keep ~1 min for the final evaluation
    run_dir = train(cfg, components=c)
    total_s = time.perf_counter() - t_start

    rows = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in rows if "eval/success_rate" in r]
    base = evals[0]
    last = evals[-1]
    best = max(evals[1:], key=lambda r: r["eval/success_rate"]) if len(evals) > 1 else base
    train_rows = [r for r in rows if "perf/train_s" in r]

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
        f"### Default recipe learning curve — {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"Command: `python bench/learn_default.py --minutes {args.minutes:g}{' ' + ' '.join(args.overrides) if args.overrides else ''}` "
        f"(configs/default.yaml; {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}).",
        f"Held-out eval: {int(base['eval/num_tasks'])} random 4x4 maps (seeds from {cfg.eval.seed_start}, never trained on), greedy, "
        f"one episode each; 95% Wilson interval in brackets.",
        "",
        "| step | wall (s) | eval success | 95% CI | eval valid-action rate (greedy) | train success (sampled) | train valid-action rate (sampled) |",
        "|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in evals:
        wall = r.get("perf/wall_s", 0.0) + setup_s
        lines.append(
            f"| {r['step']} | {wall:.0f} | {r['eval/success_rate']:.3f} | {r['eval/success_ci_low']:.2f}-{r['eval/success_ci_high']:.2f} "
            f"| {r['eval/valid_action_rate']:.3f} | {r.get('rollout/success_rate', float('nan')):.3f} "
            f"| {r.get('rollout/valid_action_rate', float('nan')):.3f} |"
        )
    lines += [
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
    print(json.dumps({"run_dir": str(run_dir), "gain": gain, "met": met}))
    if not args.no_write:
        results = ROOT / "bench" / "RESULTS.md"
        if not results.exists():
            results.write_text("# Benchmark results\n\nEach section says when and how it was measured.\n\n")
        with results.open("a") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
