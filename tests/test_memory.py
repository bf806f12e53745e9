"""Memory actions (turnrl.agent.memory) and the budgeted context (turnrl.agent.context): the actions never reach the
env, the context drops the oldest turns exactly past its budget and a summary replaces them, and every turn's
prompt_ids are exactly what the engine was given."""

import re
from pathlib import Path

import pytest

from turnrl.agent import ChatRenderer, ContextSpec, EpisodeContext
from turnrl.agent.memory import BUDGET_LINE, MemoryActions
from turnrl.build import build, with_memory
from turnrl.config import Config, ConfigError, load_config
from turnrl.engines.base import Completion, SamplingParams
from turnrl.envs import make
from turnrl.envs.base import Env
from turnrl.envs.wrappers import EpisodeStatistics, TurnLimit
from turnrl.learner import build_samples
from turnrl.monitor.records import write_trajectories
from turnrl.monitor.report import load_report_data
from turnrl.rollout import Collector

ROOT = Path(__file__).resolve().parents[1]
from turnrl.types import Advantages, Termination


class Recorder(Env):
    """Records every text it is stepped with; each step is valid, pays 1 and says which step it was."""

    instructions = "Say anything."

    def reset(self, *, seed=None, options=None):
        self.seen = []
        return "start", {}

    def step(self, action_text):
        self.seen.append(action_text)
        info = {"actions": [action_text], "valid": True, "success": False, "reward_components": {"outcome": 1.0}}
        return f"step {len(self.seen)}", 1.0, False, False, info


def memory_env(max_turns=3, **kwargs):
    inner = Recorder()
    return inner, MemoryActions(EpisodeStatistics(TurnLimit(inner, max_turns)), **kwargs)


def test_memory_actions_never_reach_the_env_nor_its_turn_limit_or_reward():
    inner, env = memory_env(max_turns=2)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("note: the code is blue")
    assert (reward, terminated, truncated, info["memory"], info["valid"]) == (0.0, False, False, "note", True)
    assert obs == "Noted (1 notes).\nstart"  # the feedback, then the env's latest observation
    env.step("move")
    obs, *_ , info = env.step("recall")
    assert obs == "Your notes: the code is blue.\nstep 1" and info["memory"] == "recall"
    obs, *_, info = env.step("compress: code blue, one step done")
    assert info["memory"] == "compress" and obs.endswith("step 1")
    _, reward, terminated, truncated, info = env.step("move again")  # the env's second turn: its limit, not the fifth
    assert inner.seen == ["move", "move again"] and truncated and reward == 1.0
    assert info["episode"]["length"] == 2 and info["episode"]["return"] == 2.0


def test_an_empty_note_is_an_invalid_memory_turn_and_used_up_actions_go_to_the_env():
    inner, env = memory_env(max_turns=9, max_actions=2)
    env.reset(seed=0)
    obs, _, _, _, info = env.step("note:")
    assert not info["valid"] and info["memory"] == "note" and obs.startswith("Nothing to note")
    env.step("Recall")
    _, _, _, _, info = env.step("note: third")  # past max_actions: an ordinary response
    assert inner.seen == ["note: third"] and "memory" not in info
    env.reset(seed=1)  # a new episode starts with no notes and a fresh allowance
    assert env.step("recall")[0] == "Your notes: none yet.\nstart"


def test_only_enabled_actions_are_answered_and_listed_in_the_instructions():
    inner, env = memory_env(actions=("note",))
    env.reset(seed=0)
    env.step("recall")
    assert inner.seen == ["recall"]
    assert "note: TEXT" in env.instructions and "compress" not in env.instructions
    with pytest.raises(ValueError, match="subset"):
        MemoryActions(Recorder(), actions=("remember",))


def test_compress_needs_the_budgeted_context():
    with pytest.raises(ConfigError, match="rollout.context=budgeted"):
        with_memory(Config(memory={"actions": ["compress"]}), Recorder)
    cfg = Config(memory={"actions": ["note", "compress"]}, rollout={"context": "budgeted", "budget_tokens": 256})
    assert isinstance(with_memory(cfg, Recorder)(), MemoryActions)
    with pytest.raises(ValueError, match="budget_tokens"):
        ContextSpec(strategy="budgeted")


