"""Whether bf16 pays on this CPU: what ``model.autocast_bf16=auto`` decides, once per process.

CPUs with native bf16 matrix units (Intel AMX, AVX512-BF16 on Intel Cooper Lake and later or AMD Zen 4) multiply bf16
matrices two to ten times faster than fp32 ones. CPUs without them (AVX2-only: AMD Zen 3 and earlier, most Intel
laptop chips) emulate bf16, and there it is several times *slower* than fp32: measured on an AMD EPYC (Zen 3) with
one thread, a (2048 x 576) x (576 x 1536) matmul ran at 6 GFLOP/s in bf16 and 61 in fp32 (bench/RESULTS.md,
"bf16 or fp32 on this CPU"). CPU flags do not say how fast a build's kernels are, so ``auto`` times the same
matmul in both dtypes and turns bf16 on only where it is clearly faster. Where it is not, fp32 also keeps the
engine's and the learner's logprobs equal to 1e-6.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F

BF16_MIN_SPEEDUP = 1.2  # below this, fp32's exactness is worth more than bf16's time
_ROUNDS, _CALLS = 5, 4  # the probe's timings: about 0.1 s on a 2-core Zen 4, 0.3 s where bf16 is emulated


@functools.cache
def bf16_speedup() -> float:
    """fp32 time over bf16 time of ``F.linear`` on (256 x 576) activations and a (1536 x 576) weight (a SmolLM2-135M
    projection over a learner micro-batch's rows), with the current torch threads. Measured once per process.

    One call takes about a millisecond, so a single timing is at the mercy of one descheduled thread: on a Zen 4 whose
    bf16 matmul is twice fp32's, a best of three single calls once read 0.59x at a run's start and turned bf16 off.
    So each timing covers :data:`_CALLS` calls, the two dtypes alternate over :data:`_ROUNDS` rounds (a busy moment
    hits both), and each keeps its best round."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(256, 576, generator=g), torch.randn(1536, 576, generator=g)  # activations, a linear's weight
    try:
        pairs = {"fp32": (a, b), "bf16": (a.bfloat16(), b.bfloat16())}
        for x, w in pairs.values():
            F.linear(x, w)  # warm-up: kernel selection, packing
    except RuntimeError:  # a build without bf16 matmul on this CPU
        return 0.0
    best = {name: float("inf") for name in pairs}
    for _ in range(_ROUNDS):
        for name, (x, w) in pairs.items():
            t = time.perf_counter()
            for _ in range(_CALLS):
                F.linear(x, w)
            best[name] = min(best[name], time.perf_counter() - t)
    return best["fp32"] / max(best["bf16"], 1e-9)


def use_bf16(setting: bool | str) -> bool:
    """``model.autocast_bf16`` resolved: ``True``/``False`` as set; ``"auto"``: bf16 where it is at least
    :data:`BF16_MIN_SPEEDUP` times faster than fp32 on this machine."""
    if setting == "auto":
        return bf16_speedup() >= BF16_MIN_SPEEDUP
    return bool(setting)


def precision_note(setting: bool | str) -> str:
    """What a run computes in, for its announcement: ``bf16 autocast`` or ``fp32``, and why when ``auto`` chose."""
    chosen = "bf16 autocast" if use_bf16(setting) else "fp32"
    if setting is True and bf16_speedup() < BF16_MIN_SPEEDUP:  # obeyed, but say what it costs here
        return (f"{chosen} (model.autocast_bf16=true, though a bf16 matmul runs at {bf16_speedup():.2f}x fp32's speed on "
                "this CPU: model.autocast_bf16=auto would compute in fp32)")
    if setting != "auto":
        return f"{chosen} (model.autocast_bf16={str(setting).lower()})"
    return f"{chosen} (model.autocast_bf16=auto: a bf16 matmul runs at {bf16_speedup():.2f}x fp32's speed on this CPU)"
