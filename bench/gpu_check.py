"""Does turnrl's vLLM engine agree with the HF reference engine, and how much faster is it? (GPU machine)

Run through ``bench/gpu_check.sh`` (it installs ``turnrl[vllm]``), or directly once vLLM is installed:

    python bench/gpu_check.py [--model default] [--prompts 32] [--dtype float32] [--json out.json]

On held-out FrozenLake prompts, rendered exactly as the collector renders them, it checks:

1. greedy: VLLMEngine and HFEngine produce the same token ids (share of prompts that match exactly;
   near-ties can flip between two implementations, so the bar is a share, not 100%);
2. greedy logprobs: mean |difference| of the behaviour logprobs over the tokens both produced;
3. sampled logprobs (temperature 0.7): vLLM's reported logprob of each sampled token against the
   learner's recomputation ``log_softmax(logits / T)`` by the HF model, teacher-forced. This is the check
   that matters for training: it fails if vLLM reports raw (unscaled) logprobs;
4. weight sync: the HF weights are perturbed, ``sync_weights`` copies them into vLLM in place, and greedy
   outputs must then match HFEngine on the perturbed weights;
5. throughput: generated tokens per second of each engine at temperature 1 (vLLM on the GPU, HFEngine
   on the CPU, where turnrl runs it today: it builds its input tensors on the CPU);
6. training (``--train-steps``, default 3; 0 skips it): ``turnrl train`` on the default recipe with the vLLM engine
   sampling, async mode (``scale.async_mode=true``, ``scale.max_staleness=1``, ``algo.is_correction=tis``) and a
   2-rank FSDP2-sharded learner (``scale.learner_ranks=2 scale.learner_sharding=fsdp``), in a subprocess: it must
   exit 0 having logged every step's update, a staleness, the importance-ratio statistics and a weight version per
   update. The learner ranks run on the CPU over gloo (turnrl's learner has no GPU device setting yet), so this
   checks vLLM's weight sync under async training, not NCCL. ``--train-engine native`` runs the same check without a
   GPU (the CPU engine), which is how it is checked on machines without one.

It prints a table and exits 1 if a check fails. Thresholds depend on ``--dtype`` (float32 is strict).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

THRESHOLDS = {  # dtype -> (greedy match share, greedy logprob MAD, sampled logprob MAD)
    "float32": (0.95, 1e-3, 1e-3),
    "bfloat16": (0.80, 5e-2, 5e-2),
    "float16": (0.85, 2e-2, 2e-2),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Checks: greedy ids, greedy and sampled logprobs, weight sync, throughput (see the file header).")
    ap.add_argument("--model", default="default", help="'default' (embedded SmolLM2-135M-Instruct) or a local HF model directory")
    ap.add_argument("--env", default="frozenlake-v0", help="env whose held-out observations make the prompts")
    ap.add_argument("--prompts", type=int, default=32, help="prompts for the agreement checks")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="tokens per prompt in the agreement checks")
    ap.add_argument("--dtype", choices=sorted(THRESHOLDS), default="float32", help="dtype of both engines")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.4, help="vLLM's share of GPU memory")
    ap.add_argument("--throughput-prompts", type=int, default=256, help="prompts in vLLM's throughput run")
    ap.add_argument("--hf-throughput-prompts", type=int, default=32, help="prompts in HFEngine's throughput run")
    ap.add_argument("--throughput-tokens", type=int, default=64, help="max new tokens per prompt in the throughput runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train-steps", type=int, default=3, help="steps of the async + FSDP2 training check (0: skip it)")
    ap.add_argument("--train-engine", default="vllm", choices=["vllm", "native"],
                    help="the training check's rollout engine ('native': the same check on a machine without a GPU)")
    ap.add_argument("--train-only", action="store_true", help="run only the training check (no vLLM needed with "
                    "--train-engine native)")
    ap.add_argument("--json", help="also write the results to this JSON file")
    return ap.parse_args(argv)


def frozenlake_prompts(tokenizer, env_id: str, n: int, seed_start: int = 1_000_000) -> list[list[int]]:
    """First-turn prompts of ``n`` held-out episodes, rendered as the collector renders them (per_step)."""
    from turnrl.agent.chat import ChatRenderer
    from turnrl.envs import make

    prompts = []
    renderer = None
    for i in range(n):
        env = make(env_id)
        obs, _ = env.reset(seed=seed_start + i)
        renderer = renderer or ChatRenderer(tokenizer, env.instructions, env.examples())
        prompts.append(renderer.per_step_prompt(obs))
        env.close()
    return prompts


def agreement(a, b) -> dict[str, float]:
    """Share of rows with identical ids, and mean |logprob difference| over each row's common prefix."""
    same = sum(x.token_ids == y.token_ids for x, y in zip(a, b)) / max(1, len(a))
    diffs = []
    for x, y in zip(a, b):
        for tx, ty, lx, ly in zip(x.token_ids, y.token_ids, x.logprobs, y.logprobs):
            if tx != ty:
                break
            diffs.append(abs(lx - ly))
    return {"match": same, "logprob_mad": sum(diffs) / max(1, len(diffs)), "tokens_compared": float(len(diffs))}


