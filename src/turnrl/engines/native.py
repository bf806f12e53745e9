"""The native engine: multi-turn decoding with KV caches that persist across turns, and continuous batching.

What it does differently from :class:`~turnrl.engines.hf.HFEngine` (the reference):

- **Sequences own a slot of a preallocated KV cache and keep it between turns.** A request names its
  sequence and gives the full prompt; the engine reuses the longest prefix of it that the sequence's
  cache already holds and prefills only the rest. With the ``full`` context strategy the prompt of turn
  ``t+1`` is turn ``t``'s prompt + response + the env's answer, so only the answer's tokens (and the last
  sampled token) are ever computed: the conversation is never prefilled again. With ``per_step`` the
  prompts share the system prompt and few-shot head, which is likewise never recomputed.
- **A prefix store** keeps the KV of a prompt head that fresh sequences share (computed once per weight
  version, copied into each new slot).
- **Continuous batching.** :meth:`agenerate` is a coroutine per request; a driver task runs engine ticks.
  A tick is one forward pass over every running request's next token together with the new prompt tokens
  of the requests admitted now, laid end to end (the matmuls see no padding; only attention groups them
  into rows), so admissions ride along with decoding instead of paying for a pass of their own.
  A request that finishes its turn returns at once, its episode steps its env and comes back while the
  others keep decoding. When slots run out, the least recently used idle sequence is evicted (its cache
  is recomputed if it returns, as vLLM's recompute preemption does).
- **Its own forward pass** for the Llama family (Llama, Mistral, Qwen2: RMSNorm, RoPE, grouped-query
  attention, SwiGLU), on weights copied from the learner's module at :meth:`sync_weights` into fused
  ``qkv`` and ``gate_up`` matrices in the engine's dtype (fp32 or bf16): an in-memory copy, no disk.
  Where PyTorch has oneDNN (x86 and ARM CPU builds), the matrices are also stored pre-packed in oneDNN's
  blocked layout, so no matmul re-lays out its weight on every call (the results are the same numbers;
  ``bench/rollout.py`` measures the gain). Logits are computed only at positions that are sampled from.

Sampling: temperature, top-k, top-p, stop tokens, stop strings, per-request max tokens; each sequence has
its own seeded generator (seeded by the engine seed and the order sequences are opened), so what a
sequence samples does not depend on which other sequences share its batch. Every completion carries the
weight version that produced it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from turnrl.engines.base import Completion, SamplingParams
from turnrl.engines.sampling import sample
from turnrl.models.prefix import bucket_rows, common_prefix_len, round_up

SUPPORTED = ("llama", "mistral", "qwen2")


class UnsupportedModelError(ValueError):
    pass


def machine_threads() -> int:
    """Threads for torch on this machine: the CPUs this process may run on (physical ones on 2-way SMT)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        n = os.cpu_count() or 1
    return max(1, n)


@dataclass
class _Weights:
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


@dataclass
class _Seq:
    key: int
    generator: torch.Generator
    slot: int | None = None
    tokens: list[int] = field(default_factory=list)  # ids whose keys/values are in the slot, in order
    busy: bool = False


@dataclass
class _Request:
    seq: _Seq
    prompt: list[int]
    params: SamplingParams
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    future: asyncio.Future | None = None


