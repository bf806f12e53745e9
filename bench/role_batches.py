"""The learner's update on batches that mix prompts: micro-batches grouped by prompt against one group for all.

A multi-agent or hierarchical env's batch holds every role's turns, each role under its own system prompt (relay-v0's
two players; frozenlake-hier-v0's planner and executor). The learner computes the prompt prefix a micro-batch shares
once and counts only the rest of each row against ``train.micro_batch_tokens``. Before
:func:`turnrl.learner.samples.prefix_groups`, that budget counted from the prefix the *whole* batch shares, a few
chat-template tokens when roles differ, so micro-batches came out small and could mix roles; now samples are split
by prompt first, wherever that saves positions.

For each env the batch is the oracle's demonstrations on training tasks (``turnrl.sft.oracle_demos``: real prompts
through the run's chat template and context strategy), with advantages +1 / -1 on alternate trajectories so the
gradient is not zero. Both layouts update the same model at ``lr=0`` (every update sees the same weights), one after
the other, ``--updates`` times each after a first, untimed update each; the table gives micro-batches, positions
run (prefix once plus the padded rows), the median seconds per update, and the two layouts' gradients' relative
difference (the same gradient up to floating-point order). The layouts are the learner's own switch,
``train.group_by_prompt`` (``LearnerParams.group_by_prompt``). frozenlake-v0's oracle batch (one system prompt,
distinct observations) stays one group, so it shows the unchanged case.

    python bench/role_batches.py [--envs frozenlake-hier-v0 relay-v0 frozenlake-v0] [--demos 16] [--updates 2]
                                 [--threads 2] [--no-write]

Writes ``bench/results/role_batches.json`` (one record per env, each with the command, date and commit that measured
it; a run replaces the records of the envs it measured) and a RESULTS.md section.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from machine import append_results, commit, facts, write_result  # noqa: E402

ENV_OVERRIDES = {  # oracle shaping is single-agent only; the hierarchy's episodes need room for its subgoals
    "frozenlake-hier-v0": ["env.progress_reward=0", "env.max_turns=40"],
    "relay-v0": ["env.progress_reward=0"],
    "frozenlake-v0": [],
}


def signed_samples(c, demos: int) -> list:
    """The oracle's demonstrations as training samples, advantage +1 on even trajectories and -1 on odd ones."""
    from turnrl.build import demo_samples
    from turnrl.sft import oracle_demos

    samples = demo_samples(oracle_demos(c, demos))
    return [dataclasses.replace(s, advantages=[float(m) * (1.0 if s.traj_index % 2 == 0 else -1.0) for m in s.loss_mask])
            for s in samples]


def measure_env(env_id: str, args) -> dict:
    from turnrl.build import build
    from turnrl.config import load_config
    from turnrl.learner import Learner, LearnerParams
    from turnrl.learner.samples import layout_positions, micro_batches

    cfg = load_config(None, [f"env.id={env_id}", f"train.threads={args.threads}", *ENV_OVERRIDES[env_id]])
    c = build(cfg)
    samples = signed_samples(c, args.demos)
    params = dataclasses.replace(LearnerParams.from_config(cfg), lr=0.0)
    learner = Learner(c.model, params, pad_id=c.tokenizer.pad_token_id or 0)
    grads: dict[str, list[torch.Tensor]] = {}
    learner.optimizer.register_step_pre_hook(
        lambda *_: grads.__setitem__("last", [p.grad.detach().clone() for p in learner.model.parameters() if p.grad is not None]))
    layouts = {"one_group": dataclasses.replace(params, group_by_prompt=False),  # the packing before prompt groups
               "by_prompt": dataclasses.replace(params, group_by_prompt=True)}
    out: dict = {"env": env_id, "samples": len(samples), "micro_batch_tokens": params.micro_batch_tokens,
                 "trajectories": len({s.traj_index for s in samples})}
    seconds: dict[str, list[float]] = {name: [] for name in layouts}
    gradient: dict[str, list[torch.Tensor]] = {}
    for name, layout in layouts.items():
        batches = micro_batches(samples, layout.micro_batch_tokens, layout.group_by_prompt)
        out[f"micro_batches_{name}"] = len(batches)
        out[f"positions_{name}"] = sum(map(layout_positions, batches))
        learner.params = layout
        learner.update(samples)  # untimed: kernels for this layout's shapes
        gradient[name] = grads["last"]
    for _ in range(args.updates):  # alternating, so machine noise hits both layouts alike
        for name, layout in layouts.items():
            learner.params = layout
            t = time.perf_counter()
            learner.update(samples)
            seconds[name].append(time.perf_counter() - t)
    for name in layouts:
        out[f"seconds_{name}"] = statistics.median(seconds[name])
    out["positions_ratio"] = out["positions_by_prompt"] / out["positions_one_group"]
    out["speedup"] = out["seconds_one_group"] / out["seconds_by_prompt"]
    num = sum(float((a - b).norm() ** 2) for a, b in zip(gradient["by_prompt"], gradient["one_group"]))
    den = sum(float(b.norm() ** 2) for b in gradient["one_group"])
    out["grad_rel_diff"] = (num / max(den, 1e-30)) ** 0.5
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", nargs="+", default=list(ENV_OVERRIDES), choices=list(ENV_OVERRIDES))
    ap.add_argument("--demos", type=int, default=16, help="oracle demonstrations per env (episodes on training tasks)")
    ap.add_argument("--updates", type=int, default=2, help="timed updates per layout, after an untimed one")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print only; do not write results or RESULTS.md")
    args = ap.parse_args()
    machine = facts()
    records = [measure_env(env_id, args) for env_id in args.envs]
    lines = [f"### Learner updates on multi-role batches: micro-batches by prompt vs one group — {time.strftime('%Y-%m-%d %H:%M')}", "",
             f"Command: `python {' '.join(sys.argv)}` ({machine['cpu']}, {machine['cores']} cores, {args.threads} threads, "
             f"{machine['peak_gflops_fp32']:.0f} GFLOP/s fp32, {machine['peak_gflops_bf16']:.0f} bf16, "
             f"{machine['bandwidth_gbs']:.1f} GB/s; torch {torch.__version__}). Batch: the oracle's demonstrations on "
             f"{args.demos} training tasks, advantages +1/-1 on alternate trajectories; lr 0; {args.updates} timed "
             "updates per layout, alternating, after an untimed one each.", "",
             "| env | samples | micro-batches, one group -> by prompt | positions run | ratio | s per update | speed-up "
             "| gradient rel. difference |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        lines.append(f"| {r['env']} | {r['samples']} | {r['micro_batches_one_group']} -> {r['micro_batches_by_prompt']} "
                     f"| {r['positions_one_group']} -> {r['positions_by_prompt']} | {r['positions_ratio']:.3f} "
                     f"| {r['seconds_one_group']:.1f} -> {r['seconds_by_prompt']:.1f} | {r['speedup']:.2f}x "
                     f"| {r['grad_rel_diff']:.1e} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        append_results(text)
        run = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit(),
               "demos": args.demos, "updates": args.updates, "threads": args.threads}
        path = ROOT / "bench" / "results" / "role_batches.json"
        kept = [r for r in (json.loads(path.read_text())["records"] if path.exists() else []) if r["env"] not in args.envs]
        print(f"wrote {write_result('role_batches', {'records': kept + [{**r, **run} for r in records]})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
