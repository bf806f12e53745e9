"""Grouped-query attention without copying the keys and values once per query head.

SmolLM2-135M has 9 query heads over 3 key/value heads. For a masked multi-token query on CPU, transformers' ``sdpa``
attention repeats every key and value head for each of its query heads (``repeat_kv``, a copy) before calling
``scaled_dot_product_attention``, and autograd keeps that copy for the backward pass: in one micro-batch of the
default recipe (64 rows, 165 key positions) 1.46 GB of the update's activation memory. torch's CPU flash-attention
kernel takes the grouped heads itself (``enable_gqa=True``, masks included), so :data:`NAME` calls it directly:
the same attention, computed 2.6x faster on that shape (output equal, gradients within 1e-6), and no copy.

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
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
                                         enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


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
