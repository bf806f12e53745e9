"""VLLMEngine's contract with vLLM, with vLLM replaced only at its import boundary.

A fake ``vllm`` module is put in ``sys.modules``. It exposes what the engine relies on, with vLLM's real
names and signatures: ``LLM(model=..., **engine_args)`` with ``generate(prompts, sampling_params=,
use_tqdm=)``, ``reset_prefix_cache()``, ``collective_rpc(method, timeout=, args=, kwargs=)``, ``sleep`` /
``wake_up`` and the in-process chain ``llm_engine.model_executor.driver_worker.worker.model_runner.model``;
``SamplingParams`` as a keyword dataclass with vLLM's field names (a misspelt field is a TypeError);
``TokensPrompt`` as a TypedDict; ``RequestOutput`` / ``CompletionOutput`` / ``Logprob`` outputs whose
per-step logprob dicts hold the sampled token *and* the top-1 token, as vLLM's do. Behind it runs a real
tiny Hugging Face model with vLLM's ``processed_logprobs`` semantics, so the engine can be compared with
the HF reference engine on the same weights.
"""

import sys
import types
from dataclasses import dataclass, field
from typing import TypedDict

import pytest
import torch

from turnrl.engines import Engine, HFEngine, SamplingParams
from turnrl.engines.vllm_engine import VLLMEngine
from turnrl.models.prefix import forward


# ---- the fake vllm module ---------------------------------------------------------------------------
@dataclass(kw_only=True)
class FakeSamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    max_tokens: int | None = 16
    logprobs: int | None = None
    detokenize: bool = True


class FakeTokensPrompt(TypedDict):
    prompt_token_ids: list[int]


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


class _Chain:
    """``llm_engine.model_executor.driver_worker.worker.model_runner.model`` and ``model_config``."""

    def __init__(self, model, logprobs_mode):
        self.model_config = types.SimpleNamespace(logprobs_mode=logprobs_mode)
        runner = types.SimpleNamespace(model=model)
        self.worker = types.SimpleNamespace(model_runner=runner)
        self.model_executor = types.SimpleNamespace(driver_worker=types.SimpleNamespace(worker=self.worker))


class FakeVLLMModel(torch.nn.Module):
    """vLLM's model wrapper: ``load_weights(weights)`` takes (HF name, tensor) pairs, returns loaded names."""

    def __init__(self, hf_model):
        super().__init__()
        self.hf = hf_model
        self.loaded: list[str] = []

    def load_weights(self, weights):
        params = self.hf.state_dict()
        names = set()
        with torch.no_grad():
            for name, tensor in weights:
                params[name].copy_(tensor)
                names.add(name)
                self.loaded.append(name)
        return names


class FakeLLM:
    instances: list["FakeLLM"] = []

    def __init__(self, model=None, *, hf_model=None, tokenizer=None, logprobs_mode="raw_logprobs", in_process=True, **engine_args):
        if hf_model is None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            hf_model = AutoModelForCausalLM.from_pretrained(model)
            tokenizer = AutoTokenizer.from_pretrained(model)
        self.model_arg, self.engine_args = model, engine_args
        self.model = FakeVLLMModel(hf_model.eval())
        self.tokenizer = tokenizer
        self.llm_engine = _Chain(self.model, logprobs_mode)
        if not in_process:  # a multiprocess engine: no model object in this process
            del self.llm_engine.model_executor
        self.calls: list[tuple[list, list]] = []
        self.prefix_resets = 0
        self.rpcs: list[tuple] = []
        self.sleeping = None
        FakeLLM.instances.append(self)

    def generate(self, prompts, sampling_params=None, use_tqdm=True, lora_request=None):
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params] * len(prompts)
        self.calls.append((prompts, sampling_params))
        outs = [None] * len(prompts)
        for i in reversed(range(len(prompts))):  # the scheduler's order is not the input order...
            outs[i] = RequestOutput(str(i), prompts[i]["prompt_token_ids"], [self._one(prompts[i]["prompt_token_ids"], sampling_params[i])])
        return outs  # ...but LLM.generate returns outputs in input order

    @torch.no_grad()
    def _one(self, prompt, sp: FakeSamplingParams) -> CompletionOutput:
        gen = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else None
        ids, steps = [], []
        finish, reason = "length", None
        stops = [sp.stop] if isinstance(sp.stop, str) else list(sp.stop or [])
        past, step_input = None, torch.tensor([prompt])
        for _ in range(sp.max_tokens):
            out, past = forward(self.model.hf, past, input_ids=step_input, use_cache=True, logits_to_keep=1)
            logits = out.logits[0, -1].float()
            greedy = sp.temperature < 1e-5
            logits = logits / (1.0 if greedy else sp.temperature)  # vLLM divides greedy rows by 1
            if sp.top_k > 0:
                kth = torch.topk(logits, sp.top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            logp = torch.log_softmax(logits, -1)  # processed_logprobs
            tok = int(logits.argmax()) if greedy else int(torch.multinomial(logp.exp(), 1, generator=gen))
            top = int(logp.argmax())
            step = {top: Logprob(float(logp[top]), 1)}  # the top-1 entry comes first, then the sampled one
            step[tok] = Logprob(float(logp[tok]), int((logp > logp[tok]).sum()) + 1)
            ids.append(tok)
            steps.append(step)
            step_input = torch.tensor([[tok]])
            if tok == self.tokenizer.eos_token_id:
                finish = "stop"
                break
            if tok in (sp.stop_token_ids or []):
                finish, reason = "stop", tok
                break
            hit = next((s for s in stops if s in self.tokenizer.decode(ids)), None)
            if hit is not None:
                finish, reason = "stop", hit
                break
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return CompletionOutput(0, text, ids, sum(float(s[t].logprob) for s, t in zip(steps, ids)), steps if sp.logprobs is not None else None,
                                finish, reason)

    def reset_prefix_cache(self, reset_running_requests=False):
        self.prefix_resets += 1
        return True

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.rpcs.append((method, args, kwargs))
        worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=self.model))
        return [method(worker, *args, **(kwargs or {}))]

    def sleep(self, level=1):
        self.sleeping = level

    def wake_up(self, tags=None):
        self.sleeping = None


