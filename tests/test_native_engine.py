"""The native engine: equality with HF greedy decoding, exact logprobs, cache reuse across turns, scheduling."""

import asyncio

import pytest
import torch

from turnrl.engines import HFEngine, SamplingParams, make_engine
from turnrl.engines.native import NativeEngine, UnsupportedModelError
from turnrl.envs import make
from turnrl.agent import ContextSpec
from turnrl.rollout import Collector
from turnrl.models.prefix import common_prefix_len

from tests.test_engine import _hf_greedy, _prompts

GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)


def _bound_ticks(engine: NativeEngine, limit: int) -> None:
    """Make ``engine`` fail its requests after ``limit`` ticks: a scheduler that stops making progress fails the test
    instead of hanging it."""
    tick = engine._tick

    def bounded() -> None:
        if engine.counters["ticks"] >= limit:
            raise RuntimeError(f"no progress after {limit} ticks: {len(engine._waiting)} waiting, {len(engine._running)} running")
        tick()

    engine._tick = bounded


def _recomputed_logprobs(model, prompt, completion, temperature):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_greedy_equals_hf_generate_fp32(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=8, max_len=512)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0.0))
    for p, o in zip(prompts, outs):
        assert o.token_ids == _hf_greedy(tiny_model, p, 8)[: len(o.token_ids)]
    assert engine.counters["reused_tokens"] > 0  # the shared head came from the prefix store


def test_logprobs_match_learner_recomputation_fp32(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=512, seed=3)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.7))
    diffs = [(_recomputed_logprobs(tiny_model, p, o.token_ids, 0.7) - torch.tensor(o.logprobs)).abs().mean().item()
             for p, o in zip(prompts, outs)]
    assert max(diffs) <= 1e-4


def test_bf16_logprobs_are_close(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = NativeEngine(tiny_model, tokenizer, dtype="bf16", max_len=512, seed=3)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=1.0))
    diffs = [(_recomputed_logprobs(tiny_model, p, o.token_ids, 1.0) - torch.tensor(o.logprobs)).abs().mean().item()
             for p, o in zip(prompts, outs)]
    assert max(diffs) < 0.05  # bf16 weights and activations; the measured figure is in bench/RESULTS.md


@pytest.mark.parametrize("dtype,tol", [("fp32", 1e-4), ("bf16", 0.05)])
def test_packed_weights_change_no_result(tokenizer, tiny_model, dtype, tol):
    """oneDNN-packed weights are a layout, not an approximation: same greedy tokens, logprobs within the dtype's noise."""
    prompts = _prompts(tokenizer)
    packed = NativeEngine(tiny_model, tokenizer, dtype=dtype, max_len=512)
    plain = NativeEngine(tiny_model, tokenizer, dtype=dtype, max_len=512, packed_weights=False)
    if not packed.packed_weights:
        pytest.skip("this torch build has no oneDNN weight packing")
    assert packed._w.lm_head.is_mkldnn and not plain._w.lm_head.is_mkldnn
    a = packed.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    b = plain.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert max(abs(x - y) for oa, ob in zip(a, b) for x, y in zip(oa.logprobs, ob.logprobs)) <= tol


