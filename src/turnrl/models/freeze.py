"""Freezing the lower decoder layers (``train.freeze_layers=K``): they run forward only and hold no optimizer state.

The token embeddings and the first K decoder layers stop requiring gradients, and the embedding lookup's output is
detached, so autograd records nothing below layer K: those layers cost one forward pass per position instead of a
forward and a backward, keep no activations for the backward, and AdamW keeps no moments for them.

Effect on the gradient: for every parameter still trained it is the exact gradient of the same loss (the frozen
layers' outputs do not depend on the trained parameters); the frozen parameters get none and never change, so the
model trains in a smaller subspace. With tied embeddings (SmolLM2's LM head is its embedding matrix) the matrix keeps
training through the head; only the path through the input lookup is cut. With LoRA, adapters in the frozen layers
freeze too. ``bench/update_speed.py`` measures the speed and the gradient's cosine to the full one.
"""

from __future__ import annotations

import torch


class FreezeError(ValueError):
    """``train.freeze_layers`` does not fit this model."""


def decoder_layers(model, option: str = "train.freeze_layers", off: str = "0") -> torch.nn.ModuleList:
    """The decoder's list of transformer blocks (Llama-style ``model.model.layers``; through a LoRA wrapper too).

    ``option`` is the config key that needs them and ``off`` its value that does not: the error names both.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        layers = base.get_decoder().layers
    except (AttributeError, ValueError, NotImplementedError):
        layers = None
    if not isinstance(layers, torch.nn.ModuleList):
        raise FreezeError(f"{option} needs a decoder with a list of layers, and {type(base).__name__} has "
                          f"none that turnrl can find: set {option}={off}")
    return layers


def freeze_lower_layers(model, k: int) -> int:
    """Freeze the embeddings and the first ``k`` decoder layers of ``model`` in place; returns the parameters frozen.

    Call it before the optimizer is built (the optimizer holds only parameters that require a gradient).
    """
    if k <= 0:
        return 0
    layers = decoder_layers(model)
    if k > len(layers):
        raise FreezeError(f"train.freeze_layers={k} but the model has {len(layers)} decoder layers: set it to at most "
                          f"{len(layers)}")
    embeddings = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embeddings.weight
    frozen = [p for layer in layers[:k] for p in layer.parameters()]
    if not tied:
        frozen += list(embeddings.parameters())
    for p in frozen:
        p.requires_grad_(False)
    embeddings.register_forward_hook(_detach_output)
    return sum(p.numel() for p in frozen)


def _detach_output(module, inputs, output):
    """Forward hook: the embedding lookup's output without its autograd history (no gradient flows below layer K)."""
    return output.detach()