@pytest.fixture
def model(tiny_model):
    """The tiny model with weights spread out enough that different prompts get different greedy answers."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    return tiny_model


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams, mod.TokensPrompt = FakeLLM, FakeSamplingParams, FakeTokensPrompt
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setattr(FakeLLM, "instances", [])
    return mod


def _prompts(tokenizer):
    head = [{"role": "system", "content": "You play a grid game. Answer with Left, Down, Right or Up. " * 2}]
    qs = ["PFFH\nFHFF\nFFFG", "SFFF\nFHPH\nwhich way?", "hello", "What is 2+2?"]
    return [tokenizer(tokenizer.apply_chat_template(head + [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False),
                      add_special_tokens=False)["input_ids"] for q in qs]


def _llm(model, tokenizer, **kw):
    kw.setdefault("logprobs_mode", "processed_logprobs")
    return FakeLLM(hf_model=model, tokenizer=tokenizer, **kw)


# ---- the contract -------------------------------------------------------------------------------------
def test_greedy_ids_and_logprobs_match_the_hf_engine_in_input_order(fake_vllm, tokenizer, model):
    prompts = _prompts(tokenizer)
    engine = VLLMEngine(llm=_llm(model, tokenizer))
    assert isinstance(engine, Engine)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    got = engine.generate(prompts, params)
    ref = HFEngine(model, tokenizer).generate(prompts, params)
    assert len({tuple(o.token_ids) for o in ref}) > 1  # rows differ, so an order mix-up would show
    for g, r in zip(got, ref):
        assert g.token_ids == r.token_ids and g.finish_reason == r.finish_reason and g.version == 0
        assert max(abs(a - b) for a, b in zip(g.logprobs, r.logprobs)) < 1e-4


def test_sampled_logprob_is_the_sampled_tokens_temperature_scaled_one(fake_vllm, tokenizer, model):
    prompts = _prompts(tokenizer)
    engine = VLLMEngine(llm=_llm(model, tokenizer), seed=3)
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.7))
    for p, o in zip(prompts, outs):
        with torch.no_grad():
            logits = model(torch.tensor([p + o.token_ids])).logits[0, len(p) - 1 : -1].float() / 0.7
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(o.token_ids)[:, None]).squeeze(-1)
        # not the top-1 entry's logprob: where the sampled token is not the argmax the two differ by far more than
        # 1e-3; the tolerance covers batched vs single-row fp32 sums (1e-4 missed by a hair with other thread counts)
        assert torch.allclose(lp, torch.tensor(o.logprobs), atol=1e-3)


def test_requests_carry_exact_ids_our_sampling_fields_and_per_request_seeds(fake_vllm, tokenizer, model):
    llm = _llm(model, tokenizer)
    engine = VLLMEngine(llm=llm, seed=5)
    prompts = _prompts(tokenizer)
    engine.generate(prompts, SamplingParams(max_new_tokens=2, temperature=0.9, top_p=0.95, top_k=40, stop_token_ids=(7,), stop_strings=("\n",)))
    sent, sps = llm.calls[0]
    assert [r["prompt_token_ids"] for r in sent] == prompts
    sp = sps[0]
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.stop, sp.stop_token_ids) == (2, 0.9, 0.95, 40, ["\n"], [7])
    assert sp.include_stop_str_in_output and sp.logprobs == 0 and sp.n == 1
    assert len({s.seed for s in sps}) == len(prompts)
    again = VLLMEngine(llm=llm, seed=5)
    again.generate(prompts, SamplingParams(max_new_tokens=1, temperature=0.9))
    assert [s.seed for s in llm.calls[1][1]] == [s.seed for s in sps]


def test_same_seed_same_samples_and_state_roundtrip(fake_vllm, tokenizer, model):
    prompts = _prompts(tokenizer)[:2]
    params = SamplingParams(max_new_tokens=3, temperature=1.0)
    a = VLLMEngine(llm=_llm(model, tokenizer), seed=1)
    state = a.state_dict()
    first = [o.token_ids for o in a.generate(prompts, params)]
    a.load_state_dict(state)
    assert [o.token_ids for o in a.generate(prompts, params)] == first


def test_stop_tokens_strings_and_length(fake_vllm, tokenizer, model):
    prompts = _prompts(tokenizer)[:1]
    engine = VLLMEngine(llm=_llm(model, tokenizer))
    free = engine.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0))[0]
    assert free.finish_reason == "length" and len(free.token_ids) == 4
    stop_tok = free.token_ids[1]
    out = engine.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0, stop_token_ids=(stop_tok,)))[0]
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: free.token_ids.index(stop_tok) + 1]
    assert len(out.logprobs) == len(out.token_ids) and out.stats["stop_reason"] == stop_tok
    piece = tokenizer.decode(free.token_ids[2:3])
    out = engine.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0, stop_strings=(piece,)))[0]
    assert out.finish_reason == "stop" and piece in tokenizer.decode(out.token_ids)  # the stop string's tokens are kept


def test_sync_loads_learner_tensors_by_name_resets_cache_and_bumps_version(fake_vllm, tokenizer, model):
    prompts = _prompts(tokenizer)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    serving_copy = type(model)(model.config)
    serving_copy.load_state_dict(model.state_dict())
    learner = model  # the learner trains its own module...
    llm = _llm(serving_copy, tokenizer)  # ...the engine serves a separate copy, as vLLM does
    engine = VLLMEngine(llm=llm, learner_model=learner)
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(torch.randn_like(p) * 0.5)  # a "training step"
    stale = engine.generate(prompts, params)
    want = HFEngine(learner, tokenizer).generate(prompts, params)
    assert [o.token_ids for o in stale] != [o.token_ids for o in want]
    engine.sync_weights()
    assert engine.version == 1 and llm.prefix_resets == 1
    assert set(llm.model.loaded) == set(learner.state_dict())
    fresh = engine.generate(prompts, params)
    assert [o.token_ids for o in fresh] == [o.token_ids for o in want] and all(o.version == 1 for o in fresh)
    for name, t in learner.state_dict().items():
        assert torch.equal(serving_copy.state_dict()[name], t)


def test_sync_goes_through_collective_rpc_when_vllm_runs_out_of_process(fake_vllm, tokenizer, model):
    llm = _llm(model, tokenizer, in_process=False)
    named = [("model.norm.weight", torch.full_like(model.model.norm.weight, 2.0))]
    engine = VLLMEngine(llm=llm, weights=lambda: named)
    engine.sync_weights()
    (method, args, kwargs), = llm.rpcs
    assert callable(method) and kwargs == {"weights": named}
    assert torch.all(model.model.norm.weight == 2.0) and engine.version == 1 and llm.prefix_resets == 1


def test_sync_without_a_weight_source_names_the_fix(fake_vllm, tokenizer, model):
    engine = VLLMEngine(llm=_llm(model, tokenizer))
    with pytest.raises(RuntimeError, match="pass learner_model="):
        engine.sync_weights()
    assert engine.version == 0


def test_raw_logprobs_llm_is_refused(fake_vllm, tokenizer, model):
    with pytest.raises(ValueError, match="logprobs_mode='raw_logprobs'.*processed_logprobs"):
        VLLMEngine(llm=_llm(model, tokenizer, logprobs_mode="raw_logprobs"))


def _unset_multiprocessing_env(monkeypatch):
    """Unset VLLM_ENABLE_V1_MULTIPROCESSING for this test and leave it as it was afterwards."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "unset-me")  # records the original state for undo
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING")


