"""Off-policy correction: truncated and masked importance sampling at token and sequence level, the decoupled PPO
objective in the learner (learner/losses.py ``behaviour_weights``, learner/learner.py)."""

import copy
import math

import pytest
import torch

from turnrl.config import ConfigError, load_config
from turnrl.learner import Learner, LearnerParams
from turnrl.learner.learner import packed_logprobs, response_logits
from turnrl.learner.losses import behaviour_weights
from turnrl.learner.samples import collate, micro_batches
from turnrl.types import TrainSample

# two samples; loss tokens: row 0 positions 0-2, row 1 positions 1-2 (position 0 is prompt)
MASK = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
PROX = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
# log(pi_prox / pi_behav) per token: w = 3, 1, 1/3 in row 0; 1.5, 0.25 in row 1; garbage where masked out
BEHAV = -torch.tensor([[math.log(3.0), 0.0, -math.log(3.0)], [float("inf"), math.log(1.5), math.log(0.25)]])


def _w(mode, level, cap=2.0):
    w, stats = behaviour_weights(PROX, BEHAV, MASK, mode=mode, level=level, cap=cap)
    return w, stats


def test_token_level_tis_truncates_at_the_cap():
    w, stats = _w("tis", "token")
    assert torch.allclose(w, torch.tensor([[2.0, 1.0, 1 / 3], [0.0, 1.5, 0.25]]))
    assert stats["is_truncated_frac"] == pytest.approx(1 / 5) and stats["is_masked_frac"] == 0.0
    assert stats["is_ratio_max"] == pytest.approx(3.0) and stats["is_ratio_min"] == pytest.approx(0.25)
    assert stats["is_ratio_mean"] == pytest.approx((3 + 1 + 1 / 3 + 1.5 + 0.25) / 5)


def test_token_level_mis_drops_tokens_outside_the_band():
    w, stats = _w("mis", "token")
    # [1/2, 2]: 3 (above), 1/3 and 0.25 (below) are dropped; 1 and 1.5 keep their weight
    assert torch.allclose(w, torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.5, 0.0]]))
    assert stats["is_masked_frac"] == pytest.approx(3 / 5) and stats["is_truncated_frac"] == 0.0


def test_sequence_level_uses_the_geometric_mean_of_each_sample():
    # row 0: (3 * 1 * 1/3)^(1/3) = 1; row 1: (1.5 * 0.25)^(1/2) = sqrt(0.375) ~ 0.612
    g1 = math.sqrt(1.5 * 0.25)
    w, stats = _w("tis", "sequence")
    assert torch.allclose(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, g1, g1]]))
    assert stats["is_truncated_frac"] == 0.0
    w, stats = _w("mis", "sequence", cap=1.5)  # band [2/3, 1.5]: row 1's 0.612 is outside, the whole sample goes
    assert torch.allclose(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert stats["is_masked_frac"] == pytest.approx(2 / 5)
    w, _ = _w("decoupled", "sequence")
    assert torch.allclose(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, g1, g1]]))


def test_decoupled_weights_are_the_raw_ratio_and_bad_settings_are_refused():
    w, _ = _w("decoupled", "token")
    assert torch.allclose(w, torch.tensor([[3.0, 1.0, 1 / 3], [0.0, 1.5, 0.25]]))
    with pytest.raises(ValueError, match="algo.is_cap"):
        _w("tis", "token", cap=1.0)
    with pytest.raises(ValueError, match="valid: decoupled, tis, mis"):
        _w("clip", "token")
    with pytest.raises(ConfigError, match="is_cap"):
        load_config(None, ["algo.is_cap=0.5"])
    with pytest.raises(ConfigError, match="is_correction"):
        load_config(None, ["algo.is_correction=truncate"])


def test_an_all_masked_batch_gives_zero_weights_and_zero_stats():
    w, stats = behaviour_weights(PROX, BEHAV, torch.zeros_like(MASK), mode="tis", level="sequence")
    assert not w.any() and set(stats.values()) == {0.0}


# ---------------------------------------------------------------------------------------------- in the learner


def _params(**kw) -> LearnerParams:
    base = dict(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, warmup_steps=0, grad_clip=1e9, micro_batch_tokens=64,
                autocast_bf16=False, temperature=1.0, ppo_epochs=2, clip_low=0.2, clip_high=0.28, dual_clip=None,
                ratio_level="token", entropy_coef=0.0, kl_coef=0.0, kl_type="k3", kl_clamp=10.0, loss_agg="token-mean",
                norm_len=1.0, vf_coef=0.0)
    return LearnerParams(**{**base, **kw})