def test_prefill_in_row_chunks_changes_no_result(tokenizer, tiny_model):
    prompts = _prompts(tokenizer) * 2
    sp = SamplingParams(max_new_tokens=5, temperature=0.0)
    whole = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=16).generate(prompts, sp)
    chunked_engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=16, prefill_tokens=8)
    calls = []
    real = chunked_engine._forward
    # prefill rows (more than one new token) per pass; decode rows ride along in the first chunk's pass
    chunked_engine._forward = lambda slots, news, *a, **k: calls.append(sum(len(n) > 1 for n in news)) or real(slots, news, *a, **k)
    chunked = chunked_engine.generate(prompts, sp)
    assert calls and max(calls) == 1  # one prompt per prefill pass
    for a, b in zip(whole, chunked):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_extended_cache_gives_the_logits_of_a_fresh_prefill(tokenizer, tiny_model):
    """Turn 1 in a sequence, then observation tokens appended: the logits equal a fresh prefill of everything."""
    p = _prompts(tokenizer)[0]
    obs = tokenizer("<|im_end|>\n<|im_start|>user\nFFPH\nFHFF<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=512)
    seq = engine.open()
    first = asyncio.run(engine.agenerate(seq, p, GREEDY))
    convo = p + first.token_ids + obs
    before = engine.counters["prefill_tokens"]
    slot = engine._seqs[seq].slot
    logits = engine._forward([slot], [convo[len(p) + len(first.token_ids) - 1 :]], [len(p) + len(first.token_ids) - 1])
    assert engine.counters["prefill_tokens"] == before
    fresh = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=512)
    s2 = fresh.open()
    fresh._assign_slot(fresh._seqs[s2])
    ref = fresh._forward([fresh._seqs[s2].slot], [convo], [0])
    with torch.no_grad():
        hf = tiny_model(torch.tensor([convo])).logits[0, -1]
    assert torch.allclose(logits[0], ref[0], atol=1e-4)
    assert torch.allclose(logits[0], hf, atol=1e-4)


def test_second_turn_prefills_only_the_new_tokens(tokenizer, tiny_model):
    p = _prompts(tokenizer)[1]
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=512)
    seq = engine.open()
    first = asyncio.run(engine.agenerate(seq, p, GREEDY))
    obs = tokenizer("\nnext observation\n", add_special_tokens=False)["input_ids"]
    before = engine.counters["prefill_tokens"]
    second = asyncio.run(engine.agenerate(seq, p + first.token_ids + obs, GREEDY))
    assert engine.counters["prefill_tokens"] - before == len(obs) + 1  # the last sampled token was never fed
    assert second.token_ids == _hf_greedy(tiny_model, p + first.token_ids + obs, 6)[: len(second.token_ids)]


def test_rows_do_not_depend_on_batch_company(tokenizer, tiny_model):
    """Each sequence has its own generator: alone or batched with others, it samples the same tokens."""
    prompts = _prompts(tokenizer)
    params = SamplingParams(max_new_tokens=5, temperature=1.0)
    batched = NativeEngine(tiny_model, tokenizer, dtype="fp32", seed=7).generate(prompts, params)
    for i, p in enumerate(prompts):
        engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", seed=7)
        for _ in range(i):
            engine.open()  # same opening order as in the batch
        assert engine.generate([p], params)[0].token_ids == batched[i].token_ids


def test_eviction_when_slots_run_out(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=2, max_len=512)
    seqs = [engine.open() for _ in prompts]

    async def turns():
        return await asyncio.gather(*(engine.agenerate(s, p, GREEDY) for s, p in zip(seqs, prompts)))

    outs = asyncio.run(turns())
    for p, o in zip(prompts, outs):
        assert o.token_ids == _hf_greedy(tiny_model, p, 6)[: len(o.token_ids)]
    assert engine.counters["evictions"] >= 2


@pytest.mark.parametrize("slots,tasks", [(3, 3), (6, 8)])
def test_multi_turn_sessions_outnumbering_slots_all_finish(tokenizer, tiny_model, slots, tasks):
    """Full-context episodes (2 per task) on fewer slots (issue 16: 6 on 3 and 16 on 6 never finished): a sequence
    that holds a slot is never stuck behind a request that has none, and every evicted conversation is recomputed
    to the tokens it has with a slot of its own."""
    env_factory = lambda: make("frozenlake-v0", max_turns=4)  # noqa: E731
    ctx, params = ContextSpec(strategy="full"), SamplingParams(max_new_tokens=4, temperature=0.0)
    roomy = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=2 * tasks, max_len=1024)
    ref = Collector(roomy, tokenizer, env_factory, ctx).collect(list(range(tasks)), 2, params)
    tight = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=slots, max_len=1024)
    _bound_ticks(tight, 2 * tasks * 4 * 4)  # each tick samples a token: at most episodes x turns x max_new_tokens
    got = Collector(tight, tokenizer, env_factory, ctx).collect(list(range(tasks)), 2, params)
    assert tight.counters["evictions"] > 0 and roomy.counters["evictions"] == 0
    for gr, gg in zip(ref, got):
        for a, b in zip(gr.trajectories, gg.trajectories):
            assert len(a.turns) == len(b.turns) == 4
            assert [t.response_ids for t in a.turns] == [t.response_ids for t in b.turns]
            assert max(abs(x - y) for ta, tb in zip(a.turns, b.turns) for x, y in zip(ta.logprobs, tb.logprobs)) < 1e-4