def test_engine_builds_the_llm_with_processed_logprobs_in_process(fake_vllm, tokenizer, model, tmp_path, monkeypatch):
    _unset_multiprocessing_env(monkeypatch)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    engine = VLLMEngine(str(tmp_path), seed=4, gpu_memory_utilization=0.3, enable_sleep_mode=True)
    llm = FakeLLM.instances[-1]
    assert llm.model_arg == str(tmp_path) and llm.engine_args == {"seed": 4, "gpu_memory_utilization": 0.3, "enable_sleep_mode": True}
    import os

    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    out = engine.generate(_prompts(tokenizer)[:1], SamplingParams(max_new_tokens=2, temperature=0.0))[0]
    assert len(out.token_ids) == 2
    engine.sleep(level=1)
    assert llm.sleeping == 1
    engine.wake_up()
    assert llm.sleeping is None


def test_missing_vllm_names_the_extra(monkeypatch):
    _unset_multiprocessing_env(monkeypatch)
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"pip install 'turnrl\[vllm\]'"):
        VLLMEngine("default")


def test_gpu_check_script_runs_end_to_end_on_the_fake(fake_vllm, tokenizer, model, tmp_path, capsys, monkeypatch):
    """bench/gpu_check.py's own logic (prompts, comparisons, sync check, table) with vLLM faked as above."""
    import json

    from tests.bench_modules import load_bench

    _unset_multiprocessing_env(monkeypatch)
    gpu_check = load_bench("gpu_check")
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    code = gpu_check.main(["--model", str(tmp_path / "m"), "--prompts", "2", "--max-new-tokens", "3", "--throughput-prompts", "2",
                           "--hf-throughput-prompts", "1", "--throughput-tokens", "2", "--json", str(tmp_path / "r.json"),
                           "--train-steps", "0"])  # the training check's subprocess cannot see the fake: below
    out = capsys.readouterr().out
    assert code == 0, out
    rows = {r["check"]: r for r in json.loads((tmp_path / "r.json").read_text())}
    assert rows["greedy ids identical (share of prompts)"]["value"] == 1.0
    assert rows["sampled (T=0.7) logprob vs learner recompute"]["value"] < 1e-4
    assert rows["after sync: greedy ids identical"]["pass"] and rows["vLLM generated tokens/s"]["value"] > 0
    assert "FAIL" not in out


