"""Policy-gradient, KL and entropy losses, and loss aggregation. Formulas and papers: docs/algorithms.md.

Conventions shared by every function here:

- Token tensors are ``Shape: (batch, seq_len)``; position t holds the quantity for the token the model
  emitted at t (the learner has already shifted logits against targets).
- ``mask`` is ``Shape: (batch, seq_len)``, 1 exactly on the model's own response tokens (the loss
  tokens) and 0 on prompt, observation, template and padding tokens. Any dtype (bool, int, float) works.
  Values at masked-out positions may be garbage (padding logprobs, even inf): they never reach the
  loss, the stats or the gradient.
- Per-token losses are returned *un-aggregated* and zero at masked-out positions; ``aggregate`` reduces
  them. A loss is something to minimise.
"""

from __future__ import annotations

from typing import Literal

import torch

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
KLKind = Literal["k1", "k2", "k3", "k3+"]
RatioLevel = Literal["token", "sequence"]
ISMode = Literal["decoupled", "tis", "mis"]

KL_LOG_RATIO_CLAMP = 20.0
"""|log(p_ref / p)| is clamped to this before ``exp`` in k3 (exp(20) ~ 4.9e8 stays finite in fp32 and bf16)."""

_CHUNK_ROWS = 1024
"""Positions processed at once by the vocab-wide reductions (bounds the temporary (rows, vocab) buffers)."""


