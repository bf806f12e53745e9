"""Rollout throughput: the HF reference engine against the native engine on the default multi-turn workload.

Workload: the default recipe's rollouts (configs/default.yaml): the embedded SmolLM2-135M, FrozenLake 4x4
random maps, 4 tasks x 8 episodes, up to 8 turns, 6 new tokens per turn, temperature 1, the two few-shot
exchanges, under the default ``per_step`` context and under ``full`` (one growing conversation). Every
engine runs the same seeds; each engine is warmed up on other seeds first (CPU kernels are built per
shape), then the measured rounds alternate between engines so machine noise hits them alike.

Engines:
- ``hf-naive``: the HF engine re-prefilling every prompt from scratch each turn (as naive loops do);
- ``hf``: the shipped HF engine (computes the prompt head the batch shares once per call);
- ``native``: KV caches kept across turns, a prefix store, continuous batching, weights pre-packed for oneDNN
  (where the build supports it);
- ``native-plain``: the same engine with plain weight matrices (what packing alone buys).

Printed: generated tokens/s (generated tokens / generation wall time), prefilled tokens, the ratio of each
to ``hf-naive`` and ``hf``; the machine's matmul peak (in the engines' dtype: ``--dtype``, by default what
``model.autocast_bf16=auto`` chooses here) and memory read bandwidth measured here, the
native engine's achieved FLOP/s in decode-only passes and in passes that prefill as a fraction of the peak,
and the decode roofline: a decode pass reads every weight once, so with R rows on this memory it cannot
exceed R x FLOPs-per-token / (bytes read / bandwidth), however good the kernels. Then a sweep of synthetic
decode passes of 8-256 rows shows how close the engine gets to that bound, and to the peak, as rows grow; each row
also times the pass's matrix products alone, which says how much of the bound the GEMM kernel itself leaves reachable.

    python bench/rollout.py [--rounds 2] [--contexts per_step full] [--sweep-rows 8 32 64 128 256] [--no-write]
    python bench/rollout.py --engines hf native --contexts per_step --sweep-rows   # the decode figure, in minutes
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import append_results, matmul_peak, merge_result, read_bandwidth  # noqa: E402 - bench/ is not a package

ROOT = Path(__file__).resolve().parents[1]


ENGINES = ("hf-naive", "hf", "native-plain", "native")


@dataclass
class Costs:
    """The model's per-token costs and this machine's limits in the engines' dtype, for the FLOP/s and roofline
    figures."""

    mm_flops: float  # matmul FLOPs per token incl. the LM head (2 per weight)
    attn_flops: float  # attention FLOPs per token per attended position (QK^T and PV)
    kv_bytes: int  # key + value bytes per cached position, all layers
    peak: float  # matmul GFLOP/s in the engines' dtype
    bandwidth: float  # memory read GB/s
    dtype: str = "bf16"  # the engines' dtype: 2 bytes per weight and cached value, or 4 in fp32

    @property
    def value_bytes(self) -> int:
        return 2 if self.dtype == "bf16" else 4

    @classmethod
    def measure(cls, model, dtype: str = "bf16") -> Costs:
        cfg = model.config
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        per_layer = sum(p.numel() for n, p in model.model.layers[0].named_parameters() if n.endswith("proj.weight"))
        params = per_layer * cfg.num_hidden_layers + model.get_output_embeddings().weight.numel()
        size = 2 if dtype == "bf16" else 4
        return cls(mm_flops=2.0 * params, attn_flops=4.0 * cfg.num_attention_heads * hd * cfg.num_hidden_layers,
                   kv_bytes=2 * size * cfg.num_hidden_layers * n_kv * hd, bandwidth=read_bandwidth(), dtype=dtype,
                   peak=matmul_peak(torch.bfloat16 if dtype == "bf16" else torch.float32))

    def decode_bound(self, rows: float, kv_positions: float) -> float:
        """The GFLOP/s a decode pass of ``rows`` rows attending ``kv_positions`` cached positions in all can reach:
        it reads every weight (2 or 4 bytes per 2 FLOPs of one row) and those keys/values once."""
        seconds = (self.mm_flops / 2 * self.value_bytes + kv_positions * self.kv_bytes) / (self.bandwidth * 1e9)
        return min(self.peak, rows * self.mm_flops / seconds / 1e9)


def decode_sweep(model, tok, rows_list, context: int, costs: Costs) -> list[str]:
    """Decode passes of R rows at ``context`` cached tokens each, timed warm: FLOP/s against the peak and
    against the memory-bandwidth roofline of a pass of R rows. The workload above has at most 32 rows."""
    from turnrl.engines.native import NativeEngine

    out = [f"| rows | ms per decode pass | GFLOP/s | of {costs.dtype} peak | roofline (memory) | of roofline "
           "| its matmuls alone, ms | matmul weight reads GB/s | of roofline with no other cost |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    g = torch.Generator().manual_seed(0)
    ceilings: list[float] = []
    for R in rows_list:
        eng = NativeEngine(model, tok, dtype=costs.dtype, max_slots=R, max_len=context + 64)
        prompt = torch.randint(5, 1000, (context,), generator=g).tolist()
        eng._forward([0], [prompt], [0], need_logits=False)
        for s in range(1, R):  # every slot holds the same context (values do not matter for speed)
            for K, V in zip(eng._k, eng._v):
                K[s, :, :context], V[s, :, :context] = K[0, :, :context], V[0, :, :context]

        def step() -> None:
            eng._forward(list(range(R)), [[5]] * R, [context] * R)

        for _ in range(3):
            step()
        n = 10
        t = time.perf_counter()
        for _ in range(n):
            step()
        dt = (time.perf_counter() - t) / n
        got = R * (costs.mm_flops + (context + 1) * costs.attn_flops) / dt / 1e9
        bound = costs.decode_bound(R, R * (context + 1))
        mm = matmuls_alone(eng, R)
        weight_bytes = costs.mm_flops / 2 * costs.value_bytes
        ceiling = R * (costs.mm_flops + (context + 1) * costs.attn_flops) / mm / 1e9 / bound  # the pass were its matmuls
        ceilings.append(ceiling)
        out.append(f"| {R} | {dt * 1e3:.1f} | {got:.0f} | {got / costs.peak:.1%} | {bound:.0f} GFLOP/s = "
                   f"{bound / costs.peak:.0%} of peak | {got / bound:.0%} | {mm * 1e3:.1f} | {weight_bytes / mm / 1e9:.1f} "
                   f"| {ceiling:.0%} |")
        print(out[-1], flush=True)
    out.append(
        f"\nThe last three columns time the pass's matrix products alone, with the engine's own weights and kernel "
        f"(`{'oneDNN, pre-packed' if eng.packed_weights else 'F.linear'}`), the same rows and nothing else. At that "
        "rate the matrix products alone cap a decode pass at "
        + ", ".join(f"{c:.0%} ({R} rows)" for R, c in zip(rows_list, ceilings))
        + " of the roofline, even if attention, norms and every other op took no time. The rest of a pass's time is "
        "those other ops.")
    return out


def matmuls_alone(eng, rows: int, n: int = 10) -> float:
    """Seconds for one decode pass's matrix products alone: every layer's four fused projections and the LM head over
    ``rows`` rows, in the engine's dtype, with its stored (maybe packed) weights and the bucketed row count its
    forward uses. No norms, RoPE, attention, cache writes or Python between layers beyond the calls themselves."""
    from turnrl.engines.native.model import _bucket_tokens, _linear

    w = eng._w
    N = _bucket_tokens(rows)
    hidden = w.embed.shape[1]
    x = torch.randn(N, hidden).to(eng.dtype)
    att = torch.randn(N, eng.n_heads * eng.head_dim).to(eng.dtype)
    act = torch.randn(N, eng.model.config.intermediate_size).to(eng.dtype)

    def one() -> None:
        for layer in w.layers:
            _linear(x, layer["qkv"], layer["qkv_bias"])
            _linear(att, layer["o"], layer["o_bias"])
            _linear(x, layer["gate_up"], layer["gate_up_bias"])
            _linear(act, layer["down"], layer["down_bias"])
        _linear(x[:rows], w.lm_head)

    for _ in range(3):
        one()
    t = time.perf_counter()
    for _ in range(n):
        one()
    return (time.perf_counter() - t) / n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2, help="measured collections per engine and context")
    ap.add_argument("--contexts", nargs="+", default=["per_step", "full"], choices=["per_step", "full"])
    ap.add_argument("--no-write", action="store_true", help="print only; do not append to bench/RESULTS.md")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES),
                    help="engines to run (hf and native always: the ratios and the decode figure need them)")
    ap.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                    help="the engines' dtype (auto: what model.autocast_bf16=auto chooses on this machine)")
    ap.add_argument("--sweep-rows", type=int, nargs="*", default=[8, 32, 64, 128, 256],
                    help="decode-pass sizes to time after the workload (none: skip)")
    args = ap.parse_args()

    from turnrl.config import load_config
    from turnrl.engines import HFEngine, SamplingParams
    from turnrl.engines.native import NativeEngine
    from turnrl.envs import make
    from turnrl.models import load_model, load_tokenizer, precision_note, use_bf16
    from turnrl.agent import ContextSpec
    from turnrl.rollout import Collector

    torch.set_num_threads(len(__import__("os").sched_getaffinity(0)))
    cfg = load_config(ROOT / "configs" / "default.yaml")
    tok = load_tokenizer(cfg.model.path)
    model = load_model(cfg.model.path)
    env_kwargs = dict(max_turns=cfg.env.max_turns, invalid_penalty=cfg.env.invalid_penalty, progress_reward=cfg.env.progress_reward,
                      reward=cfg.env.reward)
    sp = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.rollout.temperature)
    T, G = cfg.rollout.tasks_per_step, cfg.rollout.group_size
    dtype = args.dtype if args.dtype != "auto" else ("bf16" if use_bf16("auto") else "fp32")  # as a run would choose
    costs = Costs.measure(model, dtype)
    peak, bandwidth, mm_flops, attn_flops = costs.peak, costs.bandwidth, costs.mm_flops, costs.attn_flops
    print(f"engines: {precision_note(args.dtype if args.dtype == 'auto' else dtype == 'bf16')}; {dtype} "
          f"matmul peak measured here: {peak:.0f} GFLOP/s; memory read bandwidth {bandwidth:.1f} GB/s", flush=True)
    bf16 = dtype == "bf16"

    lines = []
    of_bound: dict[str, float] = {}  # per context: decode-only GFLOP/s over the lower of the peak and the memory bound
    for context in args.contexts:
        ctx = ContextSpec(context, few_shot=cfg.rollout.few_shot, max_context_tokens=cfg.rollout.max_context_tokens)
        engines = {
            "hf-naive": HFEngine(model, tok, autocast_bf16=bf16, min_shared_prefix=10**9),
            "hf": HFEngine(model, tok, autocast_bf16=bf16),
            "native-plain": NativeEngine(
                model, tok, dtype=dtype, max_slots=T * G, max_len=cfg.rollout.max_context_tokens, packed_weights=False
            ),
            "native": NativeEngine(model, tok, dtype=dtype, max_slots=T * G, max_len=cfg.rollout.max_context_tokens),
        }
        if context == "full":  # the head is the only thing shared; hf-naive and hf differ only in it
            engines.pop("hf-naive")
        engines = {n: e for n, e in engines.items() if n in args.engines or n in ("hf", "native")}
        tot = {name: {"gen_s": 0.0, "gen_tok": 0, "prompt_tok": 0, "episodes": 0, "turns": 0} for name in engines}
        counters = {k: 0.0 for k in ("prefill_tokens", "decode_tokens", "prefill_s", "decode_s", "decode_only_passes",
                                     "decode_only_tokens", "decode_only_kv")}
        for name, eng in engines.items():  # warm-up on other seeds
            Collector(eng, tok, lambda: make(cfg.env.id, **env_kwargs), ctx).collect(list(range(900, 900 + T)), G, sp)
        for r in range(args.rounds):
            seeds = list(range(r * T, (r + 1) * T))
            for name, eng in engines.items():
                if name == "native":
                    before = dict(eng.counters)
                col = Collector(eng, tok, lambda: make(cfg.env.id, **env_kwargs), ctx)
                groups = col.collect(seeds, G, sp)
                s = tot[name]
                s["gen_s"] += col.stats.generate_s
                s["gen_tok"] += col.stats.generated_tokens
                s["prompt_tok"] += col.stats.prompt_tokens
                s["episodes"] += sum(len(g.trajectories) for g in groups)
                s["turns"] += sum(len(t.turns) for g in groups for t in g.trajectories)
                if name == "native":
                    for k in counters:
                        counters[k] += eng.counters[k] - before[k]
                print(f"[{context}] round {r + 1} {name:9s} {col.stats.generate_s:6.1f} s  "
                      f"{col.stats.generated_tokens / col.stats.generate_s:7.1f} generated tok/s", flush=True)
        rate = {n: s["gen_tok"] / s["gen_s"] for n, s in tot.items()}
        # decode-only passes: matmul FLOPs of every row plus attention over the positions each row attends
        decode_flops = counters["decode_only_tokens"] * mm_flops + counters["decode_only_kv"] * attn_flops
        dec = decode_flops / counters["decode_s"] / 1e9 if counters["decode_s"] else float("nan")
        # passes that prefill also carry the decode rows of that tick; attention left out: a lower bound
        riding = counters["decode_tokens"] - counters["decode_only_tokens"]
        pre = (counters["prefill_tokens"] + riding) * mm_flops / counters["prefill_s"] / 1e9 if counters["prefill_s"] else float("nan")
        passes = max(1.0, counters["decode_only_passes"])
        rows = counters["decode_only_tokens"] / passes
        bound = costs.decode_bound(rows, counters["decode_only_kv"] / passes)  # an average decode-only pass
        of_bound[context] = dec / bound
        lines.append(f"**context `{context}`** ({args.rounds} rounds x {T * G} episodes per engine):\n")
        lines.append("| engine | generation s | generated tokens | turns | prompt tokens (logical) | generated tok/s | vs hf-naive | vs hf |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        base = rate.get("hf-naive")
        for n, s in tot.items():
            vs_naive = f"{rate[n] / base:.2f}x" if base else "n/a"
            lines.append(f"| {n} | {s['gen_s']:.1f} | {s['gen_tok']} | {s['turns']} | {s['prompt_tok']} | {rate[n]:.1f} | {vs_naive} | {rate[n] / rate['hf']:.2f}x |")
        lines.append(
            f"\nnative engine: prefilled {int(counters['prefill_tokens'])} tokens of {tot['native']['prompt_tok']} logical prompt tokens "
            f"({counters['prefill_tokens'] / max(1, tot['native']['prompt_tok']):.1%}). Decode-only passes "
            f"({int(counters['decode_only_passes'])}, {rows:.1f} rows on average): {dec:.0f} GFLOP/s = {dec / peak:.1%} of the "
            f"{peak:.0f} GFLOP/s {dtype} matmul peak; the memory-bandwidth bound of such a pass on this machine "
            f"({bandwidth:.1f} GB/s) is {bound:.0f} GFLOP/s = {bound / peak:.1%} of peak, so decode reaches {dec / bound:.0%} of "
            f"what the memory allows. Passes that prefill ({int(counters['decode_tokens'] - counters['decode_only_tokens'])} "
            f"decode rows rode along): >= {pre:.0f} GFLOP/s = {pre / peak:.1%}. Time in passes that prefill "
            f"{counters['prefill_s']:.1f} s, decode-only {counters['decode_s']:.1f} s.\n"
        )
    if args.sweep_rows:
        context = 192  # about what a per-step FrozenLake row holds
        lines.append(f"**decode passes by size** (synthetic: every row holds {context} cached tokens; native engine, {dtype}):\n")
        lines += decode_sweep(model, tok, args.sweep_rows, context, costs)
        lines.append("")
    report = "\n".join(lines)
    print("\n" + report)
    if not args.no_write:
        head = (
            f"\n### Rollout engines — {time.strftime('%Y-%m-%d %H:%M')}\n\n"
            f"Command: `python {' '.join(sys.argv)}` "
            f"({platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}; engines in {dtype}). Default workload: "
            f"SmolLM2-135M, FrozenLake 4x4, {T} tasks x {G} episodes, <= {cfg.env.max_turns} turns, {cfg.rollout.max_new_tokens} "
            "new tokens per turn, temperature 1; same seeds for every engine, each warmed up first.\n\n"
        )
        append_results(head + report)
        if "per_step" in of_bound:  # the default context's figure is issue 22's decode target (>= 60%)
            perf = {"decode_of_bound": round(of_bound["per_step"], 3), "decode_of_bound_by_context": of_bound}
            machine = {f"peak_gflops_{dtype}": round(peak, 1), "bandwidth_gbs": round(bandwidth, 2)}  # what the ratio used
            perf["decode_dtype"] = dtype
            print(f"wrote {merge_result('perf', perf, machine=machine)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
