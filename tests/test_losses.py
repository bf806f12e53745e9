"""Losses: hand-computed PPO values, clip stats, dual-clip gradients, aggregation and micro-batch invariance,
KL estimators, token logprobs and entropy."""

from __future__ import annotations

import math

import pytest
import torch

from turnrl.learner import losses
from turnrl.learner.losses import aggregate, entropy_from_logits, kl_penalty, ppo_clip_loss, token_logprobs

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


def _ratios_to_logprobs(ratios):
    return torch.log(torch.tensor([ratios], dtype=torch.float64)).requires_grad_(True)


# ------------------------------------------------------------------ PPO clip


def test_ppo_clip_hand_values_and_stats():
    # clip range [0.8, 1.3]; last position is masked and holds garbage
    ratios = [1.1, 1.5, 0.5, 0.5, 1.5, 0.9, 1.0]
    adv = torch.tensor([[1.0, 1.0, 1.0, -2.0, -2.0, -2.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    logp = torch.log(torch.tensor([ratios], dtype=torch.float64))
    logp[0, 6] = float("inf")
    logp.requires_grad_(True)
    old = torch.zeros_like(logp)
    loss, stats = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.3)
    expected = [
        -1.1,  # A>0, inside: -r A
        -1.3,  # A>0, r above 1.3: clipped to 1.3
        -0.5,  # A>0, r below 0.8: min picks the unclipped r A = 0.5
        1.6,  # A<0, r below 0.8: -min(-1.0, -1.6) = 1.6 (clipped to 0.8)
        3.0,  # A<0, r above 1.3: -min(-3.0, -2.6) = 3.0 (unclipped)
        1.8,  # A<0, inside
        0.0,  # masked
    ]
    assert loss.detach()[0].tolist() == pytest.approx(expected, abs=1e-12)
    loss.sum().backward()
    # d loss / d logp = -r A where the unclipped branch is active, 0 where the clipped one is
    assert logp.grad[0].tolist() == pytest.approx([-1.1, 0.0, -0.5, 0.0, 3.0, 1.8, 0.0], abs=1e-12)
    assert stats["clip_frac_high"] == pytest.approx(1 / 6)
    assert stats["clip_frac_low"] == pytest.approx(1 / 6)
    assert stats["clip_frac_dual"] == 0.0
    assert stats["ratio_mean"] == pytest.approx(1.0)  # (1.1 + 1.5 + 0.5 + 0.5 + 1.5 + 0.9) / 6
    assert stats["ratio_max"] == pytest.approx(1.5)
    # mean(old - new) = -log(1.1 * 1.5 * 0.5 * 0.5 * 1.5 * 0.9) / 6 = -log(0.556875) / 6
    assert stats["approx_kl"] == pytest.approx(-math.log(0.556875) / 6)
    assert all(math.isfinite(v) for v in stats.values())


def test_ppo_ratio_one_is_vanilla_policy_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -3.0]])
    loss, stats = ppo_clip_loss(logp, logp.detach(), adv, torch.ones(1, 2))
    assert loss.detach().tolist() == [[-2.0, 3.0]]
    loss.sum().backward()
    assert logp.grad.tolist() == [[-2.0, 3.0]]  # -A
    assert stats["clip_frac_low"] == stats["clip_frac_high"] == stats["approx_kl"] == 0.0


def test_dual_clip_caps_loss_and_zeroes_gradient_where_active():
    # c = 3: A=-1, r=4 -> PPO loss 4 > 3 -> capped at 3 with zero gradient; A=-1, r=2 -> 2 (untouched);
    # A=+1, r=4 -> -1.3 (dual clip only applies to A < 0)
    logp = _ratios_to_logprobs([4.0, 2.0, 4.0])
    adv = torch.tensor([[-1.0, -1.0, 1.0]], dtype=torch.float64)
    loss, stats = ppo_clip_loss(logp, torch.zeros_like(logp), adv, torch.ones(1, 3), clip_low=0.2, clip_high=0.3, dual_clip=3.0)
    assert loss.detach()[0].tolist() == pytest.approx([3.0, 2.0, -1.3], abs=1e-12)
    loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 2.0, 0.0], abs=1e-12)
    assert stats["clip_frac_dual"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        ppo_clip_loss(logp, logp, adv, torch.ones(1, 3), dual_clip=1.0)


def test_ppo_all_masked_is_zero_without_nan():
    logp = torch.full((2, 3), -float("inf"), requires_grad=True)
    loss, stats = ppo_clip_loss(logp, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3))
    total = aggregate(loss, torch.zeros(2, 3))
    total.backward()
    assert float(total.detach()) == 0.0
    assert torch.equal(logp.grad, torch.zeros(2, 3))
    assert all(v == 0.0 for v in stats.values())


