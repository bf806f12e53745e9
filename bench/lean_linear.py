"""Linear layers under bf16 autocast: autocast's ``nn.Linear``, which keeps a bf16 copy of each weight for the
backward, against ``turnrl.models.lean.LeanLinear``, which keeps the fp32 weight and casts it again there.

The outputs are the same bit for bit, and so is the gradient of each use of a weight (tests/test_lean_layers.py);
where one autocast region uses a weight several times (several prompt groups in a micro-batch), autocast adds the
uses' gradients in bf16 and ``LeanLinear`` in fp32, so the first gradients are compared (equal or not, and their
largest relative difference). What is at stake is memory and time:

1. **Peak memory.** ``bench/update_speed.py``'s ``full`` arm (the model as turnrl loads it: ``LeanLinear``) and its
   ``autocast_linear`` arm (the layers made plain ``nn.Linear`` again), each in its own process: the learner alone,
   a first update and ``--updates`` more on the batch, the process's peak RSS (``ru_maxrss``).
2. **Time.** One learner on the batch (the default model, lr 0 so the weights stay), warmed by one update, then
   ``--pairs`` pairs of updates, the two layer classes alternating in ABBA order in the same process: seconds per
   update, each side's median and their ratio. The difference is one cast of the weights per micro-batch (about
   0.09 s on SmolLM2-135M here), below the spread between single updates, so it takes pairs to see.

bf16 only: ``model.autocast_bf16=true`` is set for both (on a CPU without bf16 units ``auto`` chooses fp32, where the
layer is ``nn.Linear``'s and there is no copy). The batch is the default recipe's step-0 batch, or the samples kept at
``--keep-batch`` (collected there when missing). Writes ``bench/results/lean_linear.json``.

    python bench/lean_linear.py --keep-batch /tmp/b0.json
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from machine import write_result  # noqa: E402
from update_speed import (  # noqa: E402
    alternate_updates, alternating_parser, ensure_batch, parse_alternating, still_learner)

BF16 = ["model.autocast_bf16=true"]


def peak_memory(batch_file: Path, updates: int, threads: int) -> dict[str, dict]:
    """``bench/update_speed.py``'s ``full`` and ``autocast_linear`` arms, each in its own process."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("full", "autocast_linear"):
            cmd = [sys.executable, str(ROOT / "bench" / "update_speed.py"), "--arm", name, "--batch", str(batch_file),
                   "--updates", str(updates), "--threads", str(threads), "--grad-file", f"{tmp}/{name}.pt", *BF16]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                raise SystemExit(f"arm {name!r} failed (exit {run.returncode}):\n{run.stderr[-2000:]}")
            out[name] = json.loads(run.stdout.strip().splitlines()[-1])
            print(f"{name}: peak RSS {out[name]['peak_rss_gb']:.2f} GB, {out[name]['update_s']:.2f} s per update "
                  "(its own process)", flush=True)
        lean, autocast = torch.load(f"{tmp}/full.pt"), torch.load(f"{tmp}/autocast_linear.pt")
    differ = {n: float((lean[n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in autocast.items()
              if not torch.equal(lean[n], g)}
    return {"lean": out["full"], "autocast": out["autocast_linear"], "first_gradients_equal": not differ,
            "parameters_differing": len(differ), "parameters": len(autocast),
            "max_relative_difference": max(differ.values(), default=0.0)}


def main() -> int:
    ap = alternating_parser(__doc__)
    ap.add_argument("--updates", type=int, default=2, help="updates after the first in each memory arm (default 2)")
    args, head = parse_alternating(ap)

    from turnrl.models.lean import LeanLinear

    batch_file = Path(args.keep_batch or "/tmp/lean_linear_batch.json")
    memory = peak_memory(ensure_batch(batch_file, BF16), args.updates, args.threads)
    learner, samples = still_learner(batch_file, BF16)
    layers = [m for m in learner.model.modules() if type(m) is LeanLinear]
    metrics = learner.update(samples)  # warm-up: kernels built per shape, AdamW state created

    def switch(lean: bool) -> None:
        for m in layers:
            m.__class__ = LeanLinear if lean else torch.nn.Linear

    print(f"batch: {len(samples)} samples, {metrics['train/micro_batches']:.0f} micro-batches; {len(layers)} linear "
          "layers; updates, True = LeanLinear, False = autocast's nn.Linear:", flush=True)
    times = alternate_updates(learner, samples, args.pairs, switch)
    lean_s, autocast_s = statistics.median(times[True]), statistics.median(times[False])
    lean_gb, autocast_gb = memory["lean"]["peak_rss_gb"], memory["autocast"]["peak_rss_gb"]
    print(f"peak RSS: LeanLinear {lean_gb:.2f} GB, nn.Linear {autocast_gb:.2f} GB ({lean_gb / autocast_gb:.2f}x); "
          f"first gradients: {memory['parameters_differing']} of {memory['parameters']} parameters differ, at most "
          f"{memory['max_relative_difference']:.1e} relative")
    print(f"update: LeanLinear {lean_s:.2f} s, nn.Linear {autocast_s:.2f} s (medians of {args.pairs}): "
          f"nn.Linear / LeanLinear {autocast_s / lean_s:.3f}")
    fields = {"batch": {"samples": len(samples), "tokens": sum(len(s.input_ids) for s in samples),
                        "micro_batches": metrics["train/micro_batches"], "source": str(batch_file)},
              "threads": args.threads, "linear_layers": len(layers),
              "peak_rss_lean_gb": lean_gb, "peak_rss_autocast_gb": autocast_gb, "peak_rss_ratio": lean_gb / autocast_gb,
              **{k: memory[k] for k in ("first_gradients_equal", "parameters_differing", "parameters",
                                        "max_relative_difference")},
              "memory_arms": {"lean": memory["lean"], "autocast": memory["autocast"]},
              "update_lean_s": times[True], "update_autocast_s": times[False],
              "update_lean_median_s": lean_s, "update_autocast_median_s": autocast_s,
              "autocast_over_lean_time": autocast_s / lean_s}
    if not args.no_write:
        print(f"wrote {write_result('lean_linear', fields, head=head)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
