"""The learner on 2 ranks, replicated vs FSDP2-sharded, against one process: each rank's peak memory, seconds per
update, and how far the sharded update's weights are from the single process's.

The batch is step 0 of the default recipe (``update_speed.default_batch``: built, collected and credited by the
library's own path). Each arm runs in a fresh process (peak RSS is per process) with the default model:

- ``single``: :class:`~turnrl.learner.Learner` in one process;
- ``replicated``: ``scale.learner_ranks=2`` (:mod:`turnrl.scale.distributed`: rank 0 holds the model and AdamW, one
  gradient all-reduce);
- ``single_unrolled``: one process that writes each micro-batch's shared prefix into every row, as the sharded
  learner does (:func:`turnrl.scale.sharded._unrolled`): the same computation as ``fsdp`` in one process, so under
  bf16 autocast the two should agree where ``single`` (prefix run once) differs by bf16 rounding;
- ``fsdp``: ``scale.learner_ranks=2 scale.learner_sharding=fsdp`` (:mod:`turnrl.scale.sharded`: the decoder layers'
  parameters, gradients and AdamW state split over the ranks).

Each arm runs a first update (cold kernels, AdamW state created), then ``--updates`` timed ones on the same batch,
then saves rank 0's weights. Rank 0's peak RSS is ``getrusage(RUSAGE_SELF)``; the helper rank's is
``getrusage(RUSAGE_CHILDREN)`` after it has exited (the largest child's high-water mark). Weight distance: the
largest relative difference (||w - w_single|| / ||w_single - w_0||, per parameter tensor, over the update's change)
after the same updates. On 2 cores the ranks share the cores, so the seconds say what the collectives cost, not what
more machines would gain.

    python bench/sharded_learner.py [--updates 1] [--no-write] [key=value overrides ...]
                                    # writes bench/results/sharded_learner.json and a RESULTS.md section
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from machine import append_results, write_result  # noqa: E402
from update_speed import default_batch  # noqa: E402

ARMS = {"single": [], "single_unrolled": [], "replicated": ["scale.learner_ranks=2"],
        "fsdp": ["scale.learner_ranks=2", "scale.learner_sharding=fsdp"]}


def _gb(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 2**20  # Linux reports KiB


def arm(args) -> int:
    """One arm in this process; prints one JSON line."""
    import torch

    from turnrl.config import load_config
    from turnrl.learner import Learner, LearnerParams
    from turnrl.models import load_model, load_tokenizer
    from turnrl.models.recompute import checkpoint_layers, wanted
    from turnrl.scale.distributed import DataParallelLearner
    from turnrl.scale.sharded import ShardedLearner
    from turnrl.types import TrainSample

    torch.set_num_threads(1)
    cfg = load_config(ROOT / "configs" / "default.yaml", args.overrides + ARMS[args.arm])
    samples = [TrainSample(**s) for s in json.loads(Path(args.batch).read_text())]
    tok = load_tokenizer(cfg.model.path)
    model = load_model(cfg.model.path)
    if wanted(cfg.train.activation_checkpointing, model):
        checkpoint_layers(model)
    params = LearnerParams.from_config(cfg)
    if args.arm == "single_unrolled":  # one process, each micro-batch's shared prefix in every row, as fsdp runs it
        from turnrl.scale.sharded import _unrolled

        class Unrolled(Learner):
            def _policy_backward(self, batch, *rest, **kwargs):
                return super()._policy_backward(_unrolled(batch), *rest, **kwargs)

        learner = Unrolled(model, params, pad_id=tok.pad_token_id)
    elif cfg.scale.learner_ranks == 1:
        learner = Learner(model, params, pad_id=tok.pad_token_id)
    else:
        kind = ShardedLearner if cfg.scale.learner_sharding == "fsdp" else DataParallelLearner
        learner = kind.spawn(cfg.scale.learner_ranks, 3600.0, model, params, tok.pad_token_id)
    before = _gb(resource.RUSAGE_SELF)
    t = time.perf_counter()
    learner.update(samples)
    first_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(args.updates):
        learner.update(samples)
    update_s = (time.perf_counter() - t) / args.updates
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, args.weights)
    rank0 = _gb(resource.RUSAGE_SELF)
    if hasattr(learner, "close"):
        learner.close()
    print(json.dumps({"update_s": update_s, "first_update_s": first_s, "rank0_peak_rss_gb": rank0,
                      "rank0_rss_before_update_gb": before,
                      "helper_peak_rss_gb": _gb(resource.RUSAGE_CHILDREN) if cfg.scale.learner_ranks > 1 else None}))
    return 0


def distance(weights: Path, reference: Path, start: dict) -> dict[str, float]:
    """How far the arm's weights are from ``reference``'s after the same updates, relative to the reference's change:
    the largest per-tensor ||w - w_ref|| / ||w_ref - w_0|| (``worst``) and the same over all parameters at once
    (``overall``). Both 0 when the arm's update is the reference's."""
    import torch

    a, b = torch.load(weights), torch.load(reference)
    worst, diff, change = 0.0, 0.0, 0.0
    for n, w in b.items():
        c = float((w.double() - start[n].double()).norm())
        d = float((a[n].double() - w.double()).norm())
        diff, change = diff + d * d, change + c * c
        if c > 0:
            worst = max(worst, d / c)
    return {"worst": worst, "overall": (diff / change) ** 0.5 if change else 0.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=1, help="timed updates per arm after the first")
    ap.add_argument("--no-write", action="store_true", help="print only; write no result file")
    ap.add_argument("--arm", choices=list(ARMS), help=argparse.SUPPRESS)  # internal: run one arm
    ap.add_argument("--batch", help=argparse.SUPPRESS)
    ap.add_argument("--weights", help=argparse.SUPPRESS)
    ap.add_argument("--make-batch", help=argparse.SUPPRESS)  # internal: collect the batch in a process that then exits
    ap.add_argument("overrides", nargs="*", help="key=value config overrides, as for turnrl train")
    args = ap.parse_args()
    if args.arm:
        return arm(args)
    if args.make_batch:
        print(json.dumps(default_batch(args.overrides, Path(args.make_batch))))
        return 0

    from turnrl.config import load_config
    from turnrl.models import load_model

    tmp = Path(tempfile.mkdtemp(prefix="turnrl-sharded-bench-"))
    batch = tmp / "batch.json"
    made = subprocess.run([sys.executable, __file__, "--make-batch", str(batch), *args.overrides], capture_output=True,
                          text=True, check=False)  # its memory goes back to the machine before the arms start
    if made.returncode:
        print(made.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"collecting the batch failed (exit {made.returncode})")
    shape = json.loads(made.stdout.strip().splitlines()[-1])
    model_path = load_config(ROOT / "configs" / "default.yaml", args.overrides).model.path
    start = {n: p.detach().clone() for n, p in load_model(model_path).named_parameters()}
    rows = {}
    for name in ARMS:
        cmd = [sys.executable, __file__, "--arm", name, "--batch", str(batch), "--weights", str(tmp / f"{name}.pt"),
               "--updates", str(args.updates), *args.overrides]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode:
            print(out.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"arm {name} failed (exit {out.returncode})")
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
        print(name, rows[name], flush=True)
    for name in ARMS:
        rows[name]["weight_distance_to_single"] = distance(tmp / f"{name}.pt", tmp / "single.pt", start)
    rows["fsdp"]["weight_distance_to_single_unrolled"] = distance(tmp / "fsdp.pt", tmp / "single_unrolled.pt", start)
    shutil.rmtree(tmp)  # metrics are kept, weights are not
    single = rows["single"]
    lines = ["| arm | rank 0 peak RSS GB | helper rank peak RSS GB | s per update | vs single | first update s | "
             "weight distance to single: worst tensor / overall |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        helper = f"{r['helper_peak_rss_gb']:.2f}" if r["helper_peak_rss_gb"] is not None else "-"
        lines.append(f"| {name} | {r['rank0_peak_rss_gb']:.2f} | {helper} | {r['update_s']:.1f} | "
                     f"{r['update_s'] / single['update_s']:.2f}x | {r['first_update_s']:.1f} | "
                     f"{r['weight_distance_to_single']['worst']:.1e} / {r['weight_distance_to_single']['overall']:.1e} |")
    unrolled = rows["fsdp"]["weight_distance_to_single_unrolled"]
    lines += ["", f"fsdp against single_unrolled (the same layout in one process): worst tensor {unrolled['worst']:.1e}, "
              f"overall {unrolled['overall']:.1e}."]
    print("\n".join(lines))
    if not args.no_write:
        command = " ".join(["python bench/sharded_learner.py", f"--updates {args.updates}", *args.overrides])
        path = write_result("sharded_learner", {"batch": shape, "overrides": args.overrides, "updates": args.updates,
                                                "arms": rows})
        append_results("\n".join([f"### Learner on 2 ranks: replicated vs FSDP2-sharded vs one process — "
                                  f"{time.strftime('%Y-%m-%d %H:%M')}", "",
                                  f"Command: `{command}`. Result: `{path.relative_to(ROOT)}`. Default-recipe batch "
                                  f"at step 0: {shape['samples']} samples, {shape['tokens']} tokens, "
                                  f"{shape['trained_tokens']} trained.", "", *lines]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