def _samples(model, shift: float = 0.0) -> list[TrainSample]:
    """Random samples whose behaviour logprobs are the model's own (plus ``shift``), as the learner computes them."""
    g = torch.Generator().manual_seed(0)
    samples = []
    for i, (p, n) in enumerate([(5, 4), (3, 6), (7, 2), (4, 5)]):
        ids = torch.randint(0, 1000, (p + n,), generator=g).tolist()
        adv = [0.0] * p + [(-1.0) ** i * (0.5 + 0.1 * t) for t in range(n)]
        samples.append(TrainSample(ids, [0] * p + [1] * n, [0.0] * (p + n), adv, traj_index=i, turn_index=0))
    with torch.no_grad():
        for mb in micro_batches(samples, 64):
            batch = collate(mb, 0)
            logp = packed_logprobs(response_logits(model, batch), batch, 1.0)
            for b, s in enumerate(mb):
                k = len(s) - s.loss_mask.index(1)
                s.behaviour_logprobs[-k:] = (logp[b, -k:] + shift).tolist()
    return samples


@pytest.mark.parametrize("mode,level", [("decoupled", "token"), ("tis", "token"), ("mis", "token"),
                                        ("tis", "sequence"), ("mis", "sequence")])
def test_with_behaviour_equal_to_the_learner_every_correction_is_the_identity(tiny_model, mode, level):
    samples = _samples(tiny_model)
    plain, corrected = tiny_model, copy.deepcopy(tiny_model)
    m0 = Learner(plain, _params(), pad_id=0).update(samples)
    m1 = Learner(corrected, _params(is_correction=mode, is_level=level), pad_id=0).update(samples)
    # two PPO epochs: the second clips against the first epoch's (proximal) logprobs, which equal the behaviour's
    assert m1["train/loss"] == pytest.approx(m0["train/loss"], rel=1e-5, abs=1e-7)
    assert m1["train/grad_norm"] == pytest.approx(m0["train/grad_norm"], rel=1e-5)
    for a, b in zip(plain.parameters(), corrected.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert m1["train/is_ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert m1["train/is_ratio_min"] == pytest.approx(1.0, abs=1e-5) and m1["train/is_ratio_max"] == pytest.approx(1.0, abs=1e-5)
    assert m1["train/is_truncated_frac"] == 0.0 and m1["train/is_masked_frac"] == 0.0


def test_mis_drops_every_token_whose_behaviour_was_far_from_the_learner(tiny_model):
    # behaviour logprobs 1.0 above the learner's: w = e^-1 < 1/2 everywhere, so MIS masks every token
    samples = _samples(tiny_model, shift=1.0)
    m = Learner(tiny_model, _params(ppo_epochs=1, is_correction="mis"), pad_id=0).update(samples)
    assert m["train/is_masked_frac"] == 1.0 and m["train/grad_norm"] == 0.0 and m["train/loss"] == 0.0
    assert m["train/is_ratio_max"] == pytest.approx(math.exp(-1.0), rel=1e-4)
    # the same batch uncorrected: PPO's ratio against the behaviour is e^-1 and the update is not zero
    plain = Learner(copy.deepcopy(tiny_model), _params(ppo_epochs=1), pad_id=0).update(samples)
    assert plain["train/grad_norm"] > 0


def test_tis_scales_the_gradient_by_the_truncated_weight(tiny_model):
    # w = e^0.5 ~ 1.65 on every token, under the cap 2: the decoupled loss is the on-policy loss times w
    samples = _samples(tiny_model, shift=-0.5)
    on_policy = _samples(tiny_model)
    for s, o in zip(samples, on_policy):  # same ids and advantages
        assert s.input_ids == o.input_ids
    m_tis = Learner(copy.deepcopy(tiny_model), _params(ppo_epochs=1, is_correction="tis"), pad_id=0).update(samples)
    m_on = Learner(copy.deepcopy(tiny_model), _params(ppo_epochs=1), pad_id=0).update(on_policy)
    assert m_tis["train/loss"] == pytest.approx(math.exp(0.5) * m_on["train/loss"], rel=1e-4)
    assert m_tis["train/grad_norm"] == pytest.approx(math.exp(0.5) * m_on["train/grad_norm"], rel=1e-4)
    # with the cap at 1.2 every token is truncated: the loss is 1.2 times the on-policy one
    m_cap = Learner(copy.deepcopy(tiny_model), _params(ppo_epochs=1, is_correction="tis", is_cap=1.2), pad_id=0).update(samples)
    assert m_cap["train/is_truncated_frac"] == 1.0
    assert m_cap["train/loss"] == pytest.approx(1.2 * m_on["train/loss"], rel=1e-4)
