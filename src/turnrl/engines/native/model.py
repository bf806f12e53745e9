"""The native engine's model compute: the Llama family's forward pass over a slotted KV cache, on CPU.

The Llama family (Llama, Mistral, Qwen2: RMSNorm, RoPE, grouped-query attention, SwiGLU, with or without biases on
the attention and MLP projections) runs on weights copied from the learner's module into fused ``qkv`` and
``gate_up`` matrices in the engine's dtype (fp32 or bf16): an in-memory copy, no disk. A model with any parameter
this forward pass does not use (a variant's extra norm, say) is refused rather than run without it. Where PyTorch has oneDNN (x86 and ARM CPU builds), the matrices are also stored
pre-packed in oneDNN's blocked layout, so no matmul re-lays out its weight on every call (the results are the
same numbers; ``bench/rollout.py`` measures the gain). The residual stream stays fp32, as under the learner's
autocast. Logits are computed only at positions that are sampled from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from turnrl.models.prefix import bucket_rows, round_up

SUPPORTED = ("llama", "mistral", "qwen2")  # config.model_type values this forward pass runs


class UnsupportedModelError(ValueError):
    """The model is not of the family the native engine runs; the HF engine runs it."""


def machine_threads() -> int:
    """Threads for torch on this machine: the CPUs this process may run on, or ``$OMP_NUM_THREADS`` when it is set to
    fewer (torch's own convention: a user who pins two runs to one thread each sets it and expects it kept)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        n = os.cpu_count() or 1
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        n = min(n, int(omp))
    return max(1, n)


@dataclass
class _Weights:
    """The engine's copy of the weights: ``layers[i]`` holds fused ``qkv`` and ``gate_up`` matrices (maybe packed)."""

    embed: torch.Tensor
    lm_head: torch.Tensor
    final_norm: torch.Tensor
    layers: list[dict[str, torch.Tensor | None]]


@dataclass
class _AttentionGroup:
    """Rows of one forward pass that attend together: ``q_index`` (rows, T) picks each row's queries from the
    flat tokens (padding picks token 0), ``mask`` (rows, 1, heads per key/value head * T, kv_len) is
    additive over the first kv_len cache columns, ``kv_slots`` the slots to gather keys and values from
    (None: slots ``slot0 .. slot0 + rows``, read in place); ``src``/``dst`` map the real entries of the
    (rows * T) output back to flat token indices."""

    q_index: torch.Tensor
    mask: torch.Tensor
    kv_slots: torch.Tensor | None
    slot0: int
    src: torch.Tensor
    dst: torch.Tensor


class LlamaForward:
    """The model half of :class:`~turnrl.engines.native.NativeEngine`: weights, RoPE tables, the KV cache, the forward.

    The cache holds ``max_slots`` slots of up to ``max_len`` tokens per layer, grown on demand; which sequence owns
    a slot is the engine's business. Raises :class:`UnsupportedModelError` for a model outside the Llama family or
    with a parameter the forward pass does not use (before touching the torch thread count), and ``ValueError`` for
    a ``dtype`` other than ``"bf16"`` / ``"fp32"``.
    """

    def __init__(self, model, *, dtype: str, max_slots: int, max_len: int, threads: int | None, packed_weights: bool) -> None:
        cfg = model.config
        if cfg.model_type not in SUPPORTED:
            raise UnsupportedModelError(
                f"the native engine runs the Llama family ({', '.join(SUPPORTED)}), not '{cfg.model_type}'; "
                "use engine=hf for this model"
            )
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"the native engine needs SiLU MLPs, this model uses {cfg.hidden_act}; use engine=hf")
        if dtype not in ("bf16", "fp32"):
            raise ValueError(f"dtype must be 'bf16' or 'fp32', got {dtype!r}")
        self.model = model
        self.dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        self.max_slots = max_slots
        self.max_len = max_len
        self.packed_weights = packed_weights and _onednn_packing_works(self.dtype)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = cfg.rms_norm_eps
        self.n_layers = cfg.num_hidden_layers
        self._refuse_unread(self._load_weights())
        torch.set_num_threads(threads or machine_threads())
        self._rope_tables()
        self._k: list[torch.Tensor] = []  # per layer: (max_slots, n_kv, columns + 1 scratch, head_dim)
        self._v: list[torch.Tensor] = []
        self._cap = 0  # columns per slot in use (the cache grows to the longest sequence, up to max_len)
        self._initial_cap = min(256, max_len)
        self._reset_cache()

    @torch.no_grad()
    def _load_weights(self) -> set[int]:
        """Copy the module's weights in: fused, cast to the engine dtype (norms stay fp32), packed where oneDNN runs.

        Returns the ids of the module's parameters it read (:meth:`_refuse_unread` checks that nothing is left out).
        """
        m = self.model.model if hasattr(self.model, "model") else self.model
        read: set[int] = set()

        def w(*parts: torch.Tensor | None, dtype: torch.dtype = self.dtype) -> torch.Tensor | None:
            """``parts`` concatenated (a fused matrix or bias), as the engine stores it; None if the module has none."""
            if parts[0] is None:
                return None
            read.update(id(p) for p in parts)
            return torch.cat(parts).detach().to(dtype).contiguous()

        layers = []
        for layer in m.layers:
            a, mlp = layer.self_attn, layer.mlp
            layers.append(
                {
                    "in_norm": w(layer.input_layernorm.weight, dtype=torch.float32),
                    "qkv": w(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
                    "qkv_bias": w(a.q_proj.bias, a.k_proj.bias, a.v_proj.bias),
                    "o": w(a.o_proj.weight),
                    "o_bias": w(a.o_proj.bias),
                    "post_norm": w(layer.post_attention_layernorm.weight, dtype=torch.float32),
                    "gate_up": w(mlp.gate_proj.weight, mlp.up_proj.weight),
                    "gate_up_bias": w(mlp.gate_proj.bias, mlp.up_proj.bias),  # Llama's mlp_bias=True
                    "down": w(mlp.down_proj.weight),
                    "down_bias": w(mlp.down_proj.bias),
                }
            )
        lm_head = w(self.model.get_output_embeddings().weight)
        if self.packed_weights:
            for layer in layers:
                for name in ("qkv", "o", "gate_up", "down"):
                    layer[name] = _pack(layer[name], self.max_slots)
            lm_head = _pack(lm_head, self.max_slots)
        self._w = _Weights(embed=w(m.embed_tokens.weight), lm_head=lm_head,
                           final_norm=w(m.norm.weight, dtype=torch.float32), layers=layers)
        return read

    def _refuse_unread(self, read: set[int]) -> None:
        """Raise :class:`UnsupportedModelError` if the module has a parameter the forward pass does not compute with
        (a norm or bias of a variant of the family): ignoring it would sample from another distribution."""
        unread = [name for name, p in self.model.named_parameters() if id(p) not in read]
        if unread:
            raise UnsupportedModelError(
                f"the native engine's forward pass does not use {len(unread)} of this model's parameters "
                f"({', '.join(unread[:3])}{', ...' if len(unread) > 3 else ''}); use engine=hf for this model"
            )

    @torch.no_grad()
    def _rope_tables(self) -> None:
        """cos and signed sin for every position, from the model's own rotary module."""
        m = self.model.model if hasattr(self.model, "model") else self.model
        pos = torch.arange(self.max_len + 1)[None]  # every column, the scratch one included
        cos, sin = m.rotary_emb(torch.zeros(1, dtype=torch.float32), pos)
        sign = torch.cat([-torch.ones(self.head_dim // 2), torch.ones(self.head_dim // 2)])
        self._cos, self._sin_signed = cos[0], sin[0] * sign  # fp32, (max_len + 1, head_dim)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm in fp32 (as the reference does), cast to the engine dtype for the matmul that follows."""
        # mean(x^2) as |x|^2 / H: one reduction instead of a squared copy and its mean (within fp32 rounding)
        r = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(self.eps).rsqrt_()
        return (x * r).mul_(weight).to(self.dtype)

    def _ensure_capacity(self, need: int) -> None:
        """Grow every slot to hold ``need`` tokens (plus one scratch column that padded rows write to)."""
        if need <= self._cap:
            return
        if need > self.max_len:
            raise ValueError(f"a sequence needs {need} tokens but the engine's max_len is {self.max_len}; raise max_len")
        cap = min(self.max_len, max(need, 2 * self._cap, 64))
        cap = min(self.max_len, -(-cap // 64) * 64)
        shape = (self.max_slots, self.n_kv, cap + 1, self.head_dim)
        for cache in (self._k, self._v):
            for i in range(self.n_layers):
                new = torch.zeros(shape, dtype=self.dtype)
                if i < len(cache):
                    new[:, :, : self._cap] = cache[i][:, :, : self._cap]
                    cache[i] = new
                else:
                    cache.append(new)
        self._cap = cap

    def _reset_cache(self) -> None:
        """Shrink every slot back to the initial size (its contents are dropped).

        Every collection then starts from the same cache shape (kernel shapes, hence floating-point results, do not
        depend on earlier runs) and memory is returned.
        """
        self._k, self._v, self._cap = [], [], 0
        self._ensure_capacity(self._initial_cap)

    def release(self) -> None:
        """Drop the weight copy and the KV cache until :meth:`_load_weights` reads the weights in again.

        For the learner's update in a synchronous run, which then has their memory: the default model's copy is
        0.65 GB in fp32, its cache 0.19 GB.
        """
        self._w = None
        self._k, self._v, self._cap = [], [], 0

    def _move_slot(self, src: int, dst: int, n: int) -> None:
        """Copy the first ``n`` cached positions of slot ``src`` to slot ``dst``, in every layer."""
        for K, V in zip(self._k, self._v):
            K[dst, :, :n] = K[src, :, :n]
            V[dst, :, :n] = V[src, :, :n]

    def _read_slot(self, slot: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A copy of the first ``n`` cached keys and values of ``slot``, per layer. Shape: (n_kv, n, head_dim) each."""
        return [(k[slot, :, :n].clone(), v[slot, :, :n].clone()) for k, v in zip(self._k, self._v)]

    def _write_slot(self, slot: int, kv: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> None:
        """Write the first ``n`` positions of ``kv`` (as from :meth:`_read_slot`) into ``slot``."""
        for (k, v), (hk, hv) in zip(zip(self._k, self._v), kv):
            k[slot, :, :n] = hk[:, :n]
            v[slot, :, :n] = hv[:, :n]

    @torch.no_grad()
    def _forward(self, slots: list[int], news: list[list[int]], starts: list[int], need_logits: bool = True) -> torch.Tensor | None:
        """Run ``news[b]`` at positions ``starts[b]...`` of slot ``slots[b]``; write their keys/values there.

        The tokens of all rows are laid end to end (``N`` of them, rounded up to a token bucket so kernel shapes
        repeat; padding tokens write to the scratch column), so the matmuls see no padding; only attention
        regroups them into rows (:class:`_AttentionGroup`). Returns the logits at each row's last new token.
        Shape: (rows, vocab).
        """
        lens = [len(n) for n in news]
        ends = [s + n for s, n in zip(starts, lens)]
        self._ensure_capacity(max(ends))
        n_real = sum(lens)
        N = _bucket_tokens(n_real)
        ids = torch.zeros(N, dtype=torch.long)
        ids[:n_real] = torch.tensor([t for n in news for t in n], dtype=torch.long)
        pos = torch.full((N,), self._cap, dtype=torch.long)  # padding -> the scratch column
        pos[:n_real] = torch.cat([torch.arange(s, e) for s, e in zip(starts, ends)])
        slot_of = torch.zeros(N, dtype=torch.long)
        slot_of[:n_real] = torch.repeat_interleave(torch.tensor(slots), torch.tensor(lens))
        first = [0]
        for n in lens[:-1]:
            first.append(first[-1] + n)
        groups = []
        for decode in (True, False):  # one-token rows (decode) and longer ones (prefill) attend separately
            rows = [b for b, n in enumerate(lens) if (n == 1) == decode]
            if rows:
                groups.append(self._group([slots[b] for b in rows], [first[b] for b in rows], [lens[b] for b in rows],
                                          [starts[b] for b in rows], range_ok=decode))
        x = self._layers(ids, pos, slot_of, groups)
        if not need_logits:
            return None
        last = torch.tensor([f + n - 1 for f, n in zip(first, lens)])  # only these positions reach the LM head
        return self._logits(x[last])

    def _group(self, slots: list[int], firsts: list[int], lens: list[int], starts: list[int], range_ok: bool) -> _AttentionGroup:
        """Attention rows for tokens ``firsts[b] .. firsts[b] + lens[b]`` of the flat batch, in slot ``slots[b]``.

        Rows are padded to a common length (a multiple of 8). Keys and values are read from the cache in
        place over slots ``0..n`` when the rows fill most of that range (decode: occupied slots are kept
        contiguous from 0; idle slots ride along as dummy queries) or are consecutive slots, else gathered.
        """
        T = round_up(max(lens), 8) if max(lens) > 1 else 1
        kv_len = min(self._cap + 1, round_up(max(s + n for s, n in zip(starts, lens)), 32))  # only the columns in use
        n_range = min(self.max_slots, bucket_rows(max(slots) + 1))
        if range_ok and 2 * len(slots) >= n_range:  # row b of the group is slot b
            row_of, B, kv_slots, slot0 = slots, n_range, None, 0
        elif slots == list(range(slots[0], slots[0] + len(slots))):  # consecutive slots: in place as well
            row_of, B, kv_slots, slot0 = list(range(len(slots))), len(slots), None, slots[0]
        else:
            row_of, B, kv_slots, slot0 = list(range(len(slots))), len(slots), torch.tensor(slots), 0
        q_index = torch.zeros((B, T), dtype=torch.long)
        q_pos = torch.full((B, T), self._cap, dtype=torch.long)  # dummy queries see every column: no empty softmax
        src, dst = [], []
        for row, f, n, s in zip(row_of, firsts, lens, starts):
            q_index[row, :n] = torch.arange(f, f + n)
            q_pos[row, :n] = torch.arange(s, s + n)
            src.extend(range(row * T, row * T + n))
            dst.extend(range(f, f + n))
        allowed = torch.arange(kv_len)[None, None, :] <= q_pos[:, :, None]
        mask = torch.zeros((B, 1, T, kv_len), dtype=self.dtype).masked_fill(~allowed[:, None], torch.finfo(self.dtype).min)
        mask = mask.repeat(1, 1, self.n_heads // self.n_kv, 1)  # one copy per query head of a key/value group
        return _AttentionGroup(q_index, mask, kv_slots, slot0, torch.tensor(src), torch.tensor(dst))

    def _layers(self, ids: torch.Tensor, pos: torch.Tensor, slot_of: torch.Tensor, groups: list[_AttentionGroup]) -> torch.Tensor:
        """The decoder stack over the flat tokens ``ids`` at positions ``pos`` of slots ``slot_of`` (all (N,)).

        Each layer writes its keys/values for these tokens to ``(slot_of, pos)`` of its cache, then each group
        attends over its rows' cache columns. Returns the final hidden states, (N, hidden).
        """
        N = ids.shape[0]
        nh, nkv, hd = self.n_heads, self.n_kv, self.head_dim
        rep = nh // nkv
        cos, sin = self._cos[pos][:, None], self._sin_signed[pos][:, None]  # (N, 1, hd)
        x = self._w.embed[ids].float()  # the residual stream stays fp32, as under the learner's autocast. (N, H)
        att = torch.zeros((N, nh * hd), dtype=self.dtype)  # every layer rewrites the real tokens' rows; padding stays 0
        for layer, K, V in zip(self._w.layers, self._k, self._v):
            qkv = _linear(self._norm(x, layer["in_norm"]), layer["qkv"], layer["qkv_bias"])
            qk, v = qkv[:, : (nh + nkv) * hd].view(N, nh + nkv, hd), qkv[:, (nh + nkv) * hd :].view(N, nkv, hd)
            # RoPE on queries and keys at once; roll(half) * signed sin == rotate_half * sin, exactly. In-place
            # steps here and below: on large passes an extra full-size temporary costs about as much as a matmul.
            qk = (qk * cos).addcmul_(torch.roll(qk, hd // 2, -1), sin).to(self.dtype)
            q = qk[:, :nh]
            K[slot_of, :, pos] = qk[:, nh:]
            V[slot_of, :, pos] = v
            for g in groups:
                B, T = g.q_index.shape
                cols = g.mask.shape[-1]
                if g.kv_slots is None:
                    keys, vals = K[g.slot0 : g.slot0 + B, :, :cols], V[g.slot0 : g.slot0 + B, :, :cols]
                else:  # gather only the columns in use
                    keys, vals = K[:, :, :cols].index_select(0, g.kv_slots), V[:, :, :cols].index_select(0, g.kv_slots)
                # the query heads sharing a key/value head become one longer query: each key is read once
                qg = q[g.q_index].view(B, T, nkv, rep, hd).permute(0, 2, 3, 1, 4).reshape(B, nkv, rep * T, hd)
                o = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=g.mask)
                att[g.dst] = o.view(B, nkv, rep, T, hd).permute(0, 3, 1, 2, 4).reshape(B * T, nh * hd)[g.src]
            x.add_(_linear(att, layer["o"], layer["o_bias"]))
            gate, up = _linear(self._norm(x, layer["post_norm"]), layer["gate_up"], layer["gate_up_bias"]).chunk(2, dim=-1)
            x.add_(_linear(F.silu(gate).mul_(up), layer["down"], layer["down_bias"]))
        return x

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head, in fp32. Shape: (rows, hidden) -> (rows, vocab)."""
        return _linear(self._norm(hidden, self._w.final_norm), self._w.lm_head).float()


def _bucket_tokens(n: int) -> int:
    """Tokens per forward pass rounded up (to 8 up to 64, 32 up to 1024, then 128): few distinct kernel shapes."""
    return round_up(n, 8 if n <= 64 else 32 if n <= 1024 else 128)


def _pack(weight: torch.Tensor, rows_hint: int) -> torch.Tensor:
    """``weight`` (out, in) re-laid out once in oneDNN's blocked format, for :func:`_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` on a plain weight, oneDNN's linear on a packed one (same result, no per-call re-layout)."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _onednn_packing_works(dtype: torch.dtype) -> bool:
    """Whether this torch build can pack and run a linear in ``dtype`` through oneDNN (and agrees with F.linear)."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    try:
        w, x = torch.randn(24, 16).to(dtype), torch.randn(3, 16).to(dtype)
        return bool(torch.allclose(_linear(x, _pack(w, 4)).float(), F.linear(x, w).float(), atol=1e-2, rtol=1e-2))
    except (RuntimeError, NotImplementedError):  # e.g. a CPU without bf16 support in oneDNN
        return False