# ------------------------------------------------------------------ aggregation


def _agg_example():
    nan, inf = float("nan"), float("inf")
    loss = torch.tensor([[1.0, 2.0, nan, inf], [5.0, 6.0, 7.0, 8.0], [nan, inf, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    return loss, mask


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 29 / 6),  # (1 + 2 + 5 + 6 + 7 + 8) / 6 tokens
        ("seq-mean-token-mean", 4.0),  # (1.5 + 6.5) / 2 non-empty rows
        ("seq-mean-token-sum", 14.5),  # (3 + 26) / 2 non-empty rows
    ],
)
def test_aggregate_hand_values_ignore_masked_garbage(mode, expected):
    loss, mask = _agg_example()
    assert float(aggregate(loss, mask, mode)) == pytest.approx(expected)
    # global normalisers override the micro-batch's own
    assert float(aggregate(loss, mask, mode, num_tokens=12, num_seqs=4)) == pytest.approx(
        29 / 12 if mode == "token-mean" else expected * 2 / 4
    )


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_all_masked_gives_zero_loss_and_zero_grad(mode):
    x = torch.randn(3, 5, requires_grad=True)
    out = aggregate(x * 2, torch.zeros(3, 5), mode)
    out.backward()
    assert float(out.detach()) == 0.0 and torch.equal(x.grad, torch.zeros(3, 5))


def test_aggregate_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "sum")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("splits", [[6], [3, 3], [2, 1, 3], [1, 1, 4]])
def test_micro_batch_split_invariance(mode, splits):
    g = torch.Generator().manual_seed(0)
    B, T = 6, 7
    mask = (torch.rand(B, T, generator=g) > 0.4).long()
    mask[2] = 0  # a fully masked row
    mask[4, 0] = 1  # at least one token
    old = -torch.rand(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T)
    base = old + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)

    def total(sizes):
        w = base.clone().requires_grad_(True)
        num_tokens, num_seqs = float(mask.sum()), float((mask.sum(-1) > 0).sum())
        out, start = 0.0, 0
        for n in sizes:
            sl = slice(start, start + n)
            per_tok, _ = ppo_clip_loss(w[sl], old[sl], adv[sl], mask[sl], clip_low=0.2, clip_high=0.28)
            per_tok = per_tok + 0.1 * kl_penalty(w[sl], old[sl], "k3")
            if len(sizes) == 1:  # the full batch uses its own normalisers
                loss = aggregate(per_tok, mask[sl], mode)
            else:
                loss = aggregate(per_tok, mask[sl], mode, num_tokens=num_tokens, num_seqs=num_seqs)
            loss.backward()
            out += float(loss.detach())
            start += n
        return out, w.grad

    full_loss, full_grad = total([6])
    loss, grad = total(splits)
    assert loss == pytest.approx(full_loss, rel=1e-12, abs=1e-12)
    torch.testing.assert_close(grad, full_grad, rtol=1e-12, atol=1e-12)
    assert torch.all(full_grad[2] == 0)


# ------------------------------------------------------------------ KL


def test_kl_hand_values():
    half, quarter = math.log(0.5), math.log(0.25)
    logp = torch.tensor([[half, quarter, -1.0]], dtype=torch.float64)
    ref = torch.tensor([[quarter, half, -1.0]], dtype=torch.float64)
    ln2 = math.log(2.0)
    # d = log p - log p_ref = [ln 2, -ln 2, 0]
    assert kl_penalty(logp, ref, "k1")[0].tolist() == pytest.approx([ln2, -ln2, 0.0])
    assert kl_penalty(logp, ref, "k2")[0].tolist() == pytest.approx([0.5 * ln2**2, 0.5 * ln2**2, 0.0])
    # k3 = p_ref/p - log(p_ref/p) - 1: [0.5 + ln2 - 1, 2 - ln2 - 1, 0]
    assert kl_penalty(logp, ref, "k3")[0].tolist() == pytest.approx([ln2 - 0.5, 1.0 - ln2, 0.0])
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(logp, ref, "k4")


