"""The shared sampler: distribution, filtering and the logprob it reports."""

import torch

from turnrl.engines import SamplingParams
from turnrl.engines.sampling import sample


def test_per_row_generators_draw_from_the_tempered_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0]])).repeat(4000, 1)
    gens = [torch.Generator().manual_seed(i) for i in range(4000)]
    tok, lp = sample(logits, SamplingParams(temperature=1.0), gens)
    freq = torch.bincount(tok, minlength=4).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.03)
    assert torch.allclose(lp, torch.log(torch.tensor([0.5, 0.3, 0.2, 1.0]))[tok], atol=1e-6)


def test_top_k_and_top_p_restrict_the_draw_but_not_the_reported_logprob():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(500, 1)
    gens = [torch.Generator().manual_seed(i) for i in range(500)]
    tok, lp = sample(logits, SamplingParams(temperature=1.0, top_k=2), gens)
    assert set(tok.tolist()) == {0, 1}
    assert torch.allclose(lp, torch.log(torch.tensor([0.5, 0.3]))[tok], atol=1e-6)
    tok, _ = sample(logits, SamplingParams(temperature=1.0, top_p=0.7), [torch.Generator().manual_seed(i) for i in range(500)])
    assert set(tok.tolist()) == {0, 1}  # 0.5 alone does not reach 0.7; 0.5 + 0.3 does


def test_a_row_draw_depends_only_on_its_generator():
    logits = torch.randn(3, 50)
    a, _ = sample(logits, SamplingParams(), [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    b, _ = sample(logits[1:2], SamplingParams(), [torch.Generator().manual_seed(2)])
    assert a[1] == b[0]


def test_two_level_inverse_cdf_picks_the_token_a_full_cumsum_picks():
    from turnrl.engines.sampling import _inverse_cdf

    g = torch.Generator().manual_seed(0)
    for vocab in (1000, 49152, 300):  # not a multiple of the block, a multiple, barely over one block
        probs = torch.softmax(torch.randn(64, vocab, generator=g) * 4, -1)
        probs[:, ::7] = 0.0  # zero-mass tokens must never be drawn
        u = torch.rand(64, generator=g, dtype=torch.float64)
        cdf = probs.double().cumsum(-1)
        full = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
        assert torch.equal(_inverse_cdf(probs, u), full)
