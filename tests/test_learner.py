"""The learner's layout tricks (shared prefix, logits on response positions only, bucketing) are exact, and its
losses (Dr.GRPO's constant normaliser, GSPO, the entropy bonus, the k3 clamp) have the values the formulas give."""

import copy
import dataclasses
import math

import pytest
import torch

from turnrl.config import load_config
from turnrl.learner import Learner, LearnerParams
from turnrl.learner.samples import (build_samples, collate, layout_positions, micro_batches, pack_by_length, prefix_groups,
                                    shared_prefix_len)
from turnrl.models.prefix import prefix_cache
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


def _role_samples(per_role=6, prompt_len=40, seed=3):
    """Two roles' samples, interleaved as a collector returns them: prompts sharing 2 tokens, then each role's own
    40-token system prompt, then an observation and the response."""
    g = torch.Generator().manual_seed(seed)
    roles = [[1, 2] + torch.randint(5, 1000, (prompt_len,), generator=g).tolist() for _ in range(2)]
    out = []
    for i in range(2 * per_role):
        obs = torch.randint(5, 1000, (3 + i % 3,), generator=g).tolist()
        resp = torch.randint(5, 1000, (2 + i % 4,), generator=g).tolist()
        ids = roles[i % 2] + obs + resp
        out.append(TrainSample(ids, [0] * (len(ids) - len(resp)) + [1] * len(resp),
                               [0.0] * len(ids), [0.0] * (len(ids) - len(resp)) + [1.0 - i / 6] * len(resp)))
    return out


def _positions(batches) -> int:
    """Positions the learner runs for these micro-batches: each one's shared prefix once, plus its padded rows."""
    return sum(len(b.prefix) + b.ids.numel() for b in (collate(mb, 0) for mb in batches))


def test_micro_batches_split_samples_by_prompt_where_it_saves_positions():
    samples = _role_samples()
    groups = prefix_groups(samples, token_budget=30)
    assert [[samples.index(s) for s in g] for g in groups] == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]]  # own order
    assert shared_prefix_len(samples) == 2 and [shared_prefix_len(g) for g in groups] == [42, 42]
    batches = micro_batches(samples, token_budget=30)
    assert sorted(id(s) for b in batches for s in b) == sorted(id(s) for s in samples)
    assert all({samples.index(s) % 2 for s in b} in ({0}, {1}) for b in batches)  # a micro-batch holds one role
    mixed = pack_by_length(samples, lambda s: len(s) - 2, 30)  # one group: the prefix all twelve share
    assert _positions(batches) < 0.7 * _positions(mixed)  # 414 against 648
    for layout in (batches, mixed):  # the split rule prices a layout as collate lays it out
        assert sum(map(layout_positions, layout)) == _positions(layout)
    assert micro_batches(samples, token_budget=30, by_prompt=False) == mixed  # train.group_by_prompt=false
    # prompts that part only for a few tokens stay together: more micro-batches would cost more than they save
    barely = _role_samples(prompt_len=2)
    assert prefix_groups(barely, token_budget=10_000) == [barely]
    one_prompt = _samples(n=9)
    assert prefix_groups(one_prompt, token_budget=30) == [one_prompt]


def test_packing_counts_the_padded_shape_and_cuts_where_the_total_is_least():
    import random

    from turnrl.learner.samples import MICRO_BATCH_COST
    from turnrl.models.prefix import bucket_rows, round_up

    def cost(batches):
        return sum(bucket_rows(len(b)) * round_up(max(b), 8) + MICRO_BATCH_COST for b in batches)

    batches = pack_by_length([40] * 58, lambda n: n, 2048)  # fits rows * longest, but would run as 64 rows
    assert all(bucket_rows(len(b)) * 40 <= 2048 for b in batches) and sum(map(len, batches)) == 58
    assert sum(bucket_rows(len(b)) for b in batches) == 60  # 48 + 10 (run as 12), not 58 run as 64
    rng = random.Random(0)
    for _ in range(30):  # against every cut of the sorted items
        items = sorted(rng.randint(1, 60) for _ in range(rng.randint(1, 9)))
        budget = rng.choice([64, 160, 400])
        packed = pack_by_length(items, lambda n: n, budget)
        assert [x for b in packed for x in b] == items
        fits = lambda b: len(b) == 1 or bucket_rows(len(b)) * round_up(max(b), 8) <= budget  # noqa: E731
        assert all(map(fits, packed))
        least = min(cost(c) for c in _cuts(items) if all(map(fits, c)))
        assert cost(packed) == least


def _cuts(items):
    """Every way to cut ``items`` into consecutive non-empty runs."""
    import itertools

    for mask in itertools.product([False, True], repeat=len(items) - 1):
        runs, start = [], 0
        for i, cut in enumerate(mask, 1):
            if cut:
                runs.append(items[start:i])
                start = i
        yield runs + [items[start:]]