def recomputed_logprob_mad(model, prompts, completions, temperature: float) -> float:
    """Mean |engine logprob - log_softmax(logits / T) of the HF model at the sampled token| (teacher forcing)."""
    import torch

    diffs = []
    with torch.no_grad():
        for p, c in zip(prompts, completions):
            if not c.token_ids:
                continue
            ids = torch.tensor([p + c.token_ids])
            logits = model(ids).logits[0, len(p) - 1 : -1].float() / temperature
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            diffs.extend((lp - torch.tensor(c.logprobs)).abs().tolist())
    return sum(diffs) / max(1, len(diffs))


def throughput(engine, prompts, tokens: int) -> float:
    from turnrl.engines import SamplingParams

    t0 = time.perf_counter()
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=tokens, temperature=1.0))
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


def training_check(args) -> list[tuple[str, float, str, bool | None]]:
    """Check 6: a short async run with a 2-rank FSDP2 learner, sampling from ``--train-engine`` (module docstring)."""
    import subprocess
    import tempfile

    from turnrl.monitor.sinks import read_metrics

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "turnrl.cli", "train", f"model.path={args.model}", f"train.steps={args.train_steps}",
               f"rollout.engine={args.train_engine}", "rollout.tasks_per_step=2", "rollout.group_size=4",
               "scale.async_mode=true", "scale.max_staleness=1", "algo.is_correction=tis", "scale.learner_ranks=2",
               "scale.learner_sharding=fsdp", "eval.every=0", "eval.at_start=false", "log.progress=false",
               "log.checkpoint_every=0", "log.checkpoint_at_end=false", "log.report=false", f"log.run_dir={tmp}",
               "log.name=check", f"train.seed={args.seed}"]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        metrics = tmp + "/check/metrics.jsonl"
        rows = [r for r in read_metrics(Path(metrics)) if "train/loss" in r] if Path(metrics).exists() else []
    if out.returncode != 0:
        print(f"training check failed (exit {out.returncode}): {' '.join(cmd)}\n{out.stderr[-3000:]}", file=sys.stderr)
    logged = all("train/staleness_mean" in r and any(k.startswith("train/is_") for k in r) for r in rows)
    return [
        (f"train ({args.train_engine}, async, FSDP2 x2): exit code", float(out.returncode), "== 0", out.returncode == 0),
        ("train: steps with an update", float(len(rows)), f"== {args.train_steps}", len(rows) == args.train_steps),
        ("train: staleness and IS statistics logged", float(logged), "== 1", bool(rows) and logged),
        ("train: mean staleness", rows[-1].get("train/staleness_mean", float("nan")) if rows else float("nan"), "info", None),
        ("train: seconds", seconds, "info", None),
    ]