def test_gpu_check_training_check_runs_async_with_a_sharded_learner(tiny_model_dir, tmp_path, capsys):
    """Check 6 of bench/gpu_check.py (async mode, a 2-rank FSDP2 learner) with the CPU engine, as it runs without a GPU:
    every step updated, with a staleness and importance-ratio statistics logged."""
    import json

    from tests.bench_modules import load_bench

    gpu_check = load_bench("gpu_check")
    code = gpu_check.main(["--train-only", "--train-engine", "native", "--train-steps", "2", "--model",
                           str(tiny_model_dir), "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = {r["check"]: r for r in json.loads((tmp_path / "r.json").read_text())}
    assert rows["train: steps with an update"]["value"] == 2
    assert rows["train: staleness and IS statistics logged"]["pass"]


def test_training_with_rollout_engine_vllm_syncs_the_learner_each_step(fake_vllm, tokenizer, model, tmp_path):
    """`rollout.engine=vllm` through the real trainer: vLLM (faked at its import boundary) samples, and after every
    update the learner's tensors reach it by name and the version advances with the steps."""
    from turnrl.config import load_config
    from turnrl.build import build
    from turnrl.loop import train

    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    cfg = load_config(None, [f"model.path={tmp_path / 'm'}", "rollout.engine=vllm", "model.autocast_bf16=false",
                             "train.steps=2", "rollout.tasks_per_step=1", "rollout.group_size=2", "env.max_turns=2",
                             "eval.every=0", "eval.at_start=false", "log.progress=false", "log.tensorboard=false",
                             f"log.run_dir={tmp_path / 'runs'}", "log.checkpoint_every=0"])
    c = build(cfg, model=model, tokenizer=tokenizer)
    assert isinstance(c.engine, VLLMEngine)
    train(cfg, components=c)
    llm = FakeLLM.instances[-1]
    assert c.engine.version == 2
    assert set(llm.model.loaded) >= {n for n, _ in model.named_parameters()}
    for name, p in model.named_parameters():  # vLLM holds exactly the learner's weights after the last sync
        assert torch.equal(dict(llm.model.hf.named_parameters())[name], p.detach()), name