def test_prefix_groups_split_again_inside_a_group():
    """Role A plays two maps (a 30-token map description after its prompt), role B one prompt: three groups, each in
    the samples' own order (found although cutting the roles apart alone saves nothing at budget 2048: one group packs
    them into a micro-batch per role anyway), and the layout runs well under the positions of one group."""
    g = torch.Generator().manual_seed(5)
    rand = lambda n: torch.randint(5, 1000, (n,), generator=g).tolist()  # noqa: E731
    role_a, role_b, maps = [1, 2] + rand(40), [1, 2] + rand(40), [rand(30), rand(30)]
    samples = []
    for i in range(18):
        prompt = (role_b if i % 3 == 2 else role_a + maps[i % 3]) + rand(3)
        samples.append(TrainSample(prompt + rand(2), [0] * len(prompt) + [1, 1], [0.0] * (len(prompt) + 2),
                                   [0.0] * len(prompt) + [1.0, 1.0]))
    for budget in (30, 2048):
        groups = prefix_groups(samples, budget)
        assert [[samples.index(s) for s in x] for x in groups] == [list(range(k, 18, 3)) for k in range(3)]
        assert _positions(micro_batches(samples, budget)) < 0.65 * _positions(micro_batches(samples, budget, by_prompt=False))


def test_grouping_by_prompt_leaves_the_gradient_unchanged(tiny_model):
    from tests.test_ddp import _assert_close, _stepped_grads

    samples = _role_samples()
    grads = []
    for by_prompt in (True, False):  # each role in its own micro-batches; both roles mixed (train.group_by_prompt)
        params = _params(lr=1e-3, micro_batch_tokens=30, group_by_prompt=by_prompt)
        assert params.group_by_prompt == by_prompt and _params().group_by_prompt  # on by default
        learner = Learner(copy.deepcopy(tiny_model), params, pad_id=0)
        seen = _stepped_grads(learner)
        learner.update(samples)
        grads.append(seen[-1])
    _assert_close(grads[0], grads[1], 1e-5)


