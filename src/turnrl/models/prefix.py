"""Shared-prefix forward passes: compute a prompt prefix common to a batch once, reuse its KV cache.

Agent prompts repeat a long prefix (system prompt, tool docs, few-shot exchanges) before the part that
changes (the current observation). Both the engine's prefill and the learner's forward pass run that
prefix once with batch size 1 and broadcast its keys/values to the batch. For the learner this is exact,
not an approximation: the prefix activations keep their autograd graph, and the backward pass of the
broadcast sums every row's gradient into them, so the gradient equals the one of the padded full batch
(up to floating-point summation order).

The cache stores the prefix once (one row) and broadcasts it to the batch inside each layer's cache update, as a
view: a broadcast stored in the cache would be copied per row by transformers' cache (in the default recipe's
micro-batch, 64 rows x 30 layers: 0.37 GB), and its backward (the sum over rows) would wait for the whole
micro-batch's backward, keeping every layer's per-row key and value gradients alive meanwhile (another 0.47 GB).
Broadcast in the layer, each layer's sum runs as soon as that layer's backward is done.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import DynamicCache

from turnrl.models.attention import register as register_grouped_attention
from turnrl.models.recompute import paused

register_grouped_attention()  # a model unpickled in this process may name it (turnrl.models.attention)


def common_prefix_len(seqs: Sequence[Sequence[int]], limit: int | None = None) -> int:
    """Length of the longest prefix shared by every sequence, at most ``limit``."""
    if not seqs:
        return 0
    n = min(len(s) for s in seqs)
    if limit is not None:
        n = min(n, limit)
    first = seqs[0]
    for i in range(n):
        tok = first[i]
        if any(s[i] != tok for s in seqs):
            return i
    return n


class PrefixCache(DynamicCache):
    """A :class:`DynamicCache` whose stored keys may be one row broadcast to the batch, and that stops growing once
    frozen: ``update`` then returns (stored ++ new), storing nothing.

    HF attention *appends* to its cache, so running a layer twice over the same cache (activation checkpointing's
    recompute, :mod:`turnrl.models.recompute`) would show it its own keys twice; frozen, every run sees the same keys.
    """

    frozen = False

    def freeze(self) -> "PrefixCache":
        self.frozen = True
        return self

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx] if layer_idx < len(self.layers) else None
        if layer is None or not layer.is_initialized or layer.keys.numel() == 0:
            if self.frozen:
                return key_states, value_states
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        rows = key_states.shape[0]
        keys, values = _broadcast(layer.keys, rows), _broadcast(layer.values, rows)
        if self.frozen:
            return torch.cat((keys, key_states), dim=-2), torch.cat((values, value_states), dim=-2)
        layer.keys, layer.values = keys, values  # growing: the cache now holds the batch's rows
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def deferred(cache: PrefixCache, config) -> PrefixCache:
    """``cache`` (of a model with ``config``) with its keys and values cut from the prefix's autograd graph by one
    node whose backward, which runs once every layer has passed its gradient to them, backpropagates the prefix's
    graph with those gradients.

    The gradient is the same. Without the cut, every weight that both the prefix and the rest of the batch used (all
    of them) holds the rest's gradient in autograd's buffer until the prefix's backward brings its own: a second copy
    of the whole gradient (0.54 GB on the default model) alive at the end of every micro-batch's backward. With it,
    each layer's gradient is added to ``.grad`` as soon as that layer's backward is done.
    """
    stored = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    if not any(t.requires_grad for t in stored):
        return cache
    cut = _PrefixCut.apply(stored, *[t.detach().requires_grad_(t.requires_grad) for t in stored])
    data = [(cut[2 * i], cut[2 * i + 1]) for i in range(len(cache.layers))]
    return PrefixCache(ddp_cache_data=data, config=config)


class _PrefixCut(torch.autograd.Function):
    """Identity on the prefix's keys and values; its backward runs the prefix's own backward (:func:`deferred`)."""

    @staticmethod
    def forward(ctx, stored: list[torch.Tensor], *cut: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.stored = stored  # a list, not tensor arguments: autograd does not see the prefix's graph from here
        out = tuple(t.view_as(t) for t in cut)
        # A function's outputs all require a gradient if one input does: the keys and values of frozen layers
        # (train.freeze_layers) would then carry autograd into those layers' attention in every micro-batch, and
        # their whole backward would run for nothing. They stay constants.
        ctx.mark_non_differentiable(*(o for o, needs in zip(out, ctx.needs_input_grad[1:]) if not needs))
        ctx.set_materialize_grads(False)  # no zero gradients for the keys and values that got none
        return out

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        backward_into(ctx.stored, grads)
        return (None, *(None for _ in grads))


def backward_into(stored: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None]) -> None:
    """Backpropagate each stored prefix tensor's graph with its gradient (skipping tensors without either)."""
    pairs = [(t, g) for t, g in zip(stored, grads) if g is not None and t.requires_grad]
    if pairs:
        torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])


