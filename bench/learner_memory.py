"""Learner peak memory and update time on full-context multi-turn samples: LM head on every kept position
(the baseline, the model's own ``logits_to_keep`` path) vs on loss positions only, and micro-batch sizes.

With ``rollout.context: full`` one sample is a whole conversation: prompt, then response / observation /
response ... The learner needs logits only where a response token is predicted, but the kept span runs
from the first response token to the end, so it also holds observation (tool output) tokens and padding;
on the default model each kept position costs a 49,152-wide logits row. Samples here are synthetic token
ids shaped like the tool-env recipes (a shared 400-token system prompt + tool docs, 6 turns of a 30-50
token observation and a 20-64 token response), with +-1 advantages: speed and memory do not depend on
which tokens they are.

Each variant runs in a fresh process (peak RSS is per process) with the default model under bf16
autocast: one warm-up update (CPU kernels are built per shape), then ``--updates`` timed ones.

    python bench/learner_memory.py [--samples 16] [--updates 1] [--threads 2] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {  # name: (LM head on loss positions only, micro_batch_tokens)
    "full-span head, 4096": (False, 4096),
    "loss-only head, 4096": (True, 4096),
    "loss-only head, 2048": (True, 2048),
    "loss-only head, 1024": (True, 1024),
}


def synthetic_samples(n: int, seed: int = 0):
    from turnrl.types import TrainSample

    rng = random.Random(seed)
    prefix = [rng.randint(100, 40_000) for _ in range(400)]
    samples = []
    for i in range(n):
        ids, mask = list(prefix), [0] * len(prefix)
        for _ in range(6):
            obs = [rng.randint(100, 40_000) for _ in range(rng.randint(30, 50))]
            resp = [rng.randint(100, 40_000) for _ in range(rng.randint(20, 64))]
            ids += obs + resp
            mask += [0] * len(obs) + [1] * len(resp)
        adv = [float(m) * (1.0 if i % 2 else -1.0) for m in mask]
        samples.append(TrainSample(ids, mask, [-1.0 * m for m in mask], adv))
    return samples


def child(args) -> int:
    import torch

    import turnrl.learner.learner as learner_mod
    from turnrl.config import load_config
    from turnrl.learner import Learner, LearnerParams
    from turnrl.models import load_model, load_tokenizer

    loss_only, mbt = VARIANTS[args.variant]
    torch.set_num_threads(args.threads)
    if not loss_only:
        learner_mod._decoder_and_head = lambda model: None  # the model's own head on every kept position
    cfg = load_config(ROOT / "configs" / "countdown.yaml", [f"train.micro_batch_tokens={mbt}"])
    tok = load_tokenizer("default")
    model = load_model("default")
    learner = Learner(model, LearnerParams.from_config(cfg), pad_id=tok.pad_token_id)
    samples = synthetic_samples(args.samples)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    learner.update(samples)  # warm-up
    t = time.perf_counter()
    for _ in range(args.updates):
        metrics = learner.update(samples)
    s = (time.perf_counter() - t) / args.updates
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({"s": s, "peak_gb": peak, "before_gb": before, "micro_batches": metrics["train/micro_batches"],
                      "tokens": sum(len(x) for x in samples), "loss_tokens": sum(sum(x.loss_mask) for x in samples)}))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--updates", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--variant", choices=list(VARIANTS), help=argparse.SUPPRESS)  # internal: run one variant
    args = ap.parse_args()
    if args.variant:
        return child(args)
    results = {}
    for name in VARIANTS:
        cmd = [sys.executable, __file__, "--variant", name, "--samples", str(args.samples), "--updates", str(args.updates),
               "--threads", str(args.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"variant {name!r} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name}: {results[name]}", flush=True)
    base = results["full-span head, 4096"]
    first = next(iter(results.values()))
    lines = [
        f"{args.samples} synthetic full-context samples ({first['tokens']} tokens, {first['loss_tokens']} loss tokens); "
        "default model, bf16 autocast; RSS with the model loaded, before the first update (AdamW state is created then): "
        f"{base['before_gb']:.2f} GB RSS.",
        "",
        "| variant | s per update | micro-batches | peak RSS (GB) | speed vs full-span | peak RSS vs full-span |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(f"| {name} | {r['s']:.1f} | {r['micro_batches']:.0f} | {r['peak_gb']:.2f} | {base['s'] / r['s']:.2f}x "
                     f"| {r['peak_gb'] / base['peak_gb']:.2f}x |")
    report = "\n".join(lines)
    print("\n" + report)
    if not args.no_write:
        with (ROOT / "bench" / "RESULTS.md").open("a") as f:
            f.write(f"\n### Learner memory, full-context samples — {time.strftime('%Y-%m-%d %H:%M')}\n\n"
                    f"Command: `python bench/learner_memory.py --samples {args.samples} --updates {args.updates} "
                    f"--threads {args.threads}` ({platform.machine()}, torch {__import__('torch').__version__}).\n\n"
                    + report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
