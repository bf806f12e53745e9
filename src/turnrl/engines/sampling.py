"""Token sampling shared by the in-process engines, with the exact behaviour logprob of each draw.

The logprob reported for a sampled token is ``log_softmax(logits / temperature)`` at that token (greedy:
``log_softmax(logits)``). Top-k / top-p only restrict which tokens can be drawn; they do not renormalise
the reported logprob, because the learner recomputes ``log_softmax(logits / temperature)`` and the PPO
ratio must compare like with like.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from turnrl.engines.base import SamplingParams


def sample(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | Sequence[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return ``(tokens, logprobs)``, each of shape (batch,).

    ``generator`` is one generator for the whole batch, or one per row (so a row's draws do not depend
    on which other rows share its batch: the native engine schedules rows dynamically).
    Shape: logits (batch, vocab).
    """
    logits = logits.float()
    if params.greedy:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logits.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits if params.temperature == 1.0 else logits / params.temperature, dim=-1)
    filtered = logp
    if params.top_k > 0:
        kth = torch.topk(filtered, min(params.top_k, filtered.shape[-1]), dim=-1).values[:, -1:]
        filtered = filtered.masked_fill(filtered < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_lp, order = torch.sort(filtered, descending=True, dim=-1)
        cum = sorted_lp.exp().cumsum(-1)
        drop_sorted = (cum - sorted_lp.exp()) >= params.top_p  # keep the smallest set reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        filtered = filtered.masked_fill(drop, float("-inf"))
    probs = filtered.exp()  # unnormalised after filtering; the draws below normalise by the total
    if isinstance(generator, torch.Generator):
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    else:
        u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generator])
        tok = _inverse_cdf(probs, u)
        # A zero-probability token can only be hit on a boundary of rounding; step back to the last allowed one.
        bad = probs.gather(-1, tok[:, None]).squeeze(-1) == 0
        if bad.any():
            tok = torch.where(bad, probs.argmax(-1), tok)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor, block: int = 256) -> torch.Tensor:
    """The token whose cumulative mass first exceeds ``u`` times the row's total: one uniform per row.

    In two levels: which block of ``block`` tokens holds the draw (from the blocks' sums, accumulated in
    float64), then where inside that block (a float64 cumsum of that block only). It picks what a full
    float64 cumsum picks up to the float32 rounding of the block sums (~1e-7 relative), at a fraction of the
    cost.
    Shapes: probs (rows, vocab), u (rows,); returns (rows,).
    """
    rows, vocab = probs.shape
    pad = -vocab % block
    p = torch.nn.functional.pad(probs, (0, pad)) if pad else probs
    sums = p.view(rows, -1, block).sum(-1).double()  # (rows, blocks); a float32 sum of 256 terms: ~1e-7 relative
    cum = sums.cumsum(-1)
    target = u * cum[:, -1]
    b = torch.searchsorted(cum, target[:, None], right=True).squeeze(-1).clamp_max(cum.shape[-1] - 1)
    before = torch.where(b > 0, cum.gather(-1, (b - 1).clamp_min(0)[:, None]).squeeze(-1), torch.zeros_like(target))
    inside = p.view(rows, -1, block)[torch.arange(rows), b].double().cumsum(-1)  # (rows, block)
    i = torch.searchsorted(inside, (target - before)[:, None], right=True).squeeze(-1).clamp_max(block - 1)
    return (b * block + i).clamp_max(vocab - 1)