class Demo(Recorder):
    """A Recorder whose examples are one episode (start, then step 1) whose last response needs ``example_note()``."""

    def examples(self):
        return [("start", "walk"), ("step 1", "x")]

    def example_note(self):
        return "the answer is x"


def test_the_memory_few_shot_shows_note_and_recall_with_the_replies_the_wrapper_gives():
    env = MemoryActions(Demo(), budgeted=True)
    demo = env.examples()
    responses = [r for _, r in demo]
    assert responses == ["note: the answer is x", "walk", "recall", "x"]
    live = [env.reset(seed=0)[0]] + [env.step(r)[0] for r in responses[:-1]]  # the replies the few-shot shows, live
    assert live == [o for o, _ in demo] == ["start", "Noted (1 notes).\nstart", "step 1", "Your notes: the answer is x.\nstep 1"]
    assert BUDGET_LINE in env.instructions and BUDGET_LINE not in MemoryActions(Demo()).instructions
    assert MemoryActions(Demo(), few_shot=False).examples() == Demo().examples()
    assert [r for _, r in MemoryActions(Demo(), actions=("compress",)).examples()] == ["compress: the answer is x", "walk", "x"]
    assert MemoryActions(Demo(), actions=("recall",)).examples() == Demo().examples()  # nothing kept, nothing to show


def test_the_memory_few_shot_on_keys_and_on_an_env_without_a_note_and_in_the_prompt(tokenizer):
    cfg = Config(memory={"actions": ["note", "recall", "compress"]}, rollout={"context": "budgeted", "budget_tokens": 448})
    keys = with_memory(cfg, lambda: make("keys-v0"))()
    assert [r for _, r in keys.examples()] == ["note: code green", "Right", "recall", "green"]
    lake = with_memory(cfg, lambda: make("frozenlake-v0"))()  # no example_note: the first line, and no recall
    own = make("frozenlake-v0").examples()
    first = own[0][0].split("\n")[0]
    assert lake.examples() == [(own[0][0], f"note: {first}"), (f"Noted (1 notes).\n{own[0][0]}", own[0][1]), *own[1:]]
    renderer = ChatRenderer(tokenizer, keys.instructions, keys.examples())
    assert "note: code green" in tokenizer.decode(renderer.per_step_prompt("room"))
    assert "note:" not in tokenizer.decode(ChatRenderer(tokenizer, keys.instructions, keys.examples(), few_shot=False)
                                           .per_step_prompt("room")).replace("note: TEXT", "")


def _no_line(renderer, ctx):
    return len(renderer.per_step_prompt(ctx.observation, ctx._shown()))


def test_the_budgeted_context_drops_the_oldest_turns_exactly_past_the_budget(tokenizer):
    renderer = ChatRenderer(tokenizer, "Walk.")
    spec = ContextSpec(strategy="budgeted", budget_tokens=120, max_context_tokens=512)
    ctx = EpisodeContext(spec, renderer, "room 0 " + "dust " * 5)
    firsts = []
    for t in range(1, 9):
        ctx.advance([1], f"move {t}", f"room {t} " + "dust " * 5, None)
        size = _no_line(renderer, ctx)
        assert size <= 120 and ctx.budget_left == 120 - size
        if ctx.first:  # the last exchange dropped would not have fitted
            ctx.first -= 1
            assert _no_line(renderer, ctx) > 120
            ctx.first += 1
        firsts.append(ctx.first)
        line = f"[context: {120 - size} of 120 tokens left]"
        assert ctx.prompt() == renderer.per_step_prompt(f"{ctx.observation}\n{line}", ctx.history[ctx.first :])
    assert firsts == sorted(firsts) and 0 < firsts[-1] < 8  # the oldest go first, and a dropped turn never returns
    assert ctx.record() == {"context": {"summary": None, "first": firsts[-1], "budget_left": ctx.budget_left}}