def report(args, rows, header: str) -> int:
    """Print the table (and ``--json``); 1 if a check failed."""
    width = max(len(r[0]) for r in rows)
    print(header)
    print(f"{'check':<{width}}  {'value':>12}  {'bar':>9}  result")
    for name, value, bar, ok in rows:
        print(f"{name:<{width}}  {value:>12.6g}  {bar:>9}  {'' if ok is None else ('PASS' if ok else 'FAIL')}")
    if args.json:
        Path(args.json).write_text(json.dumps([{"check": n, "value": v, "bar": b, "pass": ok} for n, v, b, ok in rows], indent=1))
    return 0 if all(ok is not False for *_, ok in rows) else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.train_only:
        return report(args, training_check(args), f"model {args.model}  training check only")
    import torch

    from turnrl.engines import HFEngine, SamplingParams, VLLMEngine
    from turnrl.models import load_model, load_tokenizer, resolve_model_path

    dtype = getattr(torch, args.dtype)
    path = str(resolve_model_path(args.model))
    tokenizer = load_tokenizer(args.model)
    hf_model = load_model(args.model, dtype=dtype).eval()  # CPU: HFEngine's inputs live there
    hf = HFEngine(hf_model, tokenizer, seed=args.seed)
    vllm = VLLMEngine(path, seed=args.seed, learner_model=hf_model, dtype=args.dtype,
                      gpu_memory_utilization=args.gpu_memory_utilization)
    prompts = frozenlake_prompts(tokenizer, args.env, args.prompts)
    greedy = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    bar_match, bar_greedy_lp, bar_sampled_lp = THRESHOLDS[args.dtype]
    rows: list[tuple[str, float, str, bool | None]] = []

    g = agreement(vllm.generate(prompts, greedy), hf.generate(prompts, greedy))
    rows.append(("greedy ids identical (share of prompts)", g["match"], f">= {bar_match}", g["match"] >= bar_match))
    rows.append(("greedy logprob mean |diff|", g["logprob_mad"], f"<= {bar_greedy_lp:g}", g["logprob_mad"] <= bar_greedy_lp))

    sampled = vllm.generate(prompts, SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.7))
    mad = recomputed_logprob_mad(hf_model, prompts, sampled, 0.7)
    rows.append(("sampled (T=0.7) logprob vs learner recompute", mad, f"<= {bar_sampled_lp:g}", mad <= bar_sampled_lp))

    before = [o.token_ids for o in vllm.generate(prompts, greedy)]
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    with torch.no_grad():  # a stand-in for a training step: noise on every weight
        for p in hf_model.parameters():
            p.add_((torch.randn(p.shape, generator=gen) * 0.02 * p.float().std().item()).to(p.dtype))
    t0 = time.perf_counter()
    vllm.sync_weights()
    sync_s = time.perf_counter() - t0
    after = vllm.generate(prompts, greedy)
    s = agreement(after, hf.generate(prompts, greedy))
    changed = sum(a != o.token_ids for a, o in zip(before, after)) / max(1, len(prompts))
    rows.append(("after sync: greedy ids identical", s["match"], f">= {bar_match}", s["match"] >= bar_match and vllm.version == 1))
    rows.append(("after sync: prompts whose output changed", changed, "info", None))
    rows.append(("sync_weights seconds", sync_s, "info", None))

    many = (prompts * (args.throughput_prompts // max(1, len(prompts)) + 1))[: args.throughput_prompts]
    rows.append(("vLLM generated tokens/s", throughput(vllm, many, args.throughput_tokens), "info", None))
    rows.append(("HF (CPU) generated tokens/s", throughput(hf, many[: args.hf_throughput_prompts], args.throughput_tokens), "info", None))

    if args.train_steps > 0:
        del vllm  # the training run builds its own engine on the GPU
        torch.cuda.empty_cache()
        rows += training_check(args)
    return report(args, rows, f"model {path}  dtype {args.dtype}  prompts {len(prompts)}  torch {torch.__version__}"
                              f"  gpu {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")


if __name__ == "__main__":
    sys.exit(main())