def test_a_request_without_a_slot_is_served_first_come_first_served(tokenizer, tiny_model):
    """Two sessions hold both slots and submit their next turn the moment one ends, so neither is ever idle; a
    third session's request, which came first, takes the slot of one queued behind it instead of waiting for
    their episodes to end."""
    prompts = _prompts(tokenizer)
    obs = tokenizer("\nnext\n", add_special_tokens=False)["input_ids"]
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_slots=2, max_len=1024)
    _bound_ticks(engine, 400)
    served: list[str] = []
    first_turn_done = asyncio.Event()

    async def session(name: str, prompt: list[int], turns: int, after: asyncio.Event | None = None) -> None:
        seq = engine.open()
        if after is not None:
            await after.wait()
        for _ in range(turns):
            out = await engine.agenerate(seq, prompt, GREEDY)
            served.append(name)
            first_turn_done.set()
            prompt = prompt + out.token_ids + obs

    async def run() -> None:
        await asyncio.gather(session("a", prompts[0], 8), session("b", prompts[1], 8),
                             session("late", prompts[2], 1, after=first_turn_done))

    asyncio.run(run())
    assert served.index("late") <= 4  # the busy sessions got at most two more turns each meanwhile
    assert served.count("a") == served.count("b") == 8
    assert engine.counters["evictions"] >= 1


