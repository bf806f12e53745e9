"""Attention's backward in bf16: torch's CPU flash kernel against turnrl's matmul backward (models/attention.py).

Two measurements, both under bf16 autocast (the learner's precision where ``model.autocast_bf16=auto`` chooses bf16;
on a CPU without bf16 units the learner runs fp32, where the kernel's backward is kept and this does not apply):

1. **Per shape.** The attention calls of one update of the batch below are recorded (query and key shapes). For the
   most frequent shapes, with random inputs, the backward's milliseconds (median of repeats, after a warm-up) for the
   kernel and for the matmul backward, and each one's gradient error against an fp64 reference (relative norm, the
   worst of q, k and v).
2. **Whole update.** One learner on the batch (the default model, lr 0 so the weights stay), warmed by one update,
   then ``--pairs`` pairs of updates, the two backwards alternating in ABBA order in the same process
   (``turnrl.models.attention.MATMUL_BACKWARD``): seconds per update, each backward's median, and their ratio.

The batch is the default recipe's step-0 batch (``bench/update_speed.py``'s ``default_batch``), or the samples kept at
``--keep-batch`` (collected there when missing). Writes ``bench/results/attention_backward.json``.

    python bench/attention_backward.py --keep-batch /tmp/b0.pt
"""

from __future__ import annotations

import collections
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from machine import write_result  # noqa: E402
from update_speed import alternate_updates, alternating_parser, parse_alternating, still_learner  # noqa: E402


def _inputs(rows: int, heads: int, groups: int, queries: int, keys: int, dim: int):
    g = torch.Generator().manual_seed(rows * 1000 + queries)
    q = torch.randn(rows, heads, queries, dim, generator=g)
    k, v = torch.randn(rows, groups, keys, dim, generator=g), torch.randn(rows, groups, keys, dim, generator=g)
    allowed = torch.ones(queries, keys, dtype=torch.bool)
    allowed[:, keys - queries:] = torch.tril(torch.ones(queries, queries, dtype=torch.bool))  # causal after the prefix
    mask = torch.zeros(rows, 1, queries, keys).masked_fill(~allowed, torch.finfo(torch.bfloat16).min)
    return q, k, v, mask, torch.randn(rows, heads, queries, dim, generator=g)


def per_shape(shape: tuple[int, ...], repeats: int = 15) -> dict:
    from turnrl.models.attention import _MatmulBackward

    q, k, v, mask, grad_out = _inputs(*shape)

    def kernel(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    def matmul(q, k, v, mask):
        return _MatmulBackward.apply(q, k, v, mask, None)

    def grads(attend, *tensors):
        q, k, v = (t.detach().clone().requires_grad_() for t in tensors[:3])
        out = attend(q, k, v, tensors[3])
        out.backward(tensors[4].to(out.dtype))
        return [t.grad.double() for t in (q, k, v)]

    exact = grads(kernel, *(t.double() for t in (q, k, v, mask, grad_out)))
    low = [t.bfloat16() for t in (q, k, v, mask)]
    row = {"rows": shape[0], "queries": shape[3], "keys": shape[4]}
    for name, attend in (("kernel", kernel), ("matmul", matmul)):
        error = max(float((a - e).norm() / e.norm()) for a, e in zip(grads(attend, *low, grad_out), exact))
        inputs = [t.detach().clone().requires_grad_(i < 3) for i, t in enumerate(low)]
        times = []
        for i in range(repeats + 3):
            out = attend(*inputs)
            t = time.perf_counter()
            out.backward(grad_out.bfloat16())
            if i >= 3:
                times.append(time.perf_counter() - t)
        row[f"{name}_backward_ms"] = statistics.median(times) * 1e3
        row[f"{name}_error"] = error
    row["speedup"] = row["kernel_backward_ms"] / row["matmul_backward_ms"]
    return row


def main() -> int:
    ap = alternating_parser(__doc__)
    ap.add_argument("--shapes", type=int, default=6, help="the most frequent attention shapes timed alone (default 6)")
    args, head = parse_alternating(ap)

    from turnrl.models import attention

    batch_file = Path(args.keep_batch or "/tmp/attention_backward_batch.json")
    learner, samples = still_learner(batch_file, [])
    if not learner.params.autocast_bf16:
        raise SystemExit("model.autocast_bf16=auto chose fp32 on this CPU: the learner keeps torch's kernel there, "
                         "so there is nothing to compare (run on a CPU with bf16 units)")

    seen: collections.Counter = collections.Counter()
    sdpa = F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kw):
        if q.requires_grad and attn_mask is not None and q.shape[2] > 1:
            seen[(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3])] += 1
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    attention.F = type("F", (), {"scaled_dot_product_attention": staticmethod(recording)})
    t = time.perf_counter()
    metrics = learner.update(samples)  # warm-up: kernels built per shape, AdamW state created
    first_s = time.perf_counter() - t
    attention.F = F
    print(f"batch: {len(samples)} samples, {sum(len(s.input_ids) for s in samples)} tokens, "
          f"{metrics['train/micro_batches']:.0f} micro-batches; first update {first_s:.1f} s; "
          f"{sum(seen.values())} attention calls with a gradient, {len(seen)} shapes", flush=True)

    shapes = [per_shape(s) | {"calls": n} for s, n in seen.most_common(args.shapes)]
    for r in shapes:
        print(f"  {r['rows']} rows x {r['queries']} queries x {r['keys']} keys ({r['calls']} calls): kernel "
              f"{r['kernel_backward_ms']:.2f} ms (error {r['kernel_error']:.1e}), matmul {r['matmul_backward_ms']:.2f} ms "
              f"(error {r['matmul_error']:.1e}): {r['speedup']:.2f}x", flush=True)

    print("updates, True = the matmul backward, False = the kernel's:")
    times = alternate_updates(learner, samples, args.pairs, lambda matmul: setattr(attention, "MATMUL_BACKWARD", matmul))
    attention.MATMUL_BACKWARD = True
    kernel_s, matmul_s = statistics.median(times[False]), statistics.median(times[True])
    print(f"update: kernel backward {kernel_s:.2f} s, matmul backward {matmul_s:.2f} s (medians of {args.pairs}): "
          f"{kernel_s / matmul_s:.3f}x")
    fields = {"batch": {"samples": len(samples), "tokens": sum(len(s.input_ids) for s in samples),
                        "micro_batches": metrics["train/micro_batches"], "source": str(batch_file)},
              "threads": args.threads, "shapes": shapes, "update_kernel_s": times[False], "update_matmul_s": times[True],
              "update_kernel_median_s": kernel_s, "update_matmul_median_s": matmul_s,
              "update_speedup": kernel_s / matmul_s}
    if not args.no_write:
        print(f"wrote {write_result('attention_backward', fields, head=head)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