# --------------------------------------------------------------------------------------------- policy loss


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    ratio_level: RatioLevel = "token",
) -> tuple[torch.Tensor, dict[str, float]]:
    r"""PPO clipped surrogate per token (Schulman et al. 2017, arXiv:1707.06347), with asymmetric clip
    ranges (DAPO "clip-higher", arXiv:2503.14476) and optional dual clip (Ye et al. 2020, arXiv:1912.09729).

        ratio = exp(logprobs - old_logprobs)
        loss  = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)
        if dual_clip = c (c > 1) and A < 0:   loss = min(loss, -c * A)

    The dual clip bounds the loss of a negative-advantage token whose ratio has grown beyond c: there the
    loss is the constant -c*A and the token has zero gradient (same as verl's ``clip_ratio_c``).

    ``ratio_level="sequence"`` is GSPO (Zheng et al. 2025, arXiv:2507.18071, the GSPO-token form): every
    token of sequence b uses the length-normalised sequence ratio s_b = exp(mean_t (logprobs - old)) as its
    value, with the gradient of s_b * logprobs_t / sg(logprobs_t), so the whole sequence is clipped together.
    GSPO's clip ranges are much smaller than PPO's (the paper uses 3e-4 / 4e-4).

    Args:
        logprobs: current policy log-probabilities of the emitted tokens (carry the gradient).
            Shape: (batch, seq_len)
        old_logprobs: behaviour log-probabilities the engine sampled with, or the learner's proximal ones in the
            decoupled objective (:func:`behaviour_weights`); no gradient is taken.
            Shape: (batch, seq_len)
        advantages: per-token advantages, broadcast from the turn's advantage. Shape: (batch, seq_len)
        mask: 1 on loss tokens. Shape: (batch, seq_len)
        clip_low / clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high].
        dual_clip: c > 1 enables the dual clip; None disables it.

    Returns:
        per_token_loss: zero where ``mask`` is 0. Shape: (batch, seq_len)
        stats (means over loss tokens; 0.0 when there are none), logged as ``train/<key>``:
            ``clip_frac_low``: fraction where the lower clip is the active branch (A < 0, ratio < 1 - clip_low);
            ``clip_frac_high``: fraction where the upper clip is active (A > 0, ratio > 1 + clip_high);
            ``clip_frac_dual``: fraction where the dual clip is active (0 when disabled);
            ``approx_kl``: mean of old_logprobs - logprobs (k1 estimate of KL(old || new));
            ``ratio_mean``, ``ratio_max``: of the importance ratio.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (got {dual_clip})")
    m = mask.bool()
    old_logprobs = old_logprobs.detach()
    # Sanitise masked-out positions so garbage there (e.g. -inf padding) gives ratio 1 and a clean zero gradient.
    log_ratio = torch.where(m, logprobs - old_logprobs, torch.zeros_like(logprobs))
    if ratio_level == "sequence":
        seq = log_ratio.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1)
        log_ratio = torch.where(m, seq.detach() + logprobs - logprobs.detach(), torch.zeros_like(logprobs))
    elif ratio_level != "token":
        raise ValueError(f"ratio_level must be 'token' or 'sequence' (got {ratio_level!r})")
    adv = torch.where(m, advantages, torch.zeros_like(advantages))
    ratio = torch.exp(log_ratio)
    unclipped = -ratio * adv
    clipped = -ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(m)
    if dual_clip is not None:
        dual_bound = -dual_clip * adv
        dual_active = (adv < 0) & (loss > dual_bound)
        loss = torch.where(dual_active, dual_bound, loss)
    loss = torch.where(m, loss, torch.zeros_like(loss))

    with torch.no_grad():
        n = int(m.sum())
        if n == 0:
            keys = ("clip_frac_low", "clip_frac_high", "clip_frac_dual", "approx_kl", "ratio_mean", "ratio_max")
            stats = dict.fromkeys(keys, 0.0)
        else:
            r = ratio.detach()
            stats = {
                "clip_frac_low": float(((r < 1.0 - clip_low) & (adv < 0) & m).sum()) / n,
                "clip_frac_high": float(((r > 1.0 + clip_high) & (adv > 0) & m).sum()) / n,
                "clip_frac_dual": float((dual_active & m).sum()) / n,
                "approx_kl": float(-log_ratio.detach()[m].sum()) / n,
                "ratio_mean": float(r[m].sum()) / n,
                "ratio_max": float(r[m].max()),
            }
    return loss, stats


def behaviour_weights(
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: ISMode,
    level: RatioLevel = "token",
    cap: float = 2.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    r"""Importance weights of the learner's proximal policy against the behaviour policy the engine sampled with,
    for the decoupled PPO objective (docs/algorithms.md, "Off-policy correction").

    With w the importance ratio pi_prox / pi_behav (no gradient: both are fixed for the update),

        level "token":     log w_t = log pi_prox(y_t) - log pi_behav(y_t)
        level "sequence":  log w_b = (1 / |b|) sum_{t in b} (log pi_prox(y_t) - log pi_behav(y_t))
                           the geometric mean over sample b's loss tokens, given to every token of b

    and C = ``cap`` > 1, the weight is

        "decoupled"  w                          AReaL's decoupled PPO (Fu et al. 2025, arXiv:2505.24298), uncapped
        "tis"        min(w, C)                  truncated IS (Yao et al. 2025, "Your Efficient RL Framework Secretly
                                                Brings You Off-Policy RL Training"; C = 2 there)
        "mis"        w * 1[1/C <= w <= C]       masked IS: a token (or sequence) outside the band weighs 0
                                                (Liu et al. 2025, "When Speed Kills Stability"; verl's mask mode)

    The sequence weight is the geometric mean, not the product prod_t w_t: the product is the unbiased sequence
    weight, but its log is a sum over the sample's tokens, so its spread grows with length and any fixed C would
    truncate or mask nearly every long sample (a full-context episode has hundreds of tokens); the geometric mean is
    length-normalised as GSPO's sequence ratio is, at the cost of a bias. A "sequence" is one training sample (one
    turn with ``per_step``, the conversation with ``full``). A masked token keeps its place in the loss normaliser,
    as a zero advantage would, so the gradient does not depend on the micro-batch split.
    log w is clamped to [-20, 20] before ``exp`` (``KL_LOG_RATIO_CLAMP``).

    Shapes: all (batch, seq_len); ``mask`` 1 on loss tokens. Returns the weights (0 where ``mask`` is 0) and stats
    over loss tokens (0.0 when there are none), logged as ``train/<key>``: ``is_ratio_mean``, ``is_ratio_max``,
    ``is_ratio_min`` (of w before truncation or masking), ``is_truncated_frac`` (tis: w > C),
    ``is_masked_frac`` (mis: w outside [1/C, C]).
    """
    if cap <= 1.0:
        raise ValueError(f"the importance-weight cap must be > 1 (got {cap}); set algo.is_cap, e.g. 2.0")
    m = mask.bool()
    with torch.no_grad():
        log_w = torch.where(m, proximal_logprobs - behaviour_logprobs, torch.zeros_like(proximal_logprobs))
        if level == "sequence":
            seq = log_w.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1)
            log_w = torch.where(m, seq.expand_as(log_w), torch.zeros_like(log_w))
        elif level != "token":
            raise ValueError(f"is_level must be 'token' or 'sequence' (got {level!r})")
        w = torch.exp(log_w.clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP))
        truncated = masked = torch.zeros_like(m)
        if mode == "tis":
            truncated = m & (w > cap)
            weights = w.clamp(max=cap)
        elif mode == "mis":
            masked = m & ((w < 1.0 / cap) | (w > cap))
            weights = torch.where(masked, torch.zeros_like(w), w)
        elif mode == "decoupled":
            weights = w
        else:
            raise ValueError(f"unknown importance-sampling correction {mode!r}; valid: decoupled, tis, mis")
        weights = torch.where(m, weights, torch.zeros_like(weights))
        n = int(m.sum())
        stats = dict.fromkeys(("is_ratio_mean", "is_ratio_max", "is_ratio_min", "is_truncated_frac", "is_masked_frac"), 0.0)
        if n:
            stats = {
                "is_ratio_mean": float(w[m].sum()) / n,
                "is_ratio_max": float(w[m].max()),
                "is_ratio_min": float(w[m].min()),
                "is_truncated_frac": float(truncated.sum()) / n,
                "is_masked_frac": float(masked.sum()) / n,
            }
    return weights, stats


# --------------------------------------------------------------------------------------------- demonstrations


def demo_nll(logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""Negative log-likelihood of demonstration tokens, per token: supervised fine-tuning's loss, and the auxiliary
    term of demonstration-guided RL (docs/algorithms.md, "Demonstrations").

        L_t = -log pi(y_t | y_<t)        on the demonstration's own (agent) tokens, 0 elsewhere

    ``aggregate(..., "token-mean")`` makes it the token-mean NLL, (1 / N_demo) sum_t L_t. The learner weights it by
    ``algo.demo_coef`` during RL and by 1 in ``turnrl sft``; it uses logprobs at temperature 1 (the model's own
    distribution, not the sampling one).

    Shape: (batch, seq_len) -> (batch, seq_len); ``mask`` 1 on demonstration tokens.
    """
    return torch.where(mask.bool(), -logprobs, torch.zeros_like(logprobs))


# --------------------------------------------------------------------------------------------- value loss


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float = 0.2
) -> tuple[torch.Tensor, dict[str, float]]:
    r"""PPO's clipped value loss per position (Schulman et al. 2017; the "PPO2" form of OpenAI baselines).

        V_clip = V_old + clip(V - V_old, -c, c)
        loss   = 0.5 * max((V - R)^2, (V_clip - R)^2)          c = ``clip``; c = 0 means no clipping:
        loss   = 0.5 * (V - R)^2

    Where the clipped branch is the larger one and V is outside [V_old - c, V_old + c], the loss is a
    constant in V and its gradient is 0 (the value cannot move further from V_old in one update).

    Shapes: all (batch, seq_len); ``mask`` is 1 on positions that have a value target.
    Returns the per-position loss (0 where masked out) and stats ``value_clip_frac``, ``value_error``
    (mean |V - R|), means over masked positions.
    """
    m = mask.bool()
    old_values, returns = old_values.detach(), returns.detach()
    err = (values - returns) ** 2
    if clip > 0:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        err_clip = (v_clip - returns) ** 2
        loss = 0.5 * torch.maximum(err, err_clip)
        active = (err_clip > err) & ((values - old_values).abs() > clip)
    else:
        loss = 0.5 * err
        active = torch.zeros_like(m)
    loss = torch.where(m, loss, torch.zeros_like(loss))
    with torch.no_grad():
        n = max(int(m.sum()), 1)
        stats = {
            "value_clip_frac": float((active & m).sum()) / n,
            "value_error": float(((values - returns).abs() * m).sum()) / n,
        }
    return loss, stats