def _long_head_prompts(tokenizer) -> list[list[int]]:
    """Chat prompts whose shared head (a long system prompt) is longer than the engine's initial cache (256)."""
    system = [{"role": "system", "content": "You play a grid game. Answer with Left, Down, Right or Up. " * 30}]
    chats = [tokenizer.apply_chat_template(system + [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in ("PFFH\nFHFF", "SFFF\nFHPH", "hello")]
    return [tokenizer(c, add_special_tokens=False)["input_ids"] for c in chats]


def test_a_long_shared_head_serves_two_collections_at_one_weight_version(tokenizer, tiny_model):
    """Issue 25: a step-0 evaluation, then a training step at the same weights. The first collection stored a head
    longer than the cache's initial size; when its last sequence closed the cache shrank back, and the second
    collection's copy of the stored head into a slot raised (expanded size 257 vs 548 with searchqa's prompts)."""
    prompts = _long_head_prompts(tokenizer)
    assert min(len(p) for p in prompts) > 300
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=1024)
    first = engine.generate(prompts, GREEDY)
    assert engine.counters["reused_tokens"] > 2 * 256  # the head was stored once and copied into the other slots
    second = engine.generate(prompts, GREEDY)
    assert [(o.token_ids, o.logprobs) for o in second] == [(o.token_ids, o.logprobs) for o in first]
    assert [o.token_ids for o in second] == [_hf_greedy(tiny_model, p, 6)[: len(o.token_ids)] for p, o in zip(prompts, second)]


def test_a_collection_does_not_depend_on_the_one_before(tokenizer, tiny_model):
    """What a collection samples does not depend on what the engine ran before at the same weights (an evaluation
    before a training step): it starts from an empty cache and an empty prefix store."""
    prompts = _prompts(tokenizer)
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    fresh = NativeEngine(tiny_model, tokenizer, dtype="bf16", seed=4)
    for _ in range(2):
        fresh.open()  # the same opening order (hence sample keys) as below
    alone = fresh.generate(prompts[2:], params)
    engine = NativeEngine(tiny_model, tokenizer, dtype="bf16", seed=4)
    engine.generate([prompts[0], prompts[0][:-1] + prompts[1][-1:]], params)  # stores a longer head than the one below
    after = engine.generate(prompts[2:], params)
    assert [(o.token_ids, o.logprobs) for o in after] == [(o.token_ids, o.logprobs) for o in alone]


def _family(tokenizer, system: str) -> list[list[int]]:
    """Three prompts that share a system prompt (a role's prompts in a multi-agent env)."""
    return [tokenizer(tokenizer.apply_chat_template([{"role": "system", "content": system * 3}, {"role": "user", "content": q}],
                                                    add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
            for q in ("PFFH\nFHFF", "SFFF\nFHPH", "which way?")]


def test_calls_that_alternate_between_two_prompt_families_compute_each_head_once(tokenizer, tiny_model):
    """The prefix store keeps a head across calls at the same weights (a planner's and an executor's calls alternate),
    and what a call samples is what a fresh engine samples for it; new weights drop the stored heads."""
    planner = _family(tokenizer, "You set subgoals on a grid. Answer GOAL <row> <col>. ")
    executor = _family(tokenizer, "You walk a grid. Answer with Left, Down, Right or Up. ")
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    engine = NativeEngine(tiny_model, tokenizer, dtype="bf16", seed=4)
    for family in (planner, executor):
        engine.generate(family, params)
    prefilled = engine.counters["prefill_tokens"]
    opened = engine._opened
    again = [engine.generate(family, params) for family in (planner, executor)]
    new_tokens = sum(len(p) - common_prefix_len(family) for family in (planner, executor) for p in family)
    assert engine.counters["prefill_tokens"] - prefilled == new_tokens  # no head computed again
    for family, out in zip((planner, executor), again):
        fresh = NativeEngine(tiny_model, tokenizer, dtype="bf16", seed=4)
        for _ in range(opened if family is planner else opened + len(planner)):
            fresh.open()  # the same sample keys as the call above
        alone = fresh.generate(family, params)
        assert [(o.token_ids, o.logprobs) for o in out] == [(o.token_ids, o.logprobs) for o in alone]
    engine.sync_weights()
    prefilled = engine.counters["prefill_tokens"]
    engine.generate(planner, params)
    head = common_prefix_len(planner)
    assert engine.counters["prefill_tokens"] - prefilled == head + sum(len(p) - head for p in planner)  # computed anew


def _llama_with_biases(tokenizer):
    """A tiny Llama whose attention (q, k, v, o) and MLP (gate, up, down) projections all carry non-zero biases."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, attention_bias=True, mlp_bias=True,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.normal_(0.0, 0.5)
    return model


def test_attention_and_mlp_biases_are_computed(tokenizer):
    """Issue 16: MLP biases were dropped, so ``engine=auto`` sampled a Llama with ``mlp_bias=True`` from the wrong
    distribution. Greedy tokens and their logprobs now match the HF engine's."""
    model = _llama_with_biases(tokenizer)
    prompts = _prompts(tokenizer)
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    native = NativeEngine(model, tokenizer, dtype="fp32", max_len=512).generate(prompts, params)
    ref = HFEngine(model, tokenizer).generate(prompts, params)
    assert [o.token_ids for o in native] == [o.token_ids for o in ref]
    assert max(abs(x - y) for a, b in zip(native, ref) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5


def test_a_parameter_the_forward_pass_does_not_read_refuses_the_model(tokenizer, tiny_model):
    """A weight outside what the native forward pass computes (here a per-head query norm, as Qwen3 has) refuses the
    model instead of being ignored, and ``engine=auto`` falls back to the HF engine."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    tiny_model.model.layers[1].self_attn.q_norm = LlamaRMSNorm(16)
    with pytest.raises(UnsupportedModelError, match=r"model\.layers\.1\.self_attn\.q_norm\.weight.*engine=hf"):
        NativeEngine(tiny_model, tokenizer)
    assert isinstance(make_engine("auto", tiny_model, tokenizer), HFEngine)


def test_stop_strings_tokens_and_sync(tokenizer, tiny_model):
    prompts = _prompts(tokenizer)
    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32")
    first = engine.generate(prompts, SamplingParams(max_new_tokens=3, temperature=0.0))
    stop_tok = first[0].token_ids[1]
    out = engine.generate(prompts[:1], SamplingParams(max_new_tokens=3, temperature=0.0, stop_token_ids=(stop_tok,)))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == stop_tok
    text = tokenizer.decode(first[0].token_ids[:2])
    out = engine.generate(prompts[:1], SamplingParams(max_new_tokens=3, temperature=0.0, stop_strings=(text,)))[0]
    assert out.finish_reason == "stop" and len(out.token_ids) <= 2
    with torch.no_grad():
        tiny_model.lm_head.weight.mul_(-1.0)  # the learner changed; the engine samples the new weights after sync
    engine.sync_weights()
    changed = engine.generate(prompts, SamplingParams(max_new_tokens=3, temperature=0.0))
    assert changed[0].version == 1
    assert [c.token_ids for c in changed] == [_hf_greedy(tiny_model, p, 3)[: len(c.token_ids)] for p, c in zip(prompts, changed)]


def test_rejects_unsupported_models_and_long_prompts(tokenizer, tiny_model):
    tiny_model.config.model_type = "gpt2"
    with pytest.raises(UnsupportedModelError, match="engine=hf"):
        NativeEngine(tiny_model, tokenizer)
    tiny_model.config.model_type = "llama"
    engine = NativeEngine(tiny_model, tokenizer, max_len=32)
    with pytest.raises(ValueError, match="max_len"):
        engine.generate([list(range(40))], GREEDY)


@pytest.mark.parametrize("context", ["per_step", "full"])
def test_collector_with_native_engine_matches_hf_engine_greedy(tokenizer, tiny_model, context):
    """Same greedy episodes through the lock-step HF path and the continuous native path."""
    ctx = ContextSpec(strategy=context)
    env_factory = lambda: make("frozenlake-v0", max_turns=3)  # noqa: E731
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    ref = Collector(HFEngine(tiny_model, tokenizer), tokenizer, env_factory, ctx).collect([0, 1], 2, params)
    native = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=1024)
    got = Collector(native, tokenizer, env_factory, ctx).collect([0, 1], 2, params)
    for gr, gg in zip(ref, got):
        for a, b in zip(gr.trajectories, gg.trajectories):
            assert [t.prompt_ids for t in a.turns] == [t.prompt_ids for t in b.turns]
            assert [t.response_ids for t in a.turns] == [t.response_ids for t in b.turns]
            assert a.termination == b.termination
    if context == "full":  # every turn after the first prefilled only the env's answer
        assert native.counters["reused_tokens"] > native.counters["prefill_tokens"]


def test_default_threads_keep_an_omp_num_threads_the_user_set(monkeypatch):
    """``train.threads=0`` means all cores, unless the user pinned fewer with ``$OMP_NUM_THREADS`` (torch's convention):
    two runs started side by side with OMP_NUM_THREADS=1 must not each take every core."""
    from turnrl.engines.native.model import machine_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = machine_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert machine_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", str(cores + 8))  # more than the machine has: the machine's count
    assert machine_threads() == cores
    monkeypatch.setenv("OMP_NUM_THREADS", "banana")  # not a count: ignored
    assert machine_threads() == cores


def test_released_weights_come_back_at_the_sync_and_sample_as_if_never_freed(tokenizer, tiny_model):
    """The loop frees the engine's weights and cache for the update (loop.learn); the sync reads them in again."""
    prompts = [tokenizer.encode(f"Walk {i} steps to the goal.") for i in range(3)]
    params = SamplingParams(max_new_tokens=5, temperature=1.0)
    kept, freed = (NativeEngine(tiny_model, tokenizer, dtype="fp32", seed=7) for _ in range(2))
    assert [c.token_ids for c in kept.generate(prompts, params)] == [c.token_ids for c in freed.generate(prompts, params)]
    freed.release_weights()
    assert freed._w is None and freed._k == [] and freed._v == []
    with pytest.raises(RuntimeError, match="sync_weights"):  # raised before anything is queued or a key is drawn
        freed.generate(prompts, params)
    with torch.no_grad():  # the learner's update
        for p in tiny_model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    kept.sync_weights()
    freed.sync_weights()
    assert freed.version == kept.version == 1
    again, reference = freed.generate(prompts, params), kept.generate(prompts, params)
    assert [(c.token_ids, c.logprobs) for c in again] == [(c.token_ids, c.logprobs) for c in reference]