def _shared_prefix_samples(seed=7):
    """Two roles' samples whose prompts share a 20-token start, then part: each role's own 40 tokens after it."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda n: torch.randint(5, 1000, (n,), generator=g).tolist()  # noqa: E731
    start = rand(20)
    roles, out = [start + rand(40), start + rand(40)], []
    for i in range(12):
        prompt, resp = roles[i % 2] + rand(3 + i % 3), rand(2 + i % 4)
        out.append(TrainSample(prompt + resp, [0] * len(prompt) + [1] * len(resp), [0.0] * (len(prompt) + len(resp)),
                               [0.0] * len(prompt) + [1.0 - i / 6] * len(resp)))
    return out


@pytest.mark.parametrize("checkpointed", [False, True])
@pytest.mark.parametrize("prompt_grad", [True, False])
def test_the_prefix_the_batch_shares_runs_once_and_the_gradient_is_unchanged(tiny_model, monkeypatch, checkpointed,
                                                                             prompt_grad):
    import turnrl.learner.learner as learner_module
    from tests.test_ddp import _assert_close, _stepped_grads
    from turnrl.models.recompute import checkpoint_layers

    samples = _shared_prefix_samples()
    assert shared_prefix_len(samples) == 20 and len(micro_batches(samples, 30)) > 2
    runs = []  # prefixes the learner ran itself, one per micro-batch without train.prefix_once
    monkeypatch.setattr(learner_module, "prefix_cache", lambda m, ids: runs.append(len(ids)) or prefix_cache(m, ids))
    grads = []
    for once in (True, False):
        model = copy.deepcopy(tiny_model)
        if checkpointed:
            checkpoint_layers(model)
        learner = Learner(model, _params(lr=1e-3, micro_batch_tokens=30, prefix_once=once, prompt_grad=prompt_grad), pad_id=0)
        seen = _stepped_grads(learner)
        runs.clear()
        learner.update(samples)
        assert (runs == []) == once and learner._shared is None  # every micro-batch served; dropped after the update
        grads.append(seen[-1])
    _assert_close(grads[0], grads[1], 1e-5)


def test_a_data_parallel_learner_runs_the_prefix_per_micro_batch():
    from turnrl.scale.distributed import DataParallelLearner

    assert Learner.shares_batch_prefix and not DataParallelLearner.shares_batch_prefix  # it syncs in the last backward


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


# ------------------------------------------------------------------ the update's loss, against hand computation


def _params(*overrides: str, **fields) -> LearnerParams:
    """Learner parameters from the config (so the config -> params mapping is exercised), lr 0 unless given."""
    params = LearnerParams.from_config(load_config(None, ["model.autocast_bf16=false", *overrides]))
    return dataclasses.replace(params, **{"lr": 0.0, **fields})


def _with_log_ratio(model, samples, log_ratios=None):
    """Set each sample's behaviour logprobs to the model's own minus ``log_ratios[b]`` (one per loss token; 0 = on-policy)."""
    for b, s in enumerate(samples):
        lp = _reference_logprobs(model, s).tolist()
        offsets = log_ratios[b] if log_ratios else [0.0] * len(lp)
        values = iter(x - d for x, d in zip(lp, offsets, strict=True))
        s.behaviour_logprobs = [next(values) if m else 0.0 for m in s.loss_mask]
    return samples


def test_learner_params_from_config():
    p = LearnerParams.from_config(load_config(None, ["env.max_turns=5", "rollout.max_new_tokens=7"]))
    assert p.norm_len == 35.0  # an episode's response-token budget: max_turns * max_new_tokens
    assert p.kl_clamp == 10.0  # on by default, as verl's low_var_kl


def test_seq_mean_token_sum_norm_gives_per_step_and_full_layouts_the_same_loss(tokenizer, tiny_model):
    g = torch.Generator().manual_seed(3)

    def ids(n):
        return torch.randint(5, 1000, (n,), generator=g).tolist()

    turns = [[Turn(ids(4 + t), ids(1 + (i + t) % 3), [0.0] * (1 + (i + t) % 3), "o", "r") for t in range(n)]
             for i, n in enumerate([1, 2, 3])]
    adv = Advantages([[1.0], [-0.5, 0.25], [0.3, -0.7, 0.2]])
    params = _params("algo.loss_agg=seq-mean-token-sum-norm", "env.max_turns=4", "rollout.max_new_tokens=3")
    loss = {}
    for context in ("per_step", "full"):
        trajs = [Trajectory("e", i, ts, Termination.TERMINATED, context=context) for i, ts in enumerate(turns)]
        samples = _with_log_ratio(tiny_model, build_samples(trajs, adv))
        assert len(samples) == (6 if context == "per_step" else 3)
        loss[context] = Learner(tiny_model, params, tokenizer.pad_token_id).update(samples)["train/loss"]
    # ratio 1, so the loss is -sum of A over response tokens / (3 episodes * 4 turns * 3 tokens), in either layout
    token_sum = sum(a * len(turn.response_ids) for ts, row in zip(turns, adv.turns) for turn, a in zip(ts, row))
    assert loss["per_step"] == pytest.approx(-token_sum / 36, rel=1e-5)
    assert loss["full"] == pytest.approx(-token_sum / 36, rel=1e-5)


def test_gspo_in_the_learner_uses_each_sequences_hand_computed_ratio(tokenizer, tiny_model):
    samples = _samples(n=3)  # responses of 2, 3, 4 tokens with advantages 1, 2, 3
    deltas = [[0.1, -0.3], [0.2, 0.2, -0.1], [0.05, 0.0, 0.3, -0.2]]
    _with_log_ratio(tiny_model, samples, deltas)
    params = _params("algo.ratio_level=sequence", clip_low=0.9, clip_high=10.0)
    m = Learner(tiny_model, params, tokenizer.pad_token_id).update(samples)
    s = [math.exp(sum(d) / len(d)) for d in deltas]  # GSPO: exp(mean token log-ratio), the same on every token
    n = [len(d) for d in deltas]
    assert m["train/ratio_mean"] == pytest.approx(sum(si * ni for si, ni in zip(s, n)) / 9, rel=1e-5)
    assert m["train/ratio_max"] == pytest.approx(max(s), rel=1e-5)
    assert m["train/loss"] == pytest.approx(-sum(si * ni * (1 + b) for b, (si, ni) in enumerate(zip(s, n))) / 9, rel=1e-5)


def test_entropy_bonus_is_subtracted_and_its_step_raises_the_entropy(tokenizer, tiny_model):
    samples = _with_log_ratio(tiny_model, _samples(n=3))
    for s in samples:
        s.advantages = [0.0] * len(s)  # the bonus is the whole loss
    learner = Learner(tiny_model, _params(entropy_coef=0.5, lr=1e-3), tokenizer.pad_token_id)
    first = learner.update(samples)
    assert first["train/loss"] == pytest.approx(-0.5 * first["train/entropy"], rel=1e-6)
    second = learner.update(samples)  # its entropy is measured after the first step
    assert second["train/entropy"] > first["train/entropy"]


def test_the_learner_clamps_k3_by_default(tokenizer, tiny_model):
    ref = copy.deepcopy(tiny_model)
    with torch.no_grad():
        ref.model.norm.weight.mul_(300.0)  # a sharply peaked reference
    ids = torch.randint(5, 1000, (8,), generator=torch.Generator().manual_seed(4)).tolist()
    for _ in range(3):  # respond with the reference's greedy tokens: p_ref ~ 1 where the policy is near uniform
        with torch.no_grad():
            ids.append(int(ref(torch.tensor([ids])).logits[0, -1].argmax()))
    sample = TrainSample(ids, [0] * 8 + [1] * 3, [0.0] * 11, [0.0] * 11)
    _with_log_ratio(tiny_model, [sample])
    params = _params("model.reference=true", "algo.kl_coef=0.1")
    clamped = Learner(tiny_model, params, tokenizer.pad_token_id, ref_model=ref).update([sample])
    raw = Learner(tiny_model, dataclasses.replace(params, kl_clamp=0.0), tokenizer.pad_token_id, ref_model=ref).update([sample])
    assert raw["train/kl"] > 1e3  # p_ref / p ~ vocabulary size
    assert clamped["train/kl"] == pytest.approx(10.0) and math.isfinite(clamped["train/grad_norm"])