def test_k3_nonnegative_finite_and_clamped():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(50, 40, generator=g) * 30
    ref = torch.randn(50, 40, generator=g) * 30
    k3 = kl_penalty(logp, ref, "k3")
    assert torch.all(k3 >= 0) and torch.all(torch.isfinite(k3))
    extreme = kl_penalty(torch.tensor([[-100.0]]), torch.tensor([[0.0]]), "k3")
    assert float(extreme) == pytest.approx(math.exp(20) - 21, rel=1e-6)
    x = torch.tensor([[-0.3]], requires_grad=True)  # inside the clamp: d k3 / d logp = 1 - p_ref/p
    kl_penalty(x, torch.tensor([[-0.1]]), "k3").sum().backward()
    assert float(x.grad) == pytest.approx(1 - math.exp(0.2), rel=1e-6)


@pytest.mark.parametrize("kind", ["k3", "k3+"])
def test_kl_clamp_bounds_k3_and_keeps_gradients_finite(kind):
    # ref-lp = 15: unclamped k3 = e^15 - 15 - 1 = 3.27e6; clamped to c = 10 as verl's low_var_kl
    lp = torch.tensor([[-15.0, -0.3]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[0.0, -0.1]], dtype=torch.float64)
    assert kl_penalty(lp, ref, kind)[0, 0].item() == pytest.approx(math.exp(15) - 16)
    kl = kl_penalty(lp, ref, kind, clamp=10.0)
    assert kl[0].tolist() == pytest.approx([10.0, math.exp(0.2) - 0.2 - 1])  # inside the clamp: unchanged
    (g,) = torch.autograd.grad(kl.sum(), lp)
    assert torch.all(torch.isfinite(g))
    # k3: zero gradient where clamped (torch.clamp), 1 - p_ref/p inside; k3+: k2's gradient d everywhere
    expected = [0.0, 1 - math.exp(0.2)] if kind == "k3" else [-15.0, -0.2]
    assert g[0].tolist() == pytest.approx(expected)
    assert torch.equal(kl_penalty(lp, ref, kind, clamp=0.0), kl_penalty(lp, ref, kind))  # 0 = off
    assert kl_penalty(lp, ref, "k1", clamp=10.0)[0, 0].item() == -15.0  # k1 and k2 are never clamped
    with pytest.raises(ValueError, match="kl clamp must be >= 0"):
        kl_penalty(lp, ref, kind, clamp=-1.0)


# ------------------------------------------------------------------ token logprobs and entropy


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(losses, "_CHUNK_ROWS", 3)  # exercise the chunk boundaries with T = 7


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_matches_log_softmax_gather(small_chunks, temperature):
    g = torch.Generator().manual_seed(0)
    full = torch.randn(2, 8, 11, generator=g) * 3
    logits = full[:, :-1, :].clone().requires_grad_(True)
    targets = torch.randint(0, 11, (2, 7), generator=g)
    upstream = torch.randn(2, 7, generator=g)

    got = token_logprobs(logits, targets, temperature)
    (got * upstream).sum().backward()
    ref_logits = logits.detach().clone().requires_grad_(True)
    want = torch.log_softmax(ref_logits / temperature, -1).gather(-1, targets[..., None]).squeeze(-1)
    (want * upstream).sum().backward()
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits.grad, ref_logits.grad, rtol=1e-5, atol=1e-6)


def test_token_logprobs_non_contiguous_and_bf16():
    g = torch.Generator().manual_seed(1)
    full = torch.randn(3, 6, 9, generator=g)
    view = full[:, :-1, :]  # non-contiguous, as the learner passes it
    targets = torch.randint(0, 9, (3, 5), generator=g)
    want = torch.log_softmax(view, -1).gather(-1, targets[..., None]).squeeze(-1)
    torch.testing.assert_close(token_logprobs(view, targets), want)
    bf = view.to(torch.bfloat16)
    got = token_logprobs(bf, targets)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.log_softmax(bf.float(), -1).gather(-1, targets[..., None]).squeeze(-1))


def test_entropy_uniform_is_log_v_and_handles_neg_inf(small_chunks):
    torch.testing.assert_close(entropy_from_logits(torch.zeros(2, 7, 13)), torch.full((2, 7), math.log(13)))
    logits = torch.tensor([[[0.0, 0.0, -float("inf"), -float("inf")]]])
    assert float(entropy_from_logits(logits)) == pytest.approx(math.log(2))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 7, 10, generator=g) * 4
    want = -(torch.softmax(x, -1) * torch.log_softmax(x, -1)).sum(-1)
    torch.testing.assert_close(entropy_from_logits(x), want)
    assert torch.all(entropy_from_logits(x) <= math.log(10) + 1e-6)
