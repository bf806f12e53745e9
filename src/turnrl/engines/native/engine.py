"""The native engine: sessions whose KV caches persist across turns, a prefix store, continuous batching.

What it does differently from :class:`~turnrl.engines.hf.HFEngine` (the reference):

- **Sequences own a slot of a preallocated KV cache and keep it between turns.** A request names its
  sequence and gives the full prompt; the engine reuses the longest prefix of it that the sequence's
  cache already holds and prefills only the rest. With the ``full`` context strategy the prompt of turn
  ``t+1`` is turn ``t``'s prompt + response + the env's answer, so only the answer's tokens (and the last
  sampled token) are ever computed: the conversation is never prefilled again. With ``per_step`` the
  prompts share the system prompt and few-shot head, which is likewise never recomputed.
- **A prefix store** keeps the KV of a prompt head that fresh sequences share, copied into each new slot. It keeps
  the last few heads (``max_heads``) until the weights change, so calls that alternate between prompt families (the
  roles of a multi-agent env, each with its own system prompt and examples) compute each head once per weight
  version, not once per call. A head is reused only for exactly the head a fresh engine would compute (the common
  prefix of the call's fresh prompts), so what a call samples does not depend on the calls before it.
- **Continuous batching.** :meth:`agenerate` is a coroutine per request; a driver task runs engine ticks.
  A tick is one forward pass over every running request's next token together with the new prompt tokens
  of the requests admitted now, laid end to end (the matmuls see no padding; only attention groups them
  into rows), so admissions ride along with decoding instead of paying for a pass of their own.
  A request that finishes its turn returns at once, its episode steps its env and comes back while the
  others keep decoding. Requests are served first come, first served. When slots run out, a request takes the
  slot of the least recently used sequence not running a request (idle, or queued behind it); that sequence's
  cache is recomputed when it runs again, as vLLM's recompute preemption does.
- **Its own forward pass** for the Llama family, in :mod:`turnrl.engines.native.model`.

Sampling: temperature, top-k, top-p, stop tokens, stop strings, per-request max tokens; each sequence has
its own seeded generator (seeded by the engine seed, the weight version and the key it was opened with), so
what a sequence samples does not depend on which other sequences share its batch. Every completion carries the
weight version that produced it.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from turnrl.engines.base import Completion, SamplingParams
from turnrl.engines.native.model import LlamaForward
from turnrl.engines.sampling import sample
from turnrl.models.lora import merged_view
from turnrl.models.prefix import common_prefix_len, round_up


@dataclass
class _Seq:
    """An open sequence: its generator, the cache slot it holds (None when evicted or never admitted), what is in it."""

    key: int
    generator: torch.Generator
    slot: int | None = None
    tokens: list[int] = field(default_factory=list)  # ids whose keys/values are in the slot, in order
    busy: bool = False


@dataclass
class _Request:
    """One ``generate``/``agenerate`` call in flight: its sampled tokens so far and how it finished."""

    seq: _Seq
    prompt: list[int]
    params: SamplingParams
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None
    future: asyncio.Future | None = None


class NativeEngine(LlamaForward):
    """Engine protocol (``generate``, ``sync_weights``, ``state_dict``) plus sessions (``open``/``agenerate``/``close``).

    A :class:`~turnrl.engines.native.model.LlamaForward` (the model compute and its KV cache) with the sequences,
    slots and scheduling on top. Raises :class:`~turnrl.engines.native.model.UnsupportedModelError` for a model
    outside the Llama family.

    Args:
        model: a Hugging Face causal LM of the Llama family (the learner's module; weights are copied from it). With
            LoRA adapters, each adapted layer is read merged, ``W + s B A``, one layer at a time
            (:func:`~turnrl.models.lora.merged_view`): the engine samples from base + adapter at one matmul per layer.
        tokenizer: its tokenizer (end-of-sequence id, stop strings).
        dtype: ``"bf16"`` or ``"fp32"`` for the engine's weights, cache and activations.
        max_slots: sequences whose caches are resident at once (the most rows a decode step has).
        max_len: tokens a sequence may hold (prompt and response).
        seed: seeds every sequence's generator.
        min_shared_prefix: the shortest head worth keeping in the prefix store.
        max_heads: heads the prefix store keeps at once (least recently used dropped first).
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
        max_heads: int = 4,
        threads: int | None = None,
        packed_weights: bool = True,
        prefill_tokens: int = 8192,
    ) -> None:
        super().__init__(merged_view(model), dtype=dtype, max_slots=max_slots, max_len=max_len, threads=threads,
                         packed_weights=packed_weights)
        self.tokenizer = tokenizer
        self.prefill_tokens = prefill_tokens
        self.seed = seed
        self.min_shared_prefix = min_shared_prefix
        self.max_heads = max_heads
        self.version = 0
        eos = tokenizer.eos_token_id
        self.end_ids: set[int] = {eos} if eos is not None else set()
        self._opened = 0
        self._seqs: OrderedDict[int, _Seq] = OrderedDict()  # open sequences, least recently used first
        self._slot_owner: list[_Seq | None] = [None] * max_slots
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._driver: asyncio.Task | None = None
        self._prefix: tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]] | None = None  # the head in use
        self._heads: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()  # LRU
        self.counters = {
            "prefill_tokens": 0, "decode_tokens": 0, "reused_tokens": 0, "evictions": 0, "ticks": 0,
            # time of ticks that prefill (decode rows riding along included) and of decode-only ticks, with the
            # tokens and attended positions of the latter (bench/rollout.py's decode FLOP/s)
            "prefill_s": 0.0, "decode_s": 0.0, "decode_only_passes": 0, "decode_only_tokens": 0, "decode_only_kv": 0,
        }

    # ---- protocol ---------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Complete each prompt in a sequence of its own (closed afterwards). Order matches input."""
        self._require_weights()
        seqs = [self.open() for _ in prompts]
        try:
            reqs = [self._submit(self._seqs[s], p, params) for s, p in zip(seqs, prompts)]
            while any(r.finish is None for r in reqs):
                self._tick()
            return [self._completion(r) for r in reqs]
        finally:
            for s in seqs:
                self.close(s)

    def _require_weights(self) -> None:
        """Raise before anything is queued when :meth:`release_weights` freed the weights and no sync read them in."""
        if self._w is None:
            raise RuntimeError("the native engine's weights were released for the learner's update (release_weights); "
                               "call sync_weights() before generating")

    def sync_weights(self) -> None:
        """Copy the learner's weights in and bump the version. Every cached key/value becomes stale and is dropped."""
        self._reload_weights()
        self.version += 1

    def release_weights(self) -> None:
        """Free the weight copy and every cached key/value until the next :meth:`sync_weights` (or
        :meth:`load_state_dict`): a synchronous run's loop calls this before the learner's update, which then has that
        memory (the rollout engines of verl and OpenRLHF sleep the same way). Generating before then raises."""
        self.release()
        self._drop_cached_keys()

    def state_dict(self) -> dict[str, Any]:
        """The version and what seeds the sequences' generators (the engine seed, sequences opened so far)."""
        return {"version": self.version, "opened": self._opened, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the version and sampling state, and re-read the module's weights (a checkpoint just loaded them)."""
        self._reload_weights()
        self.version = int(state["version"])
        self._opened = int(state.get("opened", 0))
        self.seed = int(state.get("seed", self.seed))

    def _reload_weights(self) -> None:
        """Copy the module's weights in again (LoRA adapters merged in as they are read) and drop every cached
        key/value (the prefix store's too): all stale."""
        self._load_weights()
        if not self._k:  # released (release_weights): the cache starts at the shape every collection starts from
            self._reset_cache()
        self._drop_cached_keys()

    def _drop_cached_keys(self) -> None:
        """Forget every cached key/value: the prefix heads, and what each open sequence has in its slot."""
        self._prefix = None
        self._heads.clear()
        for s in self._seqs.values():
            s.tokens = []

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
        if all(o is None for o in self._slot_owner):  # nothing resident: start the next collection afresh
            self._reset_cache()  # the head in use goes with it (the stored heads stay: a copy grows the cache first)
            self._prefix = None
            return
        last = max((i for i, o in enumerate(self._slot_owner) if o is not None), default=-1)
        if last > hole:  # keep occupied slots contiguous from 0: decode then reads the cache without a gather
            moved = self._slot_owner[last]
            n = len(moved.tokens)
            self._move_slot(last, hole, n)
            self._slot_owner[hole], self._slot_owner[last], moved.slot = moved, None, hole

    async def agenerate(self, key: int, prompt: list[int], params: SamplingParams) -> Completion:
        """Complete ``prompt`` in sequence ``key``, reusing what its cache holds; other requests run meanwhile."""
        self._require_weights()
        req = self._submit(self._seqs[key], prompt, params)
        req.future = asyncio.get_running_loop().create_future()
        if self._driver is None or self._driver.done():
            self._driver = asyncio.ensure_future(self._drive())
        await req.future
        return self._completion(req)

    async def _drive(self) -> None:
        """The driver task: ticks while any request waits or runs; a failing tick fails every request in flight."""
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
        """Queue a request on ``seq`` (marked busy, most recently used); admitted at the next tick with a slot."""
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
        """Move waiting requests to running, first come first served; returns the ones admitted.

        A request whose sequence holds a slot is admitted at once. One without a slot takes a free slot or that of
        the least recently used sequence not running a request (see :meth:`_assign_slot`), so it waits only while
        every slot runs a request, each of which ends within its ``max_new_tokens``: no request waits forever,
        however many sessions share the slots.
        """
        admitted = []
        for req in list(self._waiting):
            if req.seq.slot is None and not self._assign_slot(req.seq):
                continue  # every slot runs a request; the requests behind it whose sequences hold a slot still run
            self._waiting.remove(req)
            self._running.append(req)
            admitted.append(req)
        return admitted

    def _assign_slot(self, seq: _Seq) -> bool:
        """Give ``seq`` a free slot, else evict the least recently used sequence that is not running a request: an
        idle one, or one whose request is queued behind ``seq``'s (its cache is recomputed when its turn comes, as
        vLLM's recompute preemption does). False: every slot runs a request."""
        free = next((i for i, o in enumerate(self._slot_owner) if o is None), None)
        if free is None:
            running = {r.seq.key for r in self._running}
            victim = next((s for s in self._seqs.values() if s.slot is not None and s.key not in running), None)
            if victim is None:
                return False
            free, victim.slot, victim.tokens = victim.slot, None, []
            self.counters["evictions"] += 1
        self._slot_owner[free] = seq
        seq.slot, seq.tokens = free, []
        return True

    def _finish_row(self, req: _Request, tok: int, lp: float) -> None:
        """Append a sampled token; end the request on a stop token or string, or at its token limit."""
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
        """The finished request as the protocol's record, stamped with the current weight version."""
        return Completion(list(req.out), list(req.logprobs), req.finish or "length", version=self.version)

    def _hit_stop_string(self, toks: list[int], stops: tuple[str, ...]) -> bool:
        """Whether the decoded tail of ``toks`` (its last 8 tokens) contains a stop string."""
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
        """Sample one token per request from its row of ``logits`` (rows sharing sampling params together)."""
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
        stored = self._heads.get(tuple(head))
        if stored is not None:  # computed by an earlier call at these weights, as this call would compute it
            self._heads.move_to_end(tuple(head))
            self._prefix = (head, stored)
            return
        slot = next((i for i, o in enumerate(self._slot_owner) if o is None), None)
        borrowed = None
        if slot is None:  # all slots taken: borrow a fresh request's slot; it is refilled from the store next
            borrowed = next(r.seq for r in reqs if not r.seq.tokens)
            slot = borrowed.slot
        self._forward([slot], [head], [0], need_logits=False)
        self.counters["prefill_tokens"] += n
        self._prefix = (head, self._read_slot(slot, n))
        self._heads[tuple(head)] = self._prefix[1]
        while len(self._heads) > self.max_heads:
            self._heads.popitem(last=False)
        if borrowed is not None:
            borrowed.tokens = []

    def _copy_prefix(self, seq: _Seq, prompt: list[int]) -> None:
        """Fill a fresh sequence's slot with the part of the stored head its prompt shares (if long enough)."""
        head, kv = self._prefix
        n = min(common_prefix_len([head, prompt]), len(prompt) - 1)
        if n < self.min_shared_prefix:
            return
        self._ensure_capacity(n)  # a head stored before the cache was last reset may be longer than it is now
        self._write_slot(seq.slot, kv, n)
        seq.tokens = head[:n]

