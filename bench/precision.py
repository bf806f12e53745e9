"""bf16 or fp32 on this CPU: what ``model.autocast_bf16=auto`` chooses, and what either choice costs here.

CPUs with bf16 units (AMX, AVX512-BF16) run bf16 matmuls several times faster than fp32; CPUs without them (AVX2 only)
emulate bf16 and run it several times slower. This measures, in one process, on the default model:

- the CPU's bf16-related flags and ``turnrl.models.precision.bf16_speedup()`` (the probe ``auto`` decides by);
- matmul GFLOP/s of a SmolLM2-135M projection (576 -> 1536) at 8, 256 and 2048 rows, in each dtype;
- the native engine's decode pass (8 rows, 192 cached tokens each), ms per pass, in each dtype;
- one ``Learner.update`` on a per-step-shaped batch (16 samples of a 240-token shared prompt, a 12-token
  observation and 6 trained tokens), warm, in fp32 and under bf16 autocast;

and writes ``bench/results/precision.json`` and a RESULTS.md section; each line prints fp32 time over bf16 time
(above 1: bf16 is faster).

    python bench/precision.py [--threads T] [--no-write]
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from machine import append_results, header, timed, write_result  # noqa: E402 - bench/ is not a package

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def cpu_flags() -> list[str]:
    """The bf16- and vector-related flags ``/proc/cpuinfo`` lists (empty off Linux)."""
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx_vnni")
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in wanted if f in have]
    except OSError:
        pass
    return []


def matmuls() -> dict[str, dict[str, float]]:
    out = {}
    for rows in (8, 256, 2048):
        out[str(rows)] = {}
        for name, dtype in DTYPES.items():
            x, w = torch.randn(rows, 576).to(dtype), torch.randn(1536, 576).to(dtype)
            s = timed(lambda: torch.nn.functional.linear(x, w))
            out[str(rows)][name] = round(2 * rows * 576 * 1536 / s / 1e9, 2)
        print(f"matmul {rows:>4} x 576 x 1536: bf16 {out[str(rows)]['bf16']} GFLOP/s, fp32 {out[str(rows)]['fp32']} "
              f"GFLOP/s; bf16/fp32 {out[str(rows)]['bf16'] / out[str(rows)]['fp32']:.2f}", flush=True)
    return out


def decode_ms(model, tok, rows: int = 8, context: int = 192) -> dict[str, float]:
    from turnrl.engines.native import NativeEngine

    threads = torch.get_num_threads()
    out = {}
    prompt = torch.randint(5, 1000, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    for name in DTYPES:
        eng = NativeEngine(model, tok, dtype=name, max_slots=rows, max_len=context + 64, threads=threads)
        eng._forward([0], [prompt], [0], need_logits=False)
        for s in range(1, rows):  # every slot holds the same context (values do not matter for speed)
            for K, V in zip(eng._k, eng._v):
                K[s, :, :context], V[s, :, :context] = K[0, :, :context], V[0, :, :context]
        out[name] = round(1e3 * timed(lambda: eng._forward(list(range(rows)), [[5]] * rows, [context] * rows), 3.0), 1)
    print(f"decode pass ({rows} rows, {context} cached): bf16 {out['bf16']} ms, fp32 {out['fp32']} ms; fp32/bf16 time "
          f"{out['fp32'] / out['bf16']:.2f}", flush=True)
    return out


def update_s(model, tok) -> dict[str, float]:
    from turnrl.config import load_config
    from turnrl.learner.learner import Learner, LearnerParams
    from turnrl.types import TrainSample

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 1000, (240,), generator=g).tolist()
    samples = []
    for i in range(16):
        ids = prompt + torch.randint(5, 1000, (18,), generator=g).tolist()  # 12 observation + 6 response tokens
        mask = [0] * (len(ids) - 6) + [1] * 6
        samples.append(TrainSample(ids, mask, [-1.0 * m for m in mask], [(1.0 if i % 2 else -1.0) * m for m in mask]))
    out = {}
    for name in DTYPES:
        cfg = load_config(None, [f"model.autocast_bf16={name == 'bf16'}", "train.activation_checkpointing=false"])
        learner = Learner(copy.deepcopy(model), LearnerParams.from_config(cfg), pad_id=tok.pad_token_id)
        out[name] = round(timed(lambda: learner.update(samples), 1.0, 1), 2)  # bf16 can take minutes
    print(f"Learner.update (16 samples, {sum(len(s.input_ids) for s in samples)} tokens, 96 trained): bf16 "
          f"{out['bf16']} s, fp32 {out['fp32']} s; fp32/bf16 time {out['fp32'] / out['bf16']:.2f}", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from turnrl.models import load_model, load_tokenizer, precision_note, use_bf16
    from turnrl.models.precision import bf16_speedup

    flags = cpu_flags()
    probe = bf16_speedup()
    print(f"cpu flags: {' '.join(flags) or 'unknown'}; {precision_note('auto')}", flush=True)
    mm = matmuls()
    tok, model = load_tokenizer("default"), load_model("default")
    dec = decode_ms(model, tok)
    upd = update_s(model, tok)
    fields = {"flags": flags, "bf16_speedup_probe": round(probe, 3), "auto_chooses": "bf16" if use_bf16("auto") else "fp32",
              "matmul_gflops": mm, "decode_ms": dec, "update_s": upd,
              "decode_fp32_over_bf16_time": round(dec["fp32"] / dec["bf16"], 3),
              "update_fp32_over_bf16_time": round(upd["fp32"] / upd["bf16"], 3)}
    if args.no_write:
        return 0
    head = header()
    write_result("precision", fields, head=head)
    rows = "\n".join(f"| {r} x 576 x 1536 matmul | {v['bf16']} GFLOP/s | {v['fp32']} GFLOP/s | {v['bf16'] / v['fp32']:.2f} |"
                     for r, v in mm.items())
    append_results(
        f"### bf16 or fp32 on this CPU — {head['date']}\n\n"
        f"Command: `{head['command']}` ({head['cpu']}, threads: {head['threads']}; flags: {' '.join(flags) or 'unknown'}; "
        f"peaks {head['peak_gflops_bf16']} GFLOP/s bf16, {head['peak_gflops_fp32']} fp32; {head['bandwidth_gbs']} GB/s; "
        f"commit {head['commit']}). Results: `bench/results/precision.json`.\n\n"
        "| what | bf16 | fp32 | bf16 speed over fp32 |\n|---|---:|---:|---:|\n" + rows + "\n"
        f"| decode pass, 8 rows x 192 cached (native engine) | {dec['bf16']} ms | {dec['fp32']} ms | {dec['fp32'] / dec['bf16']:.2f} |\n"
        f"| `Learner.update`, 16 per-step samples, 96 trained tokens | {upd['bf16']} s | {upd['fp32']} s | {upd['fp32'] / upd['bf16']:.2f} |\n\n"
        f"`model.autocast_bf16=auto` chooses {fields['auto_chooses']} here (its probe: a bf16 linear at {probe:.2f}x fp32's speed).\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
