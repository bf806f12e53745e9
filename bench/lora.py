"""LoRA vs full fine-tuning: update seconds and peak memory on the default recipe's per-step samples.

The batch is what `turnrl train` trains on at step 0 of the default recipe (configs/default.yaml: SmolLM2-135M,
FrozenLake, 4 tasks x 8 episodes, per-step context, grpo_turn): built, collected, credited and turned into samples by
the library's own path (``build``, ``loop.collect_step``, ``loop.assign_credit``, ``build_samples``), once, in this
process. Each arm then runs in a fresh subprocess, so one arm's memory high-water mark cannot hide the other's: it
loads the default model (with LoRA adapters in the LoRA arm, ``lora.*`` as configured, default rank 16 on every
attention and MLP projection), builds the learner from the same config (bf16 autocast), runs one warm-up update
(CPU kernels are built per shape; AdamW's state is created then), then ``--updates`` timed ones on the same batch.

Memory is the subprocess's peak resident set size, ``getrusage(RUSAGE_SELF).ru_maxrss`` (the kernel's high-water
mark of RSS, model load included; tracemalloc would miss torch's allocations); the RSS high-water mark before the
first update is reported beside it. The learner alone: no engine is built in the arms.

    python bench/lora.py            # the full budget: the default batch, 3 timed updates per arm
    python bench/lora.py --smoke    # 1 task x 4 episodes, 1 timed update per arm; writes results/lora_smoke.json
    python bench/lora.py [--updates N] [--threads T] [--no-write] [key=value config overrides for both arms ...]

Target (issue 19): LoRA >= 1.5x the update speed of full fine-tuning at <= 0.6x its peak memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from machine import write_result  # noqa: E402

SMOKE = ["rollout.tasks_per_step=1", "rollout.group_size=4"]
ARMS = {"full": ["lora.enabled=false"], "lora": ["lora.enabled=true"]}


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB


def default_batch(overrides: list[str], path: Path) -> dict:
    """Collect and credit step 0 of the default recipe (with ``overrides``); write its samples to ``path`` as JSON."""
    from turnrl import credit
    from turnrl.build import build, sampling_params
    from turnrl.config import load_config
    from turnrl.learner import build_samples
    from turnrl.loop import assign_credit, collect_step, credit_inputs, credit_params

    cfg = load_config(ROOT / "configs" / "default.yaml", overrides)
    c = build(cfg)
    estimator = credit.get_estimator(cfg.algo.estimator)
    groups, _, _, _ = collect_step(c, 0, sampling_params(cfg))
    params = credit_inputs(c, groups, estimator, credit_params(cfg))
    samples = build_samples([t for g in groups for t in g.trajectories], assign_credit(c, groups, estimator, params))
    if cfg.algo.skip_zero_advantage:  # as the loop drops them (kl_coef and entropy_coef are 0 in the default recipe)
        samples = [s for s in samples if any(a != 0.0 for a in s.advantages)]
    path.write_text(json.dumps([dataclasses.asdict(s) for s in samples]))
    return {"samples": len(samples), "tokens": sum(len(s) for s in samples),
            "trained_tokens": sum(sum(s.loss_mask) for s in samples)}


def arm(args) -> int:
    """One arm in this process: model (+ adapters), learner, warm-up, timed updates; prints one JSON line."""
    import torch

    from turnrl.build import with_lora
    from turnrl.config import load_config
    from turnrl.learner import Learner, LearnerParams
    from turnrl.models import load_model, load_tokenizer
    from turnrl.models.lora import trainable_parameters
    from turnrl.types import TrainSample

    torch.set_num_threads(args.threads)
    cfg = load_config(ROOT / "configs" / "default.yaml", args.overrides + ARMS[args.arm])
    samples = [TrainSample(**s) for s in json.loads(Path(args.batch).read_text())]
    tok = load_tokenizer(cfg.model.path)
    model = load_model(cfg.model.path)
    if cfg.lora.enabled:
        model = with_lora(cfg, model)
    learner = Learner(model, LearnerParams.from_config(cfg), pad_id=tok.pad_token_id)
    before = _rss_gb()
    t = time.perf_counter()
    learner.update(samples)  # warm-up
    warm_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(args.updates):
        metrics = learner.update(samples)
    print(json.dumps({"update_s": (time.perf_counter() - t) / args.updates, "warmup_s": warm_s, "peak_rss_gb": _rss_gb(),
                      "rss_before_update_gb": before, "trained_parameters": trainable_parameters(model),
                      "micro_batches": metrics["train/micro_batches"]}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a small batch and one timed update per arm")
    ap.add_argument("--updates", type=int, default=None, help="timed updates per arm after the warm-up (default 3; 1 with --smoke)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads in each arm")
    ap.add_argument("--no-write", action="store_true", help="print only; do not write bench/results/lora.json")
    ap.add_argument("--arm", choices=list(ARMS), help=argparse.SUPPRESS)  # internal: run one arm
    ap.add_argument("--batch", help=argparse.SUPPRESS)  # internal: the samples file
    ap.add_argument("overrides", nargs="*", help="config key=value overrides for the batch and both arms")
    args = ap.parse_args()
    args.updates = args.updates or (1 if args.smoke else 3)
    args.overrides = (SMOKE if args.smoke else []) + args.overrides
    if args.arm:
        return arm(args)

    with tempfile.TemporaryDirectory() as tmp:
        batch_file = Path(tmp) / "samples.json"
        batch = default_batch(args.overrides, batch_file)
        print(f"batch: {batch}", flush=True)
        results = {}
        for name in ARMS:
            cmd = [sys.executable, __file__, "--arm", name, "--batch", str(batch_file), "--updates", str(args.updates),
                   "--threads", str(args.threads), *args.overrides]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"arm {name!r} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
            results[name] = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{name}: {results[name]}", flush=True)

    full, lora = results["full"], results["lora"]
    speed = full["update_s"] / lora["update_s"]
    memory = lora["peak_rss_gb"] / full["peak_rss_gb"]
    met = speed >= 1.5 and memory <= 0.6
    fields = {"smoke": args.smoke, "overrides": args.overrides, "updates": args.updates, "threads": args.threads,
              "batch": batch, "full": full, "lora": lora, "speed_ratio": round(speed, 3), "peak_rss_ratio": round(memory, 3),
              "target": "speed_ratio >= 1.5 and peak_rss_ratio <= 0.6", "target_met": met}
    report = "\n".join([
        f"Batch: step 0 of the default recipe{' (' + ' '.join(args.overrides) + ')' if args.overrides else ''}: "
        f"{batch['samples']} samples, {batch['tokens']} tokens, {batch['trained_tokens']} trained; {args.updates} timed "
        f"update(s) per arm after one warm-up, {args.threads} threads, each arm in its own process.",
        "",
        "| arm | trained parameters | s per update | warm-up s | RSS before update (GB) | peak RSS (GB) |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {n} | {r['trained_parameters'] / 1e6:.2f}M | {r['update_s']:.2f} | {r['warmup_s']:.1f} "
          f"| {r['rss_before_update_gb']:.2f} | {r['peak_rss_gb']:.2f} |" for n, r in results.items()),
        "",
        f"LoRA vs full fine-tuning: **{speed:.2f}x** the update speed at **{memory:.2f}x** the peak RSS "
        f"(target >= 1.5x at <= 0.6x: {'met' if met else 'not met'}).",
    ])
    print("\n" + report)
    if not args.no_write:
        print(f"wrote {write_result('lora_smoke' if args.smoke else 'lora', fields)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
