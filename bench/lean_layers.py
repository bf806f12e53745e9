"""What the lean RMSNorm and SwiGLU MLP (turnrl.models.lean) save and cost, against transformers' own modules.

On the default model (SmolLM2-135M, fp32) and one batch of random tokens, each side in this process:

- the bytes autograd keeps for the backward pass per position (every tensor a saved-tensor hook sees, each storage
  once, the weights excluded), which is what a micro-batch's activation memory grows with;
- whether the logits are bit-for-bit the same, and the largest relative difference of a parameter's gradient;
- the seconds per row of one MLP's forward and backward at several row counts (the best of a few repeats), the
  module whose backward now recomputes ``silu(gate(x)) * up(x)``.

    python bench/lean_layers.py [--rows 8 128] [--threads 2]

Prints, and writes bench/results/lean_layers.json.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from machine import write_result


def kept_per_position(model, ids: torch.Tensor) -> float:
    """Bytes autograd saves for the backward of ``model(ids)``, per position (the weights not counted)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, use_cache=False)
    return sum(n for ptr, n in storages.items() if ptr not in params) / ids.numel()


def gradients(model, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, use_cache=False).logits
    logits[:, -8:].log_softmax(-1)[..., :100].sum().backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


def mlp_us_per_row(mlp, rows: int, hidden: int, repeats: int = 3) -> float:
    x = torch.randn(rows, hidden)
    best = float("inf")
    for _ in range(repeats):
        n = max(3, 6000 // rows)
        start = time.perf_counter()
        for _ in range(n):
            xi = x.clone().requires_grad_(True)
            mlp(xi).sum().backward()
        best = min(best, (time.perf_counter() - start) / n / rows * 1e6)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs=2, default=[8, 128], metavar=("BATCH", "LENGTH"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.models.llama.modeling_llama import LlamaMLP

    from turnrl.models import load_model
    from turnrl.models.lean import LeanMLP

    lean = load_model("default", dtype=torch.float32)  # turnrl's models load with the lean layers
    reference = copy.deepcopy(lean)
    for layer in reference.model.layers:  # transformers' own modules, holding the same parameters
        mlp = LlamaMLP(reference.config)
        mlp.gate_proj, mlp.up_proj, mlp.down_proj = layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj
        layer.mlp = mlp
        for name in ("input_layernorm", "post_attention_layernorm"):
            setattr(layer, name, _hf_norm(getattr(layer, name)))
    reference.model.norm = _hf_norm(reference.model.norm)
    assert not any(isinstance(m, LeanMLP) for m in reference.modules())
    reference.train()
    lean.train()
    torch.manual_seed(0)
    ids = torch.randint(0, reference.config.vocab_size, tuple(args.rows))
    kept = {"transformers": kept_per_position(reference, ids), "lean": kept_per_position(lean, ids)}
    out_ref, g_ref = gradients(reference, ids)
    out_lean, g_lean = gradients(lean, ids)
    worst = max(((g_lean[n] - g).norm() / g.norm().clamp_min(1e-30)).item() for n, g in g_ref.items())
    hidden = reference.config.hidden_size
    timing = {}
    for rows in (256, 1024, 3000):
        timing[rows] = {"transformers": mlp_us_per_row(reference.model.layers[0].mlp, rows, hidden),
                        "lean": mlp_us_per_row(lean.model.layers[0].mlp, rows, hidden)}
    print(f"batch {args.rows[0]} x {args.rows[1]} tokens, fp32, {args.threads} threads")
    print(f"kept for the backward: transformers {kept['transformers'] / 1e3:.1f} KB/position, lean "
          f"{kept['lean'] / 1e3:.1f} KB/position ({kept['lean'] / kept['transformers']:.2f}x)")
    print(f"logits bit-for-bit equal: {torch.equal(out_ref, out_lean)}; largest relative gradient difference {worst:.1e}")
    for rows, t in timing.items():
        print(f"one MLP, forward + backward, {rows} rows: transformers {t['transformers']:.1f} us/row, lean "
              f"{t['lean']:.1f} us/row ({t['transformers'] / t['lean']:.2f}x the speed)")
    write_result("lean_layers", {
        "batch": args.rows, "threads": args.threads, "kept_bytes_per_position": kept,
        "kept_ratio": kept["lean"] / kept["transformers"], "logits_equal": bool(torch.equal(out_ref, out_lean)),
        "max_relative_grad_diff": worst,
        "mlp_us_per_row": {str(r): t for r, t in timing.items()},
    })
    return 0


def _hf_norm(norm):
    """transformers' LlamaRMSNorm holding ``norm``'s weight."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf = LlamaRMSNorm(norm.weight.shape[0], eps=norm.variance_epsilon)
    hf.weight = norm.weight
    return hf


if __name__ == "__main__":
    raise SystemExit(main())
