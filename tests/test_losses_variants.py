"""GSPO's sequence ratio, k3 with k2's gradient, Dr.GRPO's constant-length aggregation."""

import math

import pytest
import torch

from turnrl.learner import losses


def test_k3_plus_has_k3_value_and_k2_gradient():
    lp = torch.tensor([[-1.0, -0.2, -3.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -0.1, -1.0]])
    k3p = losses.kl_penalty(lp, ref, "k3+")
    assert torch.allclose(k3p, losses.kl_penalty(lp, ref, "k3"))
    (g_plus,) = torch.autograd.grad(k3p.sum(), lp)
    (g_k2,) = torch.autograd.grad(losses.kl_penalty(lp, ref, "k2").sum(), lp)
    assert torch.allclose(g_plus, g_k2) and torch.allclose(g_k2, (lp - ref).detach())


def test_seq_mean_token_sum_norm_hand_values_and_microbatch_invariance():
    loss = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # (1 + 2) / 4 and 3 / 4, averaged over 2 sequences
    out = losses.aggregate(loss, mask, "seq-mean-token-sum-norm", norm_len=4)
    assert out.item() == pytest.approx((3 / 4 + 3 / 4) / 2)
    halves = sum(losses.aggregate(loss[i : i + 1], mask[i : i + 1], "seq-mean-token-sum-norm", num_seqs=2, norm_len=4) for i in range(2))
    assert halves.item() == pytest.approx(out.item())
    with pytest.raises(ValueError, match="norm_len"):
        losses.aggregate(loss, mask, "seq-mean-token-sum-norm")


def test_gspo_uses_one_length_normalised_ratio_per_sequence():
    old = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, 0.0]])
    lp = (old + torch.tensor([[0.1, 0.3, -0.1], [0.2, -0.2, 5.0]])).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    per_tok, stats = losses.ppo_clip_loss(lp, old, adv, mask, clip_low=10.0, clip_high=10.0, ratio_level="sequence")
    s0, s1 = math.exp((0.1 + 0.3 - 0.1) / 3), math.exp(0.0)  # the masked third token of row 1 does not count
    assert per_tok[0].tolist() == pytest.approx([-s0] * 3) and per_tok[1, :2].tolist() == pytest.approx([s1] * 2)
    assert per_tok[1, 2].item() == 0.0
    (g,) = torch.autograd.grad(per_tok.sum(), lp)
    # d/d logprob_t of -s_b * A (GSPO-token form): -A * s_b on every unmasked token
    assert g[0].tolist() == pytest.approx([-s0] * 3) and g[1].tolist() == pytest.approx([s1, s1, 0.0])


def test_gspo_clips_whole_sequences():
    old = torch.zeros(1, 2)
    lp = torch.tensor([[0.5, 0.5]], requires_grad=True)  # sequence ratio e^0.5 ~ 1.65, beyond 1 + 0.2
    per_tok, stats = losses.ppo_clip_loss(lp, old, torch.ones(1, 2), torch.ones(1, 2), ratio_level="sequence")
    assert stats["clip_frac_high"] == 1.0
    (g,) = torch.autograd.grad(per_tok.sum(), lp)
    assert torch.all(g == 0)