# --------------------------------------------------------------------------------------------- aggregation


def aggregate(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    mode: AggMode = "token-mean",
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_len: float | None = None,
) -> torch.Tensor:
    r"""Reduce a per-token loss to a scalar. Shape: (batch, seq_len) -> ().

    Modes, with L_{b,t} the per-token loss, M_{b,t} the mask and |b| = sum_t M_{b,t}:

        "token-mean"           sum_{b,t} M L / num_tokens                (num_tokens = sum M)
        "seq-mean-token-mean"  sum_b [ sum_t M L / |b| ] / num_seqs      (each sequence weighs the same)
        "seq-mean-token-sum"   sum_b [ sum_t M L ] / num_seqs            (longer sequences weigh more)
        "seq-mean-token-sum-norm"  sum_b [ sum_t M L / norm_len ] / num_seqs   (Dr.GRPO: a constant length
                               ``norm_len``, e.g. the generation budget, instead of each sequence's own)

    Dr.GRPO (arXiv:2503.20783) writes its loss as (1 / G) sum_i sum_t L_{i,t} / MAX_TOKENS over G responses. The
    learner takes the *episode* as the response, so for "seq-mean-token-sum-norm" it passes
    ``norm_len = max_turns * max_new_tokens`` (an episode's response-token budget) and ``num_seqs = E``, the
    number of episodes (trajectories) in the batch, whatever the context layout:

        loss = sum_{b,t} M L / (E * max_turns * max_new_tokens)

    A ``full`` sample is one episode (up to max_turns responses); ``per_step`` lays the same episode out as one
    sample per turn, and the same tokens and the same normaliser give the same loss. (Dividing every sample
    by max_new_tokens and averaging over samples instead makes a ``full`` step larger than a ``per_step`` one
    by the mean number of turns per episode, up to max_turns.) verl's mode of the same name divides the token
    sum by the padded response length and does not average over sequences.

    Gradient accumulation: call this once per micro-batch with the normalisers of the *whole* batch
    (``num_tokens`` = loss tokens in the batch for token-mean; ``num_seqs`` = sequences in the batch for the
    seq-mean modes, episodes for "seq-mean-token-sum-norm" as above) and the micro-batch losses sum exactly
    to the full-batch loss, whatever the split.
    The seq-mean modes need each sequence whole inside one micro-batch (split along batch, not seq_len).

    When a normaliser is None the micro-batch's own is used: ``mask.sum()`` for token-mean, and the number
    of rows with at least one loss token for the seq-mean modes (all-padding rows do not dilute the mean).
    Fully masked rows contribute 0; an all-masked batch returns 0 with a zero (not NaN) gradient.
    A "sequence" is one training sample: a whole conversation with the ``full`` context strategy, one
    turn with ``per_step``.
    """
    m = mask.bool()
    masked = torch.where(m, per_token_loss, torch.zeros_like(per_token_loss))
    if mode == "token-mean":
        denom = float(m.sum()) if num_tokens is None else float(num_tokens)
        return masked.sum() / max(denom, 1.0)
    if mode not in ("seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        raise ValueError(
            f"unknown loss aggregation {mode!r}; valid: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm"
        )
    per_seq = masked.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / m.sum(dim=-1).clamp_min(1).to(per_seq.dtype)
    if mode == "seq-mean-token-sum-norm":
        if not norm_len or norm_len <= 0:
            raise ValueError("seq-mean-token-sum-norm needs norm_len > 0 (the constant length, e.g. max_new_tokens)")
        per_seq = per_seq / float(norm_len)
    denom = float((m.sum(dim=-1) > 0).sum()) if num_seqs is None else float(num_seqs)
    return per_seq.sum() / max(denom, 1.0)


