"""Activation checkpointing (``train.activation_checkpointing``): each decoder layer keeps only its input for the
backward pass and runs its forward again there, trading one more forward per layer for most of the activation memory.

The learner's update holds, for every layer and every position of a micro-batch, the activations its backward needs
(attention and MLP intermediates: on the default model about 30 layers x 2048 positions x several 576- and
1536-wide rows). With checkpointing a layer saves only its input hidden state; its backward recomputes the forward
(``torch.utils.checkpoint``, non-reentrant, under the same autocast state), so the gradient is the same computation
run twice: equal to the plain one up to floating-point noise (tests/test_recompute.py checks 1e-5).

A layer that reads a KV cache must see the same cache when recomputed. HF attention *appends* to its cache
(``DynamicLayer.update`` concatenates and stores), so a second run would see its own keys twice. The learner's
caches are therefore :class:`~turnrl.models.prefix.PrefixCache`: once frozen (before the forward with autograd),
``update`` returns the stored keys followed by the new ones without storing anything, and every run of a layer sees
the same keys; the forward that fills a cache (the shared prefix) runs :func:`paused`. HF's own
``gradient_checkpointing_enable`` cannot be used: it drops the cache argument.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.checkpoint import checkpoint

from turnrl.models.freeze import decoder_layers

_state = threading.local()  # paused(): per thread, as the async producer generates while the learner updates


AUTO_BELOW_GB = 8.0  # train.activation_checkpointing=auto turns it on below this much memory (docs/speed.md)


def wanted(setting: bool | str, model) -> bool:
    """Whether ``train.activation_checkpointing`` (true, false or "auto") asks to checkpoint ``model`` on this machine.

    "auto" skips a model whose decoder layers turnrl cannot find (true refuses it, naming the fix).
    """
    if setting != "auto":
        return setting is True
    try:
        decoder_layers(model)
    except ValueError:
        return False
    return memory_gb() < AUTO_BELOW_GB


def memory_gb() -> float:
    """The memory this process may use: the machine's RAM, or its cgroup's limit (a container) when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):
        total = min(total, int(Path("/sys/fs/cgroup/memory.max").read_text().strip()))  # "max" when unlimited
    return total / 1e9


def is_checkpointed(model) -> bool:
    """Whether :func:`checkpoint_layers` was applied to ``model``."""
    try:
        return all(getattr(layer, "_turnrl_checkpointed", False) for layer in decoder_layers(model))
    except ValueError:
        return False


def checkpoint_layers(model) -> int:
    """Run every decoder layer of ``model`` under activation checkpointing when autograd is on; returns how many.

    The layers keep their modules and parameter names (checkpoints, weight sync and LoRA see no change); under
    ``no_grad`` (the engine, evaluation, the reference policy) they run as before.
    """
    layers = decoder_layers(model, "train.activation_checkpointing", "false")
    for layer in layers:
        layer.forward = _Checkpointed(layer)  # wraps the class's forward, so a second call wraps nothing twice
        layer._turnrl_checkpointed = True
    return len(layers)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Checkpointed layers run plainly inside this block (in this thread): for forwards that fill a growing cache."""
    before = getattr(_state, "paused", False)
    _state.paused = True
    try:
        yield
    finally:
        _state.paused = before


class _Checkpointed:
    """A layer's own (class) forward, run under ``checkpoint`` when autograd is on and not :func:`paused`.

    An object rather than a closure so that copies and pickles of the model (learner ranks get a pickle) stay
    checkpointed, each bound to its own layer.
    """

    def __init__(self, layer: torch.nn.Module) -> None:
        self.layer = layer

    def __call__(self, *args, **kwargs):
        forward = functools.partial(type(self.layer).forward, self.layer)
        if not torch.is_grad_enabled() or getattr(_state, "paused", False):
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