def _broadcast(stored: torch.Tensor, rows: int) -> torch.Tensor:
    """A one-row cache tensor as a ``rows``-row view (other tensors as they are)."""
    return stored.expand(rows, -1, -1, -1) if stored.shape[0] == 1 and rows > 1 else stored


def prefix_cache(model, prefix_ids: Sequence[int]) -> PrefixCache:
    """Run ``prefix_ids`` once and return a cache that serves its keys and values to a batch of any number of rows.

    The prefix runs without activation checkpointing (one row: its activations are small), since the cache it fills
    grows as it runs. The cache holds one row; each layer broadcasts it when it reads it (see the module doc).
    """
    ids = torch.tensor([list(prefix_ids)], dtype=torch.long)
    with paused():
        _, cache = forward(model, input_ids=ids, use_cache=True, logits_to_keep=1)
    data = [(layer.keys, layer.values) for layer in cache.layers]
    return PrefixCache(ddp_cache_data=data, config=model.config)


class BatchPrefix:
    """The prompt prefix every micro-batch of one update shares, run once for the update, not once per micro-batch.

    Samples grouped by prompt (:func:`turnrl.learner.samples.prefix_groups`) give each micro-batch its own longer
    prefix (one map's observation, one role's system prompt), and all of them start with the part the whole batch
    shares (the system prompt and few-shot exchanges: 125 of the default recipe's 126-160 prefix tokens, in each of
    the 15 micro-batches of its step-0 batch). :meth:`cache` serves a micro-batch this part's keys and values as
    leaves of their own and runs only the rest of the micro-batch's prefix on top; each micro-batch's backward adds
    its gradient to the leaves, and :meth:`backward`, once every micro-batch is done, runs the shared part's own
    backward with their sum. The gradient is the same (up to floating-point order); the shared part's activations
    (one row) stay alive for the update.

    A data-parallel learner must not use it: its ranks synchronise gradients in the last micro-batch's backward, before
    :meth:`backward` would add the shared part's.
    """

    def __init__(self, model, prefix_ids: Sequence[int]) -> None:
        self.ids, self.config = list(prefix_ids), model.config
        self._stored = [t for layer in prefix_cache(model, self.ids).layers for t in (layer.keys, layer.values)]
        self._leaves = [t.detach().requires_grad_(t.requires_grad) for t in self._stored]

    def cache(self, model, prefix_ids: Sequence[int]) -> PrefixCache | None:
        """A cache holding ``prefix_ids`` (which must start with this prefix; else None): this prefix's keys and
        values, then the rest's, run now over them (cut from its graph like :func:`deferred`'s)."""
        n = len(self.ids)
        if len(prefix_ids) < n or list(prefix_ids[:n]) != self.ids:
            return None
        data = [(self._leaves[2 * i], self._leaves[2 * i + 1]) for i in range(len(self._leaves) // 2)]
        cache = PrefixCache(ddp_cache_data=data, config=self.config)
        if len(prefix_ids) == n:
            return cache
        rest = torch.tensor([list(prefix_ids[n:])], dtype=torch.long)
        with paused():
            _, cache = forward(model, cache, input_ids=rest, position_ids=torch.arange(n, len(prefix_ids))[None],
                               use_cache=True, logits_to_keep=1)
        return deferred(cache, self.config)

    def backward(self) -> None:
        """Run the shared prefix's backward with the gradient every micro-batch added to its keys and values (once;
        returns None, so ``shared = shared.backward()`` drops it)."""
        backward_into(self._stored, [leaf.grad for leaf in self._leaves])
        self._stored, self._leaves = [], []


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def bucket_rows(n: int) -> int:
    """Row-count buckets: exact up to 4, multiples of 4 up to 16, then multiples of 16.

    CPU kernels (oneDNN) are specialised per shape, and a new shape costs more than a few padded rows, so
    the engine and the learner round batch shapes up to these buckets.
    """
    if n <= 4:
        return n
    return round_up(n, 4) if n <= 16 else round_up(n, 16)


def left_padded(rows: Sequence[Sequence[int]], prefix_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The layout every shared-prefix batch uses: each row's tokens after ``prefix_len``, left-padded.

    Returns ``ids`` (rows, S) with S the longest suffix rounded up to a multiple of 8 (a shape bucket), and
    ``attention`` (rows, prefix_len + S): 1 on the prefix and on each row's real tokens, 0 on padding.
    """
    suffixes = [r[prefix_len:] for r in rows]
    S = round_up(max(len(x) for x in suffixes), 8)
    ids = torch.full((len(rows), S), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), prefix_len + S), dtype=torch.long)
    attention[:, :prefix_len] = 1
    for b, x in enumerate(suffixes):
        ids[b, S - len(x) :] = torch.tensor(x, dtype=torch.long)
        attention[b, prefix_len + S - len(x) :] = 1
    return ids, attention


def positions_from_mask(mask: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Position ids that count only attended tokens (left / middle padding safe). Shape: (batch, seq_len)."""
    pos = mask.long().cumsum(-1) - 1 + offset
    return pos.clamp_min(offset)


def additive_mask(attention: torch.Tensor, query_len: int, dtype: torch.dtype) -> torch.Tensor:
    """A 4D additive attention mask for ``query_len`` new tokens after a cache.

    ``attention`` (batch, kv_len) marks real tokens (1) and padding (0); the last ``query_len`` key slots
    are the queries themselves. Query ``i`` may see key ``j`` when ``j`` is real and not in its future.
    Shape: (batch, 1, query_len, kv_len). Passing this instead of the 2D mask matters for training speed:
    with a 2D padding mask and autograd on, PyTorch's CPU attention falls back to a much slower kernel.
    """
    kv_len = attention.shape[1]
    past = kv_len - query_len
    q = torch.arange(query_len)[:, None] + past
    k = torch.arange(kv_len)[None, :]
    allowed = (k <= q)[None] & attention.bool()[:, None, :]
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def forward(model, cache: DynamicCache | None = None, **kwargs):
    """``model(**kwargs)`` with a KV cache, under whichever keyword this transformers version takes.

    Returns ``(output, cache)``. transformers 5 renamed ``past_key_values`` to ``cache`` (input and output).
    """
    key = _cache_kwarg(type(model))
    if cache is not None:
        kwargs[key] = cache
    out = model(**kwargs)
    return out, getattr(out, key, None)


_CACHE_KWARG: dict[type, str] = {}


def _cache_kwarg(cls: type) -> str:
    if cls not in _CACHE_KWARG:
        import inspect

        params = inspect.signature(cls.forward).parameters
        _CACHE_KWARG[cls] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KWARG[cls]