# --------------------------------------------------------------------------------------------- KL


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "k3", clamp: float = 0.0) -> torch.Tensor:
    r"""Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, http://joschu.net/blog/kl-approx.html).

    With d = logprobs - ref_logprobs = log(pi / pi_ref) at the sampled token:

        k1 = d                                 unbiased, high variance, can be negative
        k2 = d^2 / 2                           biased (low for small KL), always >= 0
        k3 = exp(-d) - (-d) - 1                unbiased, low variance, always >= 0 (GRPO's KL term)
        k3+ = k3's value with k2's gradient    (k2 + sg(k3 - k2)): k2's gradient is the unbiased gradient
                                               of KL(pi || pi_ref) as a loss, which k3's is not

    Stability, for k3 and k3+ only (k1 and k2 are never clamped):

    - -d = log(pi_ref / pi) is clamped to [-20, 20] (``KL_LOG_RATIO_CLAMP``) before ``exp``, so exp never
      overflows (at most e^20 ~ 4.9e8);
    - with ``clamp = c > 0`` the value is then clamped to [-c, c] (``algo.kl_clamp``, default 10): a token the
      reference finds far likelier than the policy otherwise costs e^|d| (3.27e6 at d = -15) and swamps the
      policy loss. This is verl's ``low_var_kl`` (``verl/trainer/ppo/core_algos.py``, ``kl_penalty``:
      ``kl = clamp(ref_logprob - logprob, -20, 20)``, ``kld = exp(kl) - kl - 1``, ``clamp(kld, -10, 10)``).
      Where the clamp is active, k3's gradient is 0 (as in verl); k3+ keeps k2's gradient d, which is
      finite, so the clamp bounds only its value. k3 >= 0, so only the upper bound can bind.

    Within both clamps the value and gradient are exact. ``clamp = 0`` turns the value clamp off.
    As a loss term (GRPO, verl) the expected gradient of k3 is that of KL(pi_ref || pi), and k1's is 0;
    see docs/algorithms.md.

    Shape: (batch, seq_len) -> (batch, seq_len). Not masked: combine with the policy loss before ``aggregate``.
    """
    if clamp < 0:
        raise ValueError(f"kl clamp must be >= 0 (0 = off; got {clamp})")
    d = logprobs - ref_logprobs
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind in ("k3", "k3+"):
        x = (-d).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
        k3 = torch.exp(x) - x - 1.0
        if clamp > 0:
            k3 = k3.clamp(-clamp, clamp)
        if kind == "k3":
            return k3
        k2 = 0.5 * d * d
        return k2 + (k3 - k2).detach()
    raise ValueError(f"unknown KL estimator {kind!r}; valid: k1, k2, k3, k3+")


