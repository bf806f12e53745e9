"""The learner's layout tricks (shared prefix, logits on response positions only, bucketing) are exact."""

import torch

from turnrl.learner.samples import build_samples, collate, micro_batches, shared_prefix_len
from turnrl.types import Advantages, Termination, TrainSample, Trajectory, Turn


def _samples(n=5, prefix_len=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(5, 1000, (prefix_len,), generator=g).tolist()
    out = []
    for i in range(n):
        obs = torch.randint(5, 1000, (3 + i % 3,), generator=g).tolist()
        resp = torch.randint(5, 1000, (2 + i % 4,), generator=g).tolist()
        ids = prefix + obs + resp
        out.append(TrainSample(ids, [0] * (len(ids) - len(resp)) + [1] * len(resp),
                               [0.0] * len(ids), [0.0] * (len(ids) - len(resp)) + [1.0 + i] * len(resp)))
    return out


def _reference_logprobs(model, s: TrainSample) -> torch.Tensor:
    ids = torch.tensor([s.input_ids])
    logits = model(ids).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    mask = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
    return lp[mask]


def _batched_logprobs(model, samples):
    from turnrl.learner.learner import packed_logprobs, response_logits

    batch = collate(samples, pad_id=0, min_shared_prefix=4)
    lp = packed_logprobs(response_logits(model, batch), batch, 1.0)
    return batch, [lp[b][batch.mask[b].bool()] for b in range(len(samples))]


def _multi_turn_samples(n=4, seed=1):
    """Full-context samples: prompt, response, observation, response (loss mask 0 between the responses)."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(5, 1000, (20,), generator=g).tolist()
    out = []
    for i in range(n):
        ids, mask = list(prefix), [0] * len(prefix)
        for t in range(2 + i % 2):
            obs = torch.randint(5, 1000, (2 + (i + t) % 4,), generator=g).tolist()
            resp = torch.randint(5, 1000, (1 + (i * t) % 3,), generator=g).tolist()
            ids += obs + resp
            mask += [0] * len(obs) + [1] * len(resp)
        out.append(TrainSample(ids, mask, [0.0] * len(ids), [float(m) for m in mask]))
    return out


def test_head_runs_only_on_loss_positions_and_matches_full_logits(tiny_model, monkeypatch):
    """Multi-turn rows: the packed head equals the model's own logits, and the fallback path agrees."""
    import turnrl.learner.learner as learner

    samples = _multi_turn_samples()
    batch, lps = _batched_logprobs(tiny_model, samples)
    assert int(batch.mask.sum()) < batch.mask.numel()  # observation tokens and padding inside the kept span
    assert learner.response_logits(tiny_model, batch).shape[0] == int(batch.mask.sum())
    for s, lp in zip(samples, lps):
        assert torch.allclose(lp, _reference_logprobs(tiny_model, s), atol=1e-5)
    monkeypatch.setattr(learner, "_decoder_and_head", lambda model: None)
    _, fallback = _batched_logprobs(tiny_model, samples)
    for a, b in zip(lps, fallback):
        assert torch.allclose(a, b, atol=1e-6)


def test_shared_prefix_forward_equals_plain_forward(tiny_model):
    samples = _samples()
    batch, lps = _batched_logprobs(tiny_model, samples)
    assert len(batch.prefix) >= 16  # the shared-prefix path ran
    for s, lp in zip(samples, lps):
        ref = _reference_logprobs(tiny_model, s)
        assert torch.allclose(lp, ref, atol=1e-5), (lp, ref)


def test_shared_prefix_gradient_equals_plain_gradient(tiny_model):
    samples = _samples()
    params = [p for p in tiny_model.parameters()]
    tiny_model.zero_grad()
    _, lps = _batched_logprobs(tiny_model, samples)
    torch.stack([lp.sum() for lp in lps]).sum().backward()
    g1 = [p.grad.clone() for p in params]
    tiny_model.zero_grad()
    torch.stack([_reference_logprobs(tiny_model, s).sum() for s in samples]).sum().backward()
    for a, p in zip(g1, params):
        assert torch.allclose(a, p.grad, atol=1e-5, rtol=1e-4)


def test_micro_batches_respect_budget_and_keep_every_sample():
    samples = _samples(n=9)
    batches = micro_batches(samples, token_budget=30)
    assert len(batches) > 1
    assert sorted(id(s) for b in batches for s in b) == sorted(id(s) for s in samples)
    shared = shared_prefix_len(samples)
    assert shared >= 19  # the 20-token prefix minus one: budgets count only the rest of each row
    for b in batches:
        assert len(b) == 1 or len(b) * (max(len(s) for s in b) - shared) <= 30


def _turn(prompt, resp):
    return Turn(prompt_ids=prompt, response_ids=resp, logprobs=[-0.5] * len(resp), observation="o", response_text="r")


def test_build_samples_masks_only_model_tokens_per_step_and_full():
    per_step = Trajectory("e", 0, [_turn([1, 2, 3], [7, 8]), _turn([1, 2, 4], [9])], Termination.TERMINATED, context="per_step")
    full = Trajectory("e", 0, [_turn([1, 2, 3], [7, 8, 2]), _turn([5, 6], [9, 2])], Termination.TERMINATED, context="full")
    broken = Trajectory("e", 0, [_turn([1], [3])], Termination.ENV_ERROR)
    s = build_samples([per_step, full, broken], Advantages([[0.5, -1.0], [2.0, 2.0], [1.0]]))
    assert [x.input_ids for x in s] == [[1, 2, 3, 7, 8], [1, 2, 4, 9], [1, 2, 3, 7, 8, 2, 5, 6, 9, 2]]
    assert s[0].loss_mask == [0, 0, 0, 1, 1] and s[0].advantages == [0, 0, 0, 0.5, 0.5]
    assert s[2].loss_mask == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert s[2].behaviour_logprobs == [0, 0, 0, -0.5, -0.5, -0.5, 0, 0, -0.5, -0.5]
    assert all(x.traj_index != 2 for x in s)  # env errors are never trained on


def test_left_padded_keeps_each_suffix_flush_right_and_masks_only_padding():
    from turnrl.models.prefix import left_padded

    rows = [[7, 8, 1, 2, 3], [7, 8, 4], [7, 8]]
    ids, att = left_padded(rows, prefix_len=2, pad_id=0)
    assert ids.shape == (3, 8) and att.shape == (3, 10)  # suffix length 3 rounded up to the 8-bucket
    assert ids[0, -3:].tolist() == [1, 2, 3] and ids[1, -1].item() == 4 and ids[2].eq(0).all()
    assert att[:, :2].eq(1).all()
    assert att.sum(1).tolist() == [5, 3, 2]  # prefix + real tokens, nothing else