def test_a_compress_summary_replaces_the_earlier_turns_and_is_never_dropped(tokenizer):
    renderer = ChatRenderer(tokenizer, "Walk.")
    ctx = EpisodeContext(ContextSpec(strategy="budgeted", budget_tokens=120, max_context_tokens=512), renderer, "code blue")
    ctx.advance([1], "Left", "room 1", None)
    ctx.advance([1], "compress: code blue", "Earlier turns replaced by your summary.\nroom 1", None, summary=True)
    text = tokenizer.decode(ctx.prompt())
    assert "compress: code blue" in text and "(turns 1-2, replaced by your summary)" in text
    assert "Left" not in text and "code blue" not in text.replace("compress: code blue", "")
    for t in range(2, 12):
        ctx.advance([1], f"move {t}", f"room {t} " + "dust " * 5, None)
        assert "compress: code blue" in tokenizer.decode(ctx.prompt())
    assert ctx.summary_turn == 1 and ctx.first > 3  # later turns were dropped, the summary stayed


class ScriptedEngine:
    """Plays one episode: answers its k-th prompt with ``script[k]``; records each prompt it was given."""

    version = 0

    def __init__(self, tokenizer, script):
        self.tokenizer, self.script, self.prompts = tokenizer, script, []

    def generate(self, prompts, params):
        (prompt,) = prompts
        ids = self.tokenizer.encode(self.script[len(self.prompts)], add_special_tokens=False)
        self.prompts.append(list(prompt))
        return [Completion(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")]


def test_a_memory_episode_records_exactly_the_prompts_the_engine_was_given(tokenizer, tmp_path):
    env = make("keys-v0", rooms=3, max_turns=6)
    env.reset(seed=5)
    plan = env.solve()
    script = ["note: " + plan[-1], plan[0], f"compress: code {plan[-1]}", *plan[1:-1], "recall", plan[-1]]
    engine = ScriptedEngine(tokenizer, script)
    cfg = Config(memory={"actions": ["note", "recall", "compress"]}, rollout={"context": "budgeted", "budget_tokens": 230})
    spec = ContextSpec(strategy="budgeted", budget_tokens=230, max_context_tokens=1024)
    collector = Collector(engine, tokenizer, with_memory(cfg, lambda: make("keys-v0", rooms=3, max_turns=6)), spec)
    groups = collector.collect([5], 1, SamplingParams(max_new_tokens=16))
    traj = groups[0].trajectories[0]

    assert traj.success and traj.termination == Termination.TERMINATED and traj.num_turns == len(script)
    assert [t.prompt_ids for t in traj.turns] == engine.prompts  # exactly what the engine conditioned on
    assert all("note: code green" in tokenizer.decode(p) for p in engine.prompts)  # the memory few-shot heads each one
    samples = build_samples([traj], Advantages([[1.0] * traj.num_turns]))  # one per turn, the notes' ids trained
    assert [s.input_ids for s in samples] == [t.prompt_ids + t.response_ids for t in traj.turns]
    assert all(sum(s.loss_mask) == len(t.response_ids) for s, t in zip(samples, traj.turns))
    assert [t.info.get("memory") for t in traj.turns] == ["note", None, "compress", None, None, "recall", None]
    assert [t.reward for t in traj.turns if "memory" in t.info] == [0.0, 0.0, 0.0]
    contexts = [t.info["context"] for t in traj.turns]
    assert [c["summary"] for c in contexts] == [None, None, None, 2, 2, 2, 2]
    assert any(c["first"] > (c["summary"] or 0) + 1 for c in contexts)  # the budget dropped turns after the summary
    last = tokenizer.decode(engine.prompts[-1])
    assert f"compress: code {plan[-1]}" in last and f"code colour is {plan[-1]}" not in last
    assert f"Your notes: {plan[-1]}." in last  # recall showed the note
    assert all(re.search(r"\[context: \d+ of 230 tokens left\]", tokenizer.decode(p)) for p in engine.prompts)

    write_trajectories(tmp_path, 1, groups, Advantages([[0.0] * len(script)]), tokenizer, limit=1)
    (tmp_path / "metrics.jsonl").write_text("")
    shown = load_report_data(tmp_path).trajectories[0]["turns"]  # what the report's viewer marks
    assert [t["memory"] for t in shown] == [t.info.get("memory") for t in traj.turns]
    assert [t["context"] for t in shown] == contexts


@pytest.mark.parametrize("actions, expected", [
    (["note", "recall", "compress"], ["note", None, None, None, "recall", None]),
    (["compress"], ["compress", None, None, None, None]),
    (["recall"], [None, None, None, None]),  # nothing to keep the fact with: the env's own plan
])
def test_the_memory_oracle_notes_the_code_first_and_recalls_it_at_the_door(tokenizer, tiny_model, actions, expected):
    """Oracle demonstrations of keys-v0 with memory actions: the plan writes the env's ``oracle_note()`` first and
    recalls it just before the door, so SFT on them shows the policy how to keep the code through a budget."""
    from turnrl.sft import oracle_demos

    overrides = ["env.id=keys-v0", "env.kwargs.rooms=3", "env.max_turns=6", "rollout.context=budgeted",
                 "rollout.budget_tokens=400", "rollout.max_new_tokens=12", "rollout.tasks_per_step=2",
                 "eval.num_tasks=2", "rollout.engine=hf", "model.autocast_bf16=false", f"memory.actions={actions}"]
    c = build(load_config(None, overrides), model=tiny_model, tokenizer=tokenizer)
    demos = oracle_demos(c, 2)
    assert len(demos) == 2 and all(d.success for d in demos)
    for demo in demos:
        assert [t.info.get("memory") for t in demo.turns] == expected
        responses = [tokenizer.decode(t.response_ids, skip_special_tokens=True) for t in demo.turns]
        colour = responses[-1]
        if expected[0]:
            assert responses[0] == f"{expected[0]}: code {colour}"
        if "recall" in expected:  # the recall's reply, in the door turn's prompt, carries the code
            assert f"Your notes: code {colour}." in tokenizer.decode(demo.turns[-1].prompt_ids)


def _engine_prompt_tokens(traj, full: bool) -> int:
    """The prompt tokens the engine was given over ``traj``: under ``full`` each turn's ``prompt_ids`` are only the ids
    appended since the last response, so the engine's prompt is the running conversation; otherwise the whole prompt."""
    total = context = 0
    for turn in traj.turns:
        context = context + len(turn.prompt_ids) if full else len(turn.prompt_ids)
        total += context
        context += len(turn.response_ids) if full else 0
    return total


def test_the_long_memory_recipe_keeps_the_code_at_under_a_third_of_full_contexts_prompt_tokens(tokenizer, tiny_model):
    """configs/memory_long.yaml (20 rooms, 192-token budget): the oracle that notes the code and recalls it is given
    at most a third of the prompt tokens the full-context oracle is, and its door turn sees the code only through the
    recall (the first observation was dropped long before)."""
    from turnrl.sft import oracle_demos

    tiny = ["rollout.engine=hf", "model.autocast_bf16=false", "rollout.tasks_per_step=2", "eval.num_tasks=2"]
    tokens = {}
    for arm, extra in {"memory": [], "full": ["memory.actions=[]", "rollout.context=full"]}.items():
        cfg = load_config(ROOT / "configs" / "memory_long.yaml", [*tiny, *extra])
        demos = oracle_demos(build(cfg, model=tiny_model, tokenizer=tokenizer), 2)
        assert len(demos) == 2 and all(d.success and len(d.turns) >= 21 for d in demos)
        tokens[arm] = sum(_engine_prompt_tokens(d, arm == "full") for d in demos)
        if arm == "memory":
            for demo in demos:
                door = tokenizer.decode(demo.turns[-1].prompt_ids)
                assert "vault door's code colour is" not in door and "Your notes: code " in door
    assert tokens["memory"] <= tokens["full"] / 3, tokens


def test_the_memory_bench_gives_the_full_context_arm_batches_of_as_many_turns():
    """bench/memory.py --sft: a full-context sample is a whole episode, so its SFT batch is divided by the turns."""
    from tests.bench_modules import load_bench

    bench = load_bench("memory")
    long_ = load_config(ROOT / "configs" / "memory_long.yaml")  # 20 rooms: 21 turns, 16 / 21 -> 1 episode
    assert bench.sft_batch(long_, "full_context") == ["sft.batch_size=1"]
    assert bench.sft_batch(load_config(ROOT / "configs" / "memory.yaml"), "full_context") == ["sft.batch_size=2"]
    assert bench.sft_batch(long_, "memory_actions") == bench.sft_batch(long_, "truncation") == []
