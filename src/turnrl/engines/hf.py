"""The reference engine: batched sampling with a Hugging Face causal LM, in process.

It decodes with a KV cache, computes the prompt prefix that all prompts of a batch share once (see
:mod:`turnrl.prefix`), drops finished rows from the batch as it goes, and reports the exact behaviour
logprob of every sampled token. It samples from the learner's own module, so ``sync_weights`` only bumps
the version: no copy, no disk round trip.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from turnrl.engines.base import Completion, SamplingParams
from turnrl.engines.sampling import sample
from turnrl.prefix import bucket_rows, round_up, common_prefix_len, forward, positions_from_mask, prefix_cache


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
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.autocast_bf16 = autocast_bf16
        self.min_shared_prefix = min_shared_prefix
        self.max_batch = max_batch
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
        suffixes = [p[P:] for p in prompts] + [prompts[0][P:]] * (len(rows) - B)
        S = round_up(max(len(s) for s in suffixes), 8)
        cache = prefix_cache(self.model, prompts[0][:P], len(rows)) if P else None
        ids = torch.full((len(rows), S), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), P + S), dtype=torch.long)
        mask[:, :P] = 1
        for b, s in enumerate(suffixes):  # left-pad each suffix against the shared prefix
            ids[b, S - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[b, P + S - len(s) :] = 1
        positions = positions_from_mask(mask)[:, P:]
        outputs, cache = forward(
            self.model, cache, input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        logits = outputs.logits[:, -1, :]
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

    def _sample(self, logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        return sample(logits, params, self.generator)

    def _hit_stop_string(self, toks: list[int], stops: tuple[str, ...]) -> bool:
        tail = self.tokenizer.decode(toks[-8:], skip_special_tokens=False)
        return any(s in tail for s in stops)
