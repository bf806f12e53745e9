"""Grouped-query attention without copying the keys and values once per query head.

SmolLM2-135M has 9 query heads over 3 key/value heads. For a masked multi-token query on CPU, transformers' ``sdpa``
attention repeats every key and value head for each of its query heads (``repeat_kv``, a copy) before calling
``scaled_dot_product_attention``, and autograd keeps that copy for the backward pass: in one micro-batch of the
default recipe (64 rows, 165 key positions) 1.46 GB of the update's activation memory. torch's CPU flash-attention
kernel takes the grouped heads itself (``enable_gqa=True``, masks included), so :data:`NAME` calls it directly:
the same attention, computed 2.6x faster on that shape (output equal, gradients within 1e-6), and no copy.

In bf16 (under autocast) the gradient comes from :class:`_MatmulBackward`: the forward is the same flash kernel,
and the backward recomputes the attention probabilities with one matmul and forms the gradients with four more.
torch's CPU flash backward in bf16 ran 1.3-3.2x slower than that on the default recipe's shapes, and took 17% of an
update (bench/RESULTS.md, 2026-12-07 "Attention's backward in bf16"); its fp32 backward is not slow, and fp32 keeps it.

Every other case (a GPU, one query token, no mask, no grouping, a position bias) goes to transformers' own ``sdpa``.
Models turnrl loads (:func:`turnrl.models.load_model`, :func:`turnrl.models.tiny_model`) use it; call
:func:`use_grouped_attention` on a model built elsewhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "turnrl_sdpa"
MATMUL_BACKWARD = True  # False: torch's flash backward in bf16 too (the baseline of bench/attention_backward.py)


def grouped_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                 dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' attention-function signature: ``(batch, heads, q, dim)`` tensors in, ``(batch, q, heads, dim)``
    out (and no attention weights)."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = (query.device.type != "cpu" or not grouped or query.shape[2] == 1 or attention_mask is None
             or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    low = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
    trained = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    if MATMUL_BACKWARD and trained and dropout == 0.0 and low in (torch.bfloat16, torch.float16):
        q, k, v = (t.to(low) for t in (query, key, value))  # what autocast would pass the kernel
        mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask.to(low)
        with torch.autocast("cpu", enabled=False):
            out = _MatmulBackward.apply(q, k, v, mask, scaling)
    else:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                             scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


class _MatmulBackward(torch.autograd.Function):
    """Grouped-query attention whose forward is torch's flash kernel and whose backward is five batched matmuls.

    With the query heads laid out per key/value head (``q``: (B, G, g L, D) for G key/value heads of g query heads
    each; no copy of the keys), scale c and additive mask M, the backward recomputes

        P = softmax(c Q K^T + M)        (scores and softmax in fp32, from the bf16 inputs)

    and forms, with dO the output's gradient and O the output,

        dV = P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dO * O)),   dQ = c dS K,   dK = c dS^T Q

    with the matmuls in the inputs' dtype (fp32 accumulation). A boolean mask (True where a query may attend) is
    applied as -inf, and a query row with no key allowed gets zero probabilities, as the kernel gives it a zero output.
    It saves what the flash kernel saves (Q, K, V, O) and the mask. Against an fp64 reference on the default
    recipe's shapes its gradients' relative error is 4.5-5.0e-3, the kernel's own 4.6-5.2e-3
    (bench/attention_backward.py; tests/test_attention_backward.py checks it against the kernel's).
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        ctx.save_for_backward(q, k, v, mask, out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, mask, out = ctx.saved_tensors
        b, h, n, d = q.shape
        groups, keys = k.shape[1], k.shape[2]
        g = h // groups
        scale = ctx.scale if ctx.scale is not None else d ** -0.5
        qg = q.reshape(b, groups, g * n, d)
        m = mask[:, :, None] if mask.shape[1] == 1 else mask.expand(b, h, n, keys).reshape(b, groups, g, n, keys)
        s = torch.matmul(qg.float(), k.float().transpose(-1, -2)).mul_(scale).view(b, groups, g, n, keys)
        if mask.dtype == torch.bool:  # True: may attend; a row with no key allowed is 0 in the kernel's output
            p = torch.softmax(s.masked_fill_(~m, float("-inf")), dim=-1).nan_to_num_(0.0)
        else:
            p = torch.softmax(s.add_(m), dim=-1)
        p = p.view(b, groups, g * n, keys)
        do = grad.reshape(b, groups, g * n, d).to(q.dtype)
        dv = torch.matmul(p.to(v.dtype).transpose(-1, -2), do)
        dp = torch.matmul(do, v.transpose(-1, -2)).float()
        rows = (do.float() * out.reshape(b, groups, g * n, d).float()).sum(-1, keepdim=True)
        ds = p.mul_(dp.sub_(rows)).mul_(scale).to(q.dtype)
        dq = torch.matmul(ds, k).view(b, h, n, d)
        dk = torch.matmul(ds.transpose(-1, -2), qg)
        return dq, dk, dv, None, None


def register() -> None:
    """Make :data:`NAME` known to transformers in this process (idempotent). turnrl.models.prefix, which every turnrl
    forward pass goes through, calls it on import, so a model pickled to another process (a learner rank, a Ray
    worker) finds its attention there."""
    AttentionInterface.register(NAME, grouped_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # the masks transformers builds for it: those of "sdpa"


def use_grouped_attention(model):
    """Run ``model``'s attention through :func:`grouped_sdpa` where it runs transformers' ``sdpa`` (else unchanged).
    Returns ``model``. Not saved with the model: its config.json is unchanged."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        register()
        model.set_attn_implementation(NAME)
    return model