# --------------------------------------------------------------------------------------------- vocab-wide reductions


def _chunks(batch: int, seq_len: int) -> list[tuple[int, int, int]]:
    """(row, start, stop) slices covering a (batch, seq_len) grid, at most ``_CHUNK_ROWS`` positions each.

    Slicing one batch row at a time keeps every slice a view, even of a non-contiguous tensor such as
    ``logits[:, :-1, :]``; reshaping that to (rows, vocab) would copy it whole.
    """
    return [(i, a, min(a + _CHUNK_ROWS, seq_len)) for i in range(batch) for a in range(0, seq_len, _CHUNK_ROWS)]


class _TokenLogprob(torch.autograd.Function):
    """log softmax(logits / tau)[target] without keeping a (batch, seq_len, vocab) softmax or copy for backward.

    Forward computes, chunk by chunk, logit[target] / tau - logsumexp(logits / tau) in fp32. Backward
    recomputes softmax per chunk: d/dlogits = (onehot(target) - softmax(logits / tau)) / tau * grad.
    Saved for backward: the logits themselves (already alive) and the (batch, seq_len) logsumexp.
    Not twice differentiable.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:  # type: ignore[override]
        B, T, _ = logits.shape
        out = torch.empty(B, T, dtype=torch.float32, device=logits.device)
        lse = torch.empty(B, T, dtype=torch.float32, device=logits.device)
        for i, a, b in _chunks(B, T):
            x = logits[i, a:b].float()
            if temperature != 1.0:
                x = x / temperature
            lse[i, a:b] = torch.logsumexp(x, dim=-1)
            out[i, a:b] = x.gather(-1, targets[i, a:b, None]).squeeze(-1) - lse[i, a:b]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        logits, targets, lse = ctx.saved_tensors
        tau = ctx.temperature
        grad = torch.empty_like(logits)
        B, T, _ = logits.shape
        for i, a, b in _chunks(B, T):
            x = logits[i, a:b].float()
            if tau != 1.0:
                x = x / tau
            g = torch.exp(x - lse[i, a:b, None]).neg_()
            g.scatter_add_(-1, targets[i, a:b, None], torch.ones_like(g[:, :1]))
            g.mul_(grad_out[i, a:b, None] / tau)
            grad[i, a:b] = g.to(grad.dtype)
        return grad, None, None


def token_logprobs(logits: torch.Tensor, target_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    r"""log softmax(logits / temperature) at ``target_ids``, computed as logit[target]/tau - logsumexp(logits/tau).

    Memory: works in chunks of positions, in fp32 whatever the input dtype (bf16 logits are upcast one
    chunk at a time), never copies a non-contiguous ``logits`` view, and keeps no (batch, seq_len, vocab)
    copy for backward: the gradient recomputes the softmax chunk by chunk. The only full-size tensor it
    creates is the gradient of ``logits`` itself.

    Args:
        logits: Shape: (batch, seq_len, vocab), any float dtype.
        target_ids: the emitted tokens, integer. Shape: (batch, seq_len)
        temperature: the sampling temperature, so that logprobs match the engine's behaviour logprobs.

    Returns: fp32 log-probabilities. Shape: (batch, seq_len)
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature})")
    if logits.dim() != 3 or target_ids.shape != logits.shape[:-1]:
        raise ValueError(
            "expected logits (batch, seq_len, vocab) and targets (batch, seq_len); "
            f"got {tuple(logits.shape)} and {tuple(target_ids.shape)}"
        )
    return _TokenLogprob.apply(logits, target_ids.long(), float(temperature))


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    r"""Entropy of softmax(logits) at every position: H = -sum_v p_v log p_v with log p = log_softmax(logits).

    Computed from log_softmax in fp32, in chunks of positions (bounded temporary memory; bf16 input is
    upcast a chunk at a time). Tokens with probability exactly 0 (logit -inf) contribute 0, not NaN.
    Divide the logits by the sampling temperature first to get the entropy of the sampling distribution.
    Differentiable (use it for an entropy bonus), though under autograd each chunk's softmax is kept.

    Shape: (batch, seq_len, vocab) -> (batch, seq_len), fp32.
    """
    if logits.dim() != 3:
        raise ValueError(f"expected logits (batch, seq_len, vocab); got {tuple(logits.shape)}")
    B, T, _ = logits.shape
    rows = []
    for i in range(B):
        parts = []
        for _, a, b in _chunks(1, T):
            logp = torch.log_softmax(logits[i, a:b].float(), dim=-1)
            p = logp.exp()
            parts.append(-torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1))
        rows.append(torch.cat(parts) if parts else logits.new_zeros(0, dtype=torch.float32))
    if not rows:
        return logits.new_zeros(B, T, dtype=torch.float32)
    return torch.stack(rows)