class NativeEngine:
    """Engine protocol (``generate``, ``sync_weights``, ``state_dict``) plus sessions (``open``/``agenerate``/``close``).

    Args:
        model: a Hugging Face causal LM of the Llama family (the learner's module; weights are copied from it).
        tokenizer: its tokenizer (end-of-sequence id, stop strings).
        dtype: ``"bf16"`` or ``"fp32"`` for the engine's weights, cache and activations.
        max_slots: sequences whose caches are resident at once (the most rows a decode step has).
        max_len: tokens a sequence may hold (prompt and response).
        seed: seeds every sequence's generator.
        min_shared_prefix: the shortest head worth keeping in the prefix store.
        threads: torch threads (default: this machine's CPUs).
        packed_weights: store the weight matrices pre-packed for oneDNN (ignored where torch has no oneDNN).
        prefill_tokens: rows prefilled per forward pass hold at most this many (padded) new tokens (at least one
            row), so many long prompts admitted at once do not build all their attention scores together.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        dtype: str = "bf16",
        max_slots: int = 64,
        max_len: int = 2048,
        seed: int = 0,
        min_shared_prefix: int = 16,
        threads: int | None = None,
        packed_weights: bool = True,
        prefill_tokens: int = 8192,
    ) -> None:
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
        torch.set_num_threads(threads or machine_threads())
        self.model = model
        self.tokenizer = tokenizer
        self.dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        self.max_slots = max_slots
        self.max_len = max_len
        self.prefill_tokens = prefill_tokens
        self.seed = seed
        self.min_shared_prefix = min_shared_prefix
        self.packed_weights = packed_weights and _onednn_packing_works(self.dtype)
        self.version = 0
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = cfg.rms_norm_eps
        eos = tokenizer.eos_token_id
        self.end_ids: set[int] = {eos} if eos is not None else set()
        self._opened = 0
        self._seqs: OrderedDict[int, _Seq] = OrderedDict()  # open sequences, least recently used first
        self._slot_owner: list[_Seq | None] = [None] * max_slots
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._driver: asyncio.Task | None = None
        self._prefix: tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self.counters = {
            "prefill_tokens": 0, "decode_tokens": 0, "reused_tokens": 0, "evictions": 0, "ticks": 0,
            # time of ticks that prefill (decode rows riding along included) and of decode-only ticks, with the
            # tokens and attended positions of the latter (bench/rollout.py's decode FLOP/s)
            "prefill_s": 0.0, "decode_s": 0.0, "decode_only_passes": 0, "decode_only_tokens": 0, "decode_only_kv": 0,
        }
        self._load_weights()
        self._rope_tables()
        self._cap = 0  # columns per slot in use (the cache grows to the longest sequence, up to max_len)
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._initial_cap = min(256, max_len)
        self._ensure_capacity(self._initial_cap)

    # ---- protocol ---------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Complete each prompt in a sequence of its own (closed afterwards). Order matches input."""
        seqs = [self.open() for _ in prompts]
        try:
            reqs = [self._submit(self._seqs[s], p, params) for s, p in zip(seqs, prompts)]
            while any(r.finish is None for r in reqs):
                self._tick()
            return [self._completion(r) for r in reqs]
        finally:
            for s in seqs:
                self.close(s)

    def sync_weights(self) -> None:
        """Copy the learner's weights in and bump the version. Every cached key/value becomes stale and is dropped."""
        self._load_weights()
        self.version += 1
        self._prefix = None
        for s in self._seqs.values():
            s.tokens = []

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version, "opened": self._opened, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the version and sampling state, and re-read the module's weights (a checkpoint just loaded them)."""
        self._load_weights()
        self._prefix = None
        for s in self._seqs.values():
            s.tokens = []
        self.version = int(state["version"])
        self._opened = int(state.get("opened", 0))
        self.seed = int(state.get("seed", self.seed))

    # ---- sessions -----------------------------------------------------------------------------
    def open(self, sample_key: tuple[int, ...] | None = None) -> int:
        """Open a sequence; returns its handle.

        Its generator is seeded from the engine seed, the weight version and ``sample_key`` (the collector
        passes (task seed, episode index)), so what an episode samples depends on nothing else: not on which
        episodes share its batches, nor on how many sequences evaluation opened before. Without a key, the
        opening order stands in for it.
        """
        handle = self._opened
        self._opened += 1
        key = sample_key if sample_key is not None else ("order", handle)
        digest = hashlib.blake2b(repr((self.seed, self.version, key)).encode(), digest_size=8).digest()
        g = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
        self._seqs[handle] = _Seq(handle, g)
        return handle

    def close(self, key: int) -> None:
        """Free a sequence and its slot. Closing an unknown or closed key does nothing."""
        seq = self._seqs.pop(key, None)
        if seq is None or seq.slot is None:
            return
        hole, seq.slot = seq.slot, None
        self._slot_owner[hole] = None
        if all(o is None for o in self._slot_owner):
            # Nothing resident: shrink back, so every collection starts from the same cache shape (kernel
            # shapes, hence floating-point results, then do not depend on earlier runs) and memory is returned.
            self._k, self._v, self._cap = [], [], 0
            self._ensure_capacity(self._initial_cap)
            return
        last = max((i for i, o in enumerate(self._slot_owner) if o is not None), default=-1)
        if last > hole:  # keep occupied slots contiguous from 0: decode then reads the cache without a gather
            moved = self._slot_owner[last]
            n = len(moved.tokens)
            for K, V in zip(self._k, self._v):
                K[hole, :, :n] = K[last, :, :n]
                V[hole, :, :n] = V[last, :, :n]
            self._slot_owner[hole], self._slot_owner[last], moved.slot = moved, None, hole

    async def agenerate(self, key: int, prompt: list[int], params: SamplingParams) -> Completion:
        """Complete ``prompt`` in sequence ``key``, reusing what its cache holds; other requests run meanwhile."""
        req = self._submit(self._seqs[key], prompt, params)
        req.future = asyncio.get_running_loop().create_future()
        if self._driver is None or self._driver.done():
            self._driver = asyncio.ensure_future(self._drive())
        await req.future
        return self._completion(req)

    async def _drive(self) -> None:
        while self._waiting or self._running:
            try:
                self._tick()
            except BaseException as e:  # fail every request rather than hang their episodes
                for r in self._waiting + self._running:
                    if r.future is not None and not r.future.done():
                        r.future.set_exception(e)
                self._waiting, self._running = [], []
                raise
            await asyncio.sleep(0)  # let finished episodes step their envs and come back

    # ---- scheduling ---------------------------------------------------------------------------
    def _submit(self, seq: _Seq, prompt: list[int], params: SamplingParams) -> _Request:
        if not prompt:
            raise ValueError("every prompt needs at least one token")
        if seq.busy:
            raise RuntimeError(f"sequence {seq.key} already has a request in flight; await it first")
        if len(prompt) + params.max_new_tokens > self.max_len:
            raise ValueError(
                f"prompt of {len(prompt)} tokens + max_new_tokens {params.max_new_tokens} exceeds the engine's "
                f"max_len {self.max_len}; raise max_len or shorten the context"
            )
        seq.busy = True
        self._seqs.move_to_end(seq.key)
        req = _Request(seq, list(prompt), params)
        self._waiting.append(req)
        return req

    def _tick(self) -> None:
        """One engine step: a single forward pass over every running request's next token and the new prompt
        tokens of the requests admitted now (their first chunk, see ``prefill_tokens``), then one sample per row.

        Prefill and decode share the pass because a pass over few tokens costs about as much as reading the
        weights once: the admissions that trickle in while others decode ride along instead of paying for a
        pass of their own.
        """
        self.counters["ticks"] += 1
        t0 = time.perf_counter()
        admitted = self._admit()
        decoding = [r for r in self._running if r.finish is None and r not in admitted]
        rows = [(r, [r.out[-1]], len(r.seq.tokens)) for r in decoding]
        self.counters["decode_tokens"] += len(decoding)
        if admitted:
            chunks = self._prefill_chunks(admitted)
            for chunk in chunks[1:]:  # prompts beyond the first chunk's token budget: passes of their own
                self._forward_rows(chunk)
            self._forward_rows(chunks[0] + rows)
            self.counters["prefill_s"] += time.perf_counter() - t0
        elif rows:
            self.counters["decode_only_passes"] += 1
            self.counters["decode_only_tokens"] += len(rows)
            self.counters["decode_only_kv"] += sum(start + 1 for _, _, start in rows)  # attended positions
            self._forward_rows(rows)
            self.counters["decode_s"] += time.perf_counter() - t0
        self._running = [r for r in self._running if r.finish is None]

    def _admit(self) -> list[_Request]:
        admitted = []
        for req in list(self._waiting):
            if req.seq.slot is None and not self._assign_slot(req.seq):
                break  # no slot: wait for a running request to finish
            self._waiting.remove(req)
            admitted.append(req)
        self._running.extend(admitted)
        return admitted

    def _assign_slot(self, seq: _Seq) -> bool:
        free = next((i for i, o in enumerate(self._slot_owner) if o is None), None)
        if free is None:  # evict the least recently used sequence that is not in flight
            victim = next((s for s in self._seqs.values() if s.slot is not None and not s.busy), None)
            if victim is None:
                return False
            free, victim.slot, victim.tokens = victim.slot, None, []
            self.counters["evictions"] += 1
        self._slot_owner[free] = seq
        seq.slot, seq.tokens = free, []
        return True

    def _finish_row(self, req: _Request, tok: int, lp: float) -> None:
        req.out.append(tok)
        req.logprobs.append(lp)
        p = req.params
        if tok in self.end_ids or tok in p.stop_token_ids or (p.stop_strings and self._hit_stop_string(req.out, p.stop_strings)):
            req.finish = "stop"
        elif len(req.out) >= p.max_new_tokens:
            req.finish = "length"
        if req.finish is not None:
            req.seq.busy = False
            if req.future is not None and not req.future.done():
                req.future.set_result(None)

    def _completion(self, req: _Request) -> Completion:
        return Completion(list(req.out), list(req.logprobs), req.finish or "length", version=self.version)

    def _hit_stop_string(self, toks: list[int], stops: tuple[str, ...]) -> bool:
        tail = self.tokenizer.decode(toks[-8:], skip_special_tokens=False)
        return any(s in tail for s in stops)

    # ---- prefill and decode ---------------------------------------------------------------------
    def _prefill_chunks(self, reqs: list[_Request]) -> list[list[tuple[_Request, list[int], int]]]:
        """Each admitted request's new prompt tokens (reusing what its cache holds), as (request, tokens, start)
        rows in chunks whose padded size (rows x longest row) stays within ``prefill_tokens``."""
        self._maybe_store_prefix(reqs)
        rows = []
        for r in reqs:
            seq = r.seq
            if not seq.tokens and self._prefix is not None:
                self._copy_prefix(seq, r.prompt)
            keep = min(common_prefix_len([seq.tokens, r.prompt]), len(r.prompt) - 1)  # >= 1 new token to sample from
            self.counters["reused_tokens"] += keep
            self.counters["prefill_tokens"] += len(r.prompt) - keep
            seq.tokens = r.prompt[:keep]
            rows.append((r, r.prompt[keep:], keep))
        chunks: list[list] = [[]]
        width = 0
        for row in rows:
            w = max(width, round_up(len(row[1]), 8))
            if chunks[-1] and (len(chunks[-1]) + 1) * w > self.prefill_tokens:
                chunks.append([])
                w = round_up(len(row[1]), 8)
            chunks[-1].append(row)
            width = w
        return chunks

    def _forward_rows(self, rows: list[tuple[_Request, list[int], int]]) -> None:
        """Feed each row's tokens to its request's slot; sample each request's next token from the last one."""
        logits = self._forward([r.seq.slot for r, _, _ in rows], [n for _, n, _ in rows], [s for _, _, s in rows])
        for r, n, _ in rows:
            r.seq.tokens.extend(n)
        self._sample_rows([r for r, _, _ in rows], logits)

    def _sample_rows(self, reqs: list[_Request], logits: torch.Tensor) -> None:
        by_params: dict[SamplingParams, list[int]] = {}
        for i, r in enumerate(reqs):
            by_params.setdefault(r.params, []).append(i)
        for params, rows in by_params.items():
            tok, lp = sample(logits[rows], params, [reqs[i].seq.generator for i in rows])
            for i, t, l in zip(rows, tok.tolist(), lp.tolist()):
                self._finish_row(reqs[i], t, l)

    def _maybe_store_prefix(self, reqs: list[_Request]) -> None:
        """Compute the head that fresh requests share once, when the store does not already cover it."""
        fresh = [r.prompt for r in reqs if not r.seq.tokens]
        if len(fresh) < 2:
            return
        n = common_prefix_len(fresh, limit=min(len(p) for p in fresh) - 1)
        if n < self.min_shared_prefix:
            return
        if self._prefix is not None and common_prefix_len([self._prefix[0], fresh[0]]) >= n:
            return
        head = fresh[0][:n]
        slot = next((i for i, o in enumerate(self._slot_owner) if o is None), None)
        borrowed = None
        if slot is None:  # all slots taken: borrow the first request's slot; it is refilled from the store next
            borrowed = reqs[0].seq
            slot = borrowed.slot
        self._forward([slot], [head], [0], need_logits=False)
        self.counters["prefill_tokens"] += n
        self._prefix = (head, [(k[slot, :, :n].clone(), v[slot, :, :n].clone()) for k, v in zip(self._k, self._v)])
        if borrowed is not None:
            borrowed.tokens = []

    def _copy_prefix(self, seq: _Seq, prompt: list[int]) -> None:
        head, kv = self._prefix
        n = min(common_prefix_len([head, prompt]), len(prompt) - 1)
        if n < self.min_shared_prefix:
            return
        for (k, v), (hk, hv) in zip(zip(self._k, self._v), kv):
            k[seq.slot, :, :n] = hk[:, :n]
            v[seq.slot, :, :n] = hv[:, :n]
        seq.tokens = head[:n]

    # ---- the model ------------------------------------------------------------------------------
    @torch.no_grad()
    def _load_weights(self) -> None:
        m = self.model.model if hasattr(self.model, "model") else self.model
        dt = self.dtype

        def w(t, dtype=dt):
            return None if t is None else t.detach().to(dtype).contiguous()

        layers = []
        for layer in m.layers:
            a, mlp = layer.self_attn, layer.mlp
            bias = None
            if a.q_proj.bias is not None:
                bias = w(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
            layers.append(
                {
                    "in_norm": w(layer.input_layernorm.weight, torch.float32),
                    "qkv": w(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),
                    "qkv_bias": bias,
                    "o": w(a.o_proj.weight),
                    "o_bias": w(a.o_proj.bias),
                    "post_norm": w(layer.post_attention_layernorm.weight, torch.float32),
                    "gate_up": w(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                    "down": w(mlp.down_proj.weight),
                }
            )
        lm_head = w(self.model.get_output_embeddings().weight)
        if self.packed_weights:
            for layer in layers:
                for name in ("qkv", "o", "gate_up", "down"):
                    layer[name] = _pack(layer[name], self.max_slots)
            lm_head = _pack(lm_head, self.max_slots)
        self._w = _Weights(embed=w(m.embed_tokens.weight), lm_head=lm_head, final_norm=w(m.norm.weight, torch.float32), layers=layers)

    @torch.no_grad()
    def _rope_tables(self) -> None:
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
            for i in range(len(self._w.layers)):
                new = torch.zeros(shape, dtype=self.dtype)
                if i < len(cache):
                    new[:, :, : self._cap] = cache[i][:, :, : self._cap]
                    cache[i] = new
                else:
                    cache.append(new)
        self._cap = cap

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
            gate, up = _linear(self._norm(x, layer["post_norm"]), layer["gate_up"]).chunk(2, dim=-1)
            x.add_(_linear(F.silu(gate).mul_(up), layer["down"]))
        return x

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
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
