"""Where a training run's memory goes: the resident set after each phase of the first steps, and the peak inside it.

Runs `turnrl train` in this process (the config and overrides as for the CLI) and prints, after the model and engine
are built, after each collection, after each micro-batch's forward and backward, around the optimizer step and after
the weight sync, the resident set (VmRSS) and its peak since the previous line (VmHWM, reset at every line). The
micro-batch lines are taken before the learner trims the heap.

``--live`` also records every tensor created inside each micro-batch (a torch dispatch mode; the weights and the
accumulated gradient are not counted) and prints the peak of the live total, then the tensors live at the largest
peak, summed by the op and shape that created them. This is what found the update's copies (docs/speed.md, "Memory").

    python bench/memory_phases.py [--live] train.steps=2 eval.at_start=false eval.every=0 eval.num_tasks=4 \\
        train.threads=1 [train.activation_checkpointing=true]

Linux only (``/proc/self/status``, ``/proc/self/clear_refs``). Prints; writes nothing.
"""

from __future__ import annotations

import argparse
import collections
import sys
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def mark(label: str) -> None:
    """Print VmRSS and VmHWM (GB), then reset VmHWM so the next line's peak is its own phase's."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    gb = {k: int(status[k].split()[0]) / 1e6 for k in ("VmRSS", "VmHWM")}
    print(f"[mem] {label:32s} rss {gb['VmRSS']:5.2f} GB   peak since the last line {gb['VmHWM']:5.2f} GB", flush=True)
    Path("/proc/self/clear_refs").write_text("5")


class LiveTensors(TorchDispatchMode):
    """Bytes of the storages created under this mode and still alive: the current total, its peak, and what was
    live at the peak (by creating op and shape). Storages in ``skip`` (weights, gradients) are not counted."""

    def __init__(self, skip: set[int]) -> None:
        super().__init__()
        self.skip, self.live, self.now, self.peak = skip, {}, 0, 0
        self.at_peak: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in self.live or key in self.skip or storage.nbytes() == 0:
                continue
            self.live[key] = (storage.nbytes(), f"{func.__name__}{tuple(t.shape)}")
            self.now += storage.nbytes()
            weakref.finalize(storage, self._freed, key)
        if self.now > self.peak:
            self.peak = self.now
            self.at_peak = collections.Counter()
            for n, name in self.live.values():
                self.at_peak[name] += n
        return out

    def _freed(self, key: int) -> None:
        self.now -= self.live.pop(key, (0, ""))[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--live", action="store_true", help="also attribute each micro-batch's live tensors (slower)")
    ap.add_argument("--top", type=int, default=15, help="--live: rows of the largest micro-batch's breakdown")
    ap.add_argument("overrides", nargs="*", help="config overrides, as for turnrl train")
    args = ap.parse_args()

    mark("start")
    from turnrl import loop
    from turnrl.api import resolve_config
    from turnrl.build import build
    from turnrl.learner import learner as learner_module

    mark("imports")
    cfg = resolve_config(None, args.overrides)
    c = build(cfg)
    mark("build (model, engine, learner)")

    collect = loop.collect_step
    loop.collect_step = lambda *a, **k: (collect(*a, **k), mark("collect"))[0]
    worst: list = [0, None, collections.Counter()]
    backward = learner_module.Learner._policy_backward

    def micro_batch(self, batch, *a, **k):
        if not args.live:
            out = backward(self, batch, *a, **k)
            mark("  micro-batch forward + backward")
            return out
        skip = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        skip |= {p.grad.untyped_storage().data_ptr() for p in self.model.parameters() if p.grad is not None}
        with LiveTensors(skip) as live:
            out = backward(self, batch, *a, **k)
        mark(f"  micro-batch {tuple(batch.ids.shape)} + prefix {len(batch.prefix)}: live peak {live.peak / 1e9:.2f} GB")
        if live.peak > worst[0]:
            worst[:] = [live.peak, tuple(batch.ids.shape), live.at_peak]
        return out

    step = learner_module.Learner._step

    def optimizer_step(self, *a, **k):
        mark("  before the optimizer step")
        out = step(self, *a, **k)
        mark("  optimizer step")
        return out

    sync = type(c.engine).sync_weights

    def synced(self):
        sync(self)
        mark("weight sync")

    learner_module.Learner._policy_backward = micro_batch
    learner_module.Learner._step = optimizer_step
    type(c.engine).sync_weights = synced
    loop.train(cfg, components=c)
    mark("end")
    if worst[1] is not None:
        print(f"largest live peak: {worst[0] / 1e9:.2f} GB in a {worst[1][0]} x {worst[1][1]} micro-batch; live then:")
        for name, n in worst[2].most_common(args.top):
            print(f"  {n / 1e6:9.1f} MB  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
