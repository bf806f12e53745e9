"""The reference engine: batched sampling with a Hugging Face causal LM, in process.

It decodes with a KV cache, computes the prompt prefix that all prompts of a batch share once (see
:mod:`turnrl.models.prefix`), drops finished rows from the batch as it goes, and reports the exact behaviour
logprob of every sampled token. It samples from the learner's own module, so ``sync_weights`` only bumps
the version: no copy, no disk round trip. A LoRA model (:mod:`turnrl.models.lora`) runs its own forward, base plus
adapter as the learner computes it: merging at sync would take a second copy of the adapted weights, or an in-place
merge whose unmerge does not restore the base weights (the KL reference) bit for bit.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from turnrl.engines.base import Completion, SamplingParams
from turnrl.engines.sampling import sample
from turnrl.models.prefix import bucket_rows, common_prefix_len, forward, left_padded, positions_from_mask, prefix_cache


class HFEngine:
    def __init__(
        self,
        model,
        tokenizer,
        *,
        autocast_bf16: bool = False,
        seed: int = 0,
        min_shared_prefix: int = 16,
        max_batch: int = 256,
        prefill_tokens: int = 8192,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.autocast_bf16 = autocast_bf16
        self.min_shared_prefix = min_shared_prefix
        self.max_batch = max_batch
        # Rows prefilled per forward pass: at most this many suffix tokens. Attention over long prompts
        # builds (rows, heads, S, P + S) scores in one pass; row chunks bound that working memory, and
        # their caches are concatenated.
        self.prefill_tokens = prefill_tokens
        self.version = 0
        self.generator = torch.Generator().manual_seed(seed)
        eos = tokenizer.eos_token_id
        self.end_ids: set[int] = {eos} if eos is not None else set()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or 0)

    # ---- protocol -------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        out: list[Completion] = []
        for i in range(0, len(prompts), self.max_batch):
            out.extend(self._generate_batch(prompts[i : i + self.max_batch], params))
        return out

    def sync_weights(self) -> None:
        self.version += 1

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = int(state["version"])
        self.generator.set_state(state["generator"])

    # ---- internals ------------------------------------------------------------------------
    def _autocast(self):
        if self.autocast_bf16:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        was_training = self.model.training
        self.model.eval()
        try:
            with self._autocast():
                return self._decode(prompts, params)
        finally:
            self.model.train(was_training)

    def _decode(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        B = len(prompts)
        stop_ids = self.end_ids | set(params.stop_token_ids)
        # Shared prefix: every row keeps >= 1 token of its own so each has a last position to sample from.
        P = common_prefix_len(prompts, limit=min(len(p) for p in prompts) - 1) if B > 1 else 0
        if P < self.min_shared_prefix:
            P = 0
        # Shapes are bucketed (rows and suffix length rounded up) because CPU kernels are specialised per
        # shape: a new shape costs far more than a few padded rows. Padding rows repeat row 0 and are ignored.
        rows: list[int | None] = list(range(B)) + [None] * (bucket_rows(B) - B)
        ids, mask = left_padded(list(prompts) + [prompts[0]] * (len(rows) - B), P, self.pad_id)
        positions = positions_from_mask(mask)[:, P:]
        logits, cache = self._prefill(prompts[0][:P], ids, mask, positions)
        next_pos = positions[:, -1] + 1

        tokens: list[list[int]] = [[] for _ in range(B)]
        logps: list[list[float]] = [[] for _ in range(B)]
        finish = ["length"] * B
        for step in range(params.max_new_tokens):
            tok, lp = self._sample(logits, params)
            for r, b in enumerate(rows):
                if b is None:
                    continue
                t = int(tok[r])
                tokens[b].append(t)
                logps[b].append(float(lp[r]))
                if t in stop_ids or (params.stop_strings and self._hit_stop_string(tokens[b], params.stop_strings)):
                    finish[b] = "stop"
                    rows[r] = None  # finished: from now on a passenger
            alive = [r for r, b in enumerate(rows) if b is not None]
            if not alive or step == params.max_new_tokens - 1:
                break
            target = bucket_rows(len(alive))
            if target < len(rows):  # shrink to the next bucket; keep passengers only to fill it
                passengers = [r for r, b in enumerate(rows) if b is None][: target - len(alive)]
                keep = sorted(alive + passengers)
                idx = torch.tensor(keep, dtype=torch.long)
                cache.batch_select_indices(idx)
                mask, next_pos, tok = mask[idx], next_pos[idx], tok[idx]
                rows = [rows[r] for r in keep]
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], dim=1)
            outputs, cache = forward(
                self.model, cache, input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None], use_cache=True
            )
            logits = outputs.logits[:, -1, :]
            next_pos = next_pos + 1
        return [Completion(tokens[b], logps[b], finish[b], version=self.version) for b in range(B)]

    def _prefill(self, prefix: list[int], ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor):
        """Run the prompts (shared ``prefix`` + left-padded suffixes ``ids``): last-position logits and the cache.

        Rows go through in chunks of at most ``prefill_tokens`` suffix tokens (at least one row); the
        chunks' caches are concatenated along the batch, so decoding sees one cache either way.
        """
        rows, S = ids.shape
        per = max(1, self.prefill_tokens // S)
        prefix_kv = prefix_cache(self.model, prefix) if prefix else None
        logits, layers = [], []
        for a in range(0, rows, per):
            b = min(rows, a + per)
            cache = None
            if prefix_kv is not None:
                cache = DynamicCache(
                    ddp_cache_data=[(l.keys.expand(b - a, -1, -1, -1), l.values.expand(b - a, -1, -1, -1)) for l in prefix_kv.layers],
                    config=self.model.config,
                )
            out, cache = forward(
                self.model, cache, input_ids=ids[a:b], attention_mask=mask[a:b], position_ids=positions[a:b],
                use_cache=True, logits_to_keep=1,
            )
            logits.append(out.logits[:, -1, :])
            layers.append([(l.keys, l.values) for l in cache.layers])
        if len(layers) == 1:
            return logits[0], cache
        merged = [(torch.cat([c[i][0] for c in layers]), torch.cat([c[i][1] for c in layers])) for i in range(len(layers[0]))]
        return torch.cat(logits), DynamicCache(ddp_cache_data=merged, config=self.model.config)

    def _sample(self, logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        return sample(logits, params, self.generator)

    def _hit_stop_string(self, toks: list[int], stops: tuple[str, ...]) -> bool:
        tail = self.tokenizer.decode(toks[-8:], skip_special_tokens=False)
        return any(s in tail for s in stops)
