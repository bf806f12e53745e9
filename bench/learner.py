"""Learner speed and precision: fp32 vs bf16 autocast on this CPU, padding, and the engines' bf16 logprob error.

On one batch of the default workload (SmolLM2-135M, FrozenLake, 4 tasks x 8 episodes, per-step context),
collected once by the HF engine and given fixed +-1 advantages:

- ``Learner.update`` wall time in fp32 and under bf16 autocast (each on a fresh copy of the model, after a
  warm-up update: CPU kernels are built per shape), as trained tokens/s and the ratio;
- precision: the mean |difference| of response-token logprobs computed under bf16 autocast vs fp32, and
  of the native engine's bf16 behaviour logprobs and the HF engine's autocast ones vs the fp32 learner;
- padding: the share of computed positions that are padding in the learner's length-bucketed micro-batches
  (after the shared prefix is taken out) against one padded batch of the same samples.

    python bench/learner.py [--updates 2] [--no-write]
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=2, help="timed updates per precision (after one warm-up)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    from turnrl.config import load_config
    from turnrl.engines import HFEngine, SamplingParams
    from turnrl.engines.native import NativeEngine
    from turnrl.envs import make
    from turnrl.learner.learner import Learner, LearnerParams, packed_logprobs, response_logits
    from turnrl.learner.samples import build_samples, collate, micro_batches, shared_prefix_len
    from turnrl.models import load_model, load_tokenizer
    from turnrl.agent import ContextSpec
    from turnrl.rollout import Collector

    torch.set_num_threads(len(__import__("os").sched_getaffinity(0)))
    cfg = load_config(ROOT / "configs" / "default.yaml")
    tok = load_tokenizer("default")
    base = load_model("default")
    env_kwargs = dict(max_turns=cfg.env.max_turns, invalid_penalty=cfg.env.invalid_penalty, progress_reward=cfg.env.progress_reward,
                      reward=cfg.env.reward)
    sp = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=1.0)
    collector = Collector(HFEngine(base, tok, autocast_bf16=False, seed=0), tok, lambda: make(cfg.env.id, **env_kwargs), ContextSpec())
    groups = collector.collect(list(range(cfg.rollout.tasks_per_step)), cfg.rollout.group_size, sp)
    trajs = [t for g in groups for t in g.trajectories]
    advantages = [[1.0 if i % 2 else -1.0] * len(t.turns) for i, t in enumerate(trajs)]
    samples = build_samples(trajs, advantages)
    resp_tokens = sum(sum(s.loss_mask) for s in samples)
    all_tokens = sum(len(s) for s in samples)
    print(f"batch: {len(samples)} samples, {all_tokens} tokens, {resp_tokens} response tokens (fp32 HF engine rollout)", flush=True)

    # ---- speed ----------------------------------------------------------------------------------
    timing = {}
    for name, bf16 in (("fp32", False), ("bf16", True)):
        c = cfg.model_copy(deep=True)
        c.model.autocast_bf16 = bf16
        model = copy.deepcopy(base)
        learner = Learner(model, LearnerParams.from_config(c), pad_id=tok.pad_token_id)
        learner.update(samples)  # warm-up
        t = time.perf_counter()
        for _ in range(args.updates):
            learner.update(samples)
        timing[name] = (time.perf_counter() - t) / args.updates
        print(f"{name}: {timing[name]:.1f} s per update, {all_tokens / timing[name]:.0f} sample tokens/s", flush=True)
        del learner, model

    # ---- precision ------------------------------------------------------------------------------
    def learner_logprobs(model, bf16: bool) -> list[torch.Tensor]:
        out = []
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else torch.autocast("cpu", enabled=False)
        with torch.no_grad(), ctx:
            for mb in micro_batches(samples, cfg.train.micro_batch_tokens):
                batch = collate(mb, tok.pad_token_id)
                lp = packed_logprobs(response_logits(model, batch), batch, cfg.rollout.temperature)
                for b in range(len(mb)):
                    out.append(lp[b][batch.mask[b] > 0])
        return out

    ref = learner_logprobs(base, False)
    bf = learner_logprobs(base, True)
    learner_bf16_err = torch.cat([a - b for a, b in zip(ref, bf)]).abs().mean().item()

    def engine_err(engine) -> float:
        prompts = [s.input_ids[: s.loss_mask.index(1)] for s in samples[:48]]
        outs = engine.generate(prompts, sp)
        diffs = []
        for p, o in zip(prompts, outs):
            ids = torch.tensor([p + o.token_ids])
            with torch.no_grad():
                logits = base(ids).logits[0, len(p) - 1 : -1].float() / sp.temperature
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(o.token_ids)[:, None]).squeeze(-1)
            diffs.append((lp - torch.tensor(o.logprobs)).abs())
        return torch.cat(diffs).mean().item()

    native_err = engine_err(NativeEngine(base, tok, dtype="bf16", max_slots=64))
    native_fp32_err = engine_err(NativeEngine(base, tok, dtype="fp32", max_slots=64))
    hf_bf16_err = engine_err(HFEngine(base, tok, autocast_bf16=True))

    # ---- padding --------------------------------------------------------------------------------
    def computed(mbs) -> int:
        total = 0
        for mb in mbs:
            batch = collate(mb, tok.pad_token_id)
            total += len(batch.prefix) + batch.ids.numel()
        return total

    bucketed = computed(micro_batches(samples, cfg.train.micro_batch_tokens))
    P = shared_prefix_len(samples)
    one_batch = len(samples) * max(len(s) for s in samples)
    real = all_tokens
    report = "\n".join([
        f"Batch: {len(samples)} samples ({all_tokens} tokens, {resp_tokens} trained response tokens) from one default-workload rollout.",
        "",
        "| precision | s per update | sample tokens/s | speed vs fp32 |",
        "|---|---:|---:|---:|",
        f"| fp32 | {timing['fp32']:.1f} | {all_tokens / timing['fp32']:.0f} | 1.00x |",
        f"| bf16 autocast | {timing['bf16']:.1f} | {all_tokens / timing['bf16']:.0f} | {timing['fp32'] / timing['bf16']:.2f}x |",
        "",
        "Mean |logprob difference| against the fp32 learner on the batch's response tokens: "
        f"learner under bf16 autocast {learner_bf16_err:.4f}; native engine bf16 {native_err:.4f}, native engine fp32 "
        f"{native_fp32_err:.6f}; HF engine bf16 autocast {hf_bf16_err:.4f}.",
        "",
        f"Padding: the learner computes {bucketed} positions for {real} real tokens (shared prefix of {P} tokens run once "
        f"per micro-batch, rows bucketed by length); one padded batch would compute {one_batch} "
        f"({one_batch / bucketed:.1f}x more).",
    ])
    print("\n" + report)
    if not args.no_write:
        with (ROOT / "bench" / "RESULTS.md").open("a") as f:
            f.write(f"\n### Learner precision and speed — {time.strftime('%Y-%m-%d %H:%M')}\n\n"
                    f"Command: `python bench/learner.py --updates {args.updates}` ({platform.machine()}, "
                    f"{torch.get_num_threads()} threads, torch {torch.__version__}).\n\n" + report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
