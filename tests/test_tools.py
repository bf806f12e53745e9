"""The tool layer: schemas from typed functions, the call parser, and ToolEnv turning every failure into an observation."""

import json
import time
from typing import Literal, Optional

import pytest

from turnrl.envs import check_env
from turnrl.envs.tools import (
    ToolArgumentError, ToolCall, ToolEnv, ToolError, Verdict, make_tool, parse_docstring, parse_tool_calls, tool,
    validate_arguments,
)


@tool
def lookup(city: str, limit: int = 3, scale: float = 1.0, exact: bool = False, tags: Optional[list[str]] = None,
           unit: Literal["km", "mi"] = "km") -> str:
    """Look up distances from a city.

    More text that belongs to the description.

    Args:
        city: the city to start from.
        limit: how many results
            to show (continued line).
        scale: a factor.
        exact: match the name exactly.
        tags: filters.
        unit: the distance unit.

    Returns:
        The distances.
    """
    return f"{city} {limit} {scale} {exact} {tags} {unit}"


def test_schema_from_type_hints_and_docstring():
    s = lookup.schema
    assert s["type"] == "function" and s["function"]["name"] == "lookup"
    assert s["function"]["description"] == "Look up distances from a city. More text that belongs to the description."
    params = s["function"]["parameters"]
    assert params["required"] == ["city"]
    props = params["properties"]
    assert props["city"] == {"type": "string", "description": "the city to start from."}
    assert props["limit"] == {"type": "integer", "description": "how many results to show (continued line)."}
    assert props["scale"]["type"] == "number" and props["exact"]["type"] == "boolean"
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "nullable": True, "description": "filters."}
    assert props["unit"] == {"type": "string", "enum": ["km", "mi"], "description": "the distance unit."}
    assert lookup("Oslo") == "Oslo 3 1.0 False None km"  # still callable
    assert lookup.signature_text().startswith("lookup(city: str, limit: int (optional)")


def test_unsupported_or_missing_hints_are_errors_naming_the_parameter():
    def no_hint(x):
        """Doc."""

    def bad(x: dict) -> str:
        """Doc."""

    with pytest.raises(TypeError, match="'x' has no type hint"):
        make_tool(no_hint)
    with pytest.raises(TypeError, match="parameter 'x'.*not supported"):
        make_tool(bad)


def test_parse_docstring_without_sections():
    assert parse_docstring("Just one line.") == ("Just one line.", {})


@pytest.mark.parametrize("env_id", ["countdown-v0", "sql-v0", "searchqa-v0"])
def test_shipped_tool_schemas_equal_what_transformers_derives(env_id):
    """turnrl writes its own schemas (schema.py says why); for every shipped tool they equal get_json_schema's,
    less its "return" entry (not part of an OpenAI function schema) and with an explicit empty "required"."""
    from transformers.utils import get_json_schema

    from turnrl.envs import make

    tools = make(env_id).unwrapped.tools
    assert tools
    for t in tools.values():
        theirs = get_json_schema(t.fn)
        theirs["function"].pop("return", None)
        theirs["function"]["parameters"].setdefault("required", [])
        assert t.schema == theirs, t.name


def test_validate_arguments_is_strict_and_names_the_problem():
    assert validate_arguments(lookup, {"city": "Oslo", "scale": 2}) == {"city": "Oslo", "scale": 2.0}
    cases = [
        ({}, "missing the required argument.*city"),
        ({"city": "Oslo", "limt": 2}, "no argument 'limt'. Did you mean 'limit'"),
        ({"city": "Oslo", "limit": "2"}, "'limit' of lookup must be int, got str"),
        ({"city": "Oslo", "limit": True}, "must be int, got bool"),
        ({"city": "Oslo", "unit": "miles"}, r"must be one of \['km', 'mi'\]"),
        ({"city": "Oslo", "tags": ["a", 3]}, "an item of argument 'tags'"),
        ({"city": None}, "must not be null"),
        ([1, 2], "must be a JSON object"),
    ]
    for args, pattern in cases:
        with pytest.raises(ToolArgumentError, match=pattern):
            validate_arguments(lookup, args)


def test_parser_reads_tags_bare_json_and_reports_malformed_calls():
    text = ('Let me call. <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call> and '
            '<tool_call>{"name": "b", "arguments": {"x": </tool_call> <tool_call>["not", "an object"]</tool_call>'
            '<tool_call>{"name": "c", "parameters": {"y": 2}}</tool_call>')
    parsed = parse_tool_calls(text, limit=5)
    assert parsed.calls == [ToolCall("a", {"x": 1}), ToolCall("c", {"y": 2})]
    assert len(parsed.errors) == 2 and "tool call 2 is not valid JSON" in parsed.errors[0] and "tool call 3 must be" in parsed.errors[1]
    # bare JSON, OpenAI-style string arguments, a fenced body, an unclosed last tag
    assert parse_tool_calls('I will {"name": "a", "arguments": "{\\"x\\": 2}"} now').calls == [ToolCall("a", {"x": 2})]
    assert parse_tool_calls('<tool_call>```json\n{"name": "a"}\n```</tool_call>').calls == [ToolCall("a", {})]
    assert parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}').calls == [ToolCall("a", {})]
    # with a tag present, bare JSON elsewhere is not a call; objects without "name" are ignored
    assert parse_tool_calls('{"name": "z"} <tool_call>{"name": "a"}</tool_call>').calls == [ToolCall("a", {})]
    assert parse_tool_calls('{"x": 1} plain text').calls == []
    limited = parse_tool_calls("".join(f'<tool_call>{{"name": "t{i}"}}</tool_call>' for i in range(4)), limit=2)
    assert [c.name for c in limited.calls] == ["t0", "t1"] and limited.dropped == 2
    assert parse_tool_calls('<tool_call>{"name": "a", "arguments": [1]}</tool_call>').errors[0].endswith("got list")


class Toy(ToolEnv):
    """A toy tool env: add numbers to a running total; answer with the total."""

    task_description = "Add numbers, then answer with the total."
    final_tools = ("answer",)
    reward_names = ("outcome",)

    def build_tools(self):
        def add(n: int) -> str:
            """Add n to the total.

            Args:
                n: the number to add.
            """
            self.total += n
            return f"total {self.total}"

        def crash() -> str:
            """Always fails."""
            raise ZeroDivisionError("boom")

        def refuse() -> str:
            """Fails with a recoverable error."""
            raise ToolError("not today")

        @tool(timeout=0.1)
        def slow() -> str:
            """Sleeps too long."""
            time.sleep(1.0)
            return "late"

        def answer(total: int) -> str:
            """Give the total."""

        return [add, crash, refuse, slow, answer]

    def new_task(self, seed):
        self.total, self.target = 0, (seed or 0) + 5

    def task_observation(self):
        return f"Reach {self.target}."

    def task_key(self):
        return f"target {self.target}"

    def verify(self, call):
        if call.arguments["total"] < 0:
            raise ToolError("the total cannot be negative")
        ok = call.arguments["total"] == self.target == self.total
        return Verdict({"outcome": 1.0 if ok else 0.0}, ok, "right" if ok else "wrong")

    def oracle_calls(self):
        return [ToolCall("add", {"n": self.target}), ToolCall("answer", {"total": self.target})]

    def render(self):
        return f"total {self.total} of {self.target}"


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_instructions_list_the_tools_and_the_call_format():
    env = Toy()
    assert "- add(n: int): Add n to the total.\n    n: the number to add." in env.instructions
    assert "answer(total: int): Give the total. Ends the episode." in env.instructions
    assert "<tool_call>" in env.instructions
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["add", "crash", "refuse", "slow", "answer"]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("no call here", "No tool call found"),
        ('<tool_call>{"name": "add", "arguments": {"n": 1</tool_call>', "not valid JSON"),
        (call("ad", n=1), "Unknown tool 'ad'. Did you mean 'add'?"),
        (call("add"), "missing the required argument(s) n"),
        (call("add", n="two"), "must be int, got str"),
        (call("add", n=1, m=2), "no argument 'm'"),
        (call("crash"), "crash raised ZeroDivisionError: boom"),
        (call("refuse"), "Error: not today"),
        (call("slow"), "slow stopped after 0.1 s (time limit)"),
        (call("answer", total=-1), "the total cannot be negative"),
        ("<tool_call>" + "[" * 5000 + "</tool_call>", "nested too deeply"),  # json raises RecursionError here
        ('{"name": ' * 5000, "No tool call found"),
    ],
)
@pytest.mark.probe("bad_input")
def test_every_failure_is_an_invalid_turn_with_an_error_observation(text, needle):
    env = Toy()
    env.reset(seed=0)
    anchor = env.anchor()
    start = time.monotonic()
    obs, reward, terminated, truncated, info = env.step(text)
    assert needle in obs
    assert time.monotonic() - start < 0.5  # the slow tool is not waited for
    assert not info["valid"] and info["actions"] == [] and reward == 0.0 and not terminated and not truncated
    assert info["reward_components"] == {"outcome": 0.0} and env.anchor() == anchor
    obs, reward, terminated, _, info = env.step(call("add", n=5))  # the env still works afterwards
    assert obs == '<tool_response name="add">\ntotal 5\n</tool_response>' and info["valid"]


def test_calls_run_in_order_a_final_call_ends_the_episode_and_later_calls_are_ignored():
    env = Toy(max_actions_per_turn=3)
    env.reset(seed=1)
    obs, reward, terminated, _, info = env.step(call("add", n=2) + call("ad", n=1) + call("add", n=4))
    assert not info["valid"] and info["actions"] == ['add({"n": 2})', 'add({"n": 4})'] and env.total == 6
    assert "Did you mean 'add'" in obs and env.anchor() == 'target 6 | add({"n": 2}) | add({"n": 4})'
    obs, reward, terminated, _, info = env.step(call("answer", total=6) + call("add", n=100))
    assert terminated and reward == 1.0 and info["success"] and env.total == 6
    with pytest.raises(RuntimeError, match="reset"):
        env.step(call("add", n=1))


def test_calls_over_the_limit_are_ignored_with_a_note():
    env = Toy(max_actions_per_turn=1)
    env.reset(seed=0)
    obs, _, _, _, info = env.step(call("add", n=1) + call("add", n=1))
    assert env.total == 1 and info["valid"] and "1 more call(s) ignored" in obs


def test_toy_passes_check_env_and_the_oracle_skips_calls_already_made():
    check_env(Toy(), seeds=(0, 1), random_tasks=True)
    env = Toy()
    env.reset(seed=2)
    assert len(env.solve()) == 2
    env.step(call("add", n=7))
    assert env.solve() == [call("answer", total=7)]


def test_final_tools_must_exist():
    class Broken(Toy):
        final_tools = ("submit",)

    with pytest.raises(ValueError, match=r"final_tools \['submit'\] are not among the tools"):
        Broken()


def test_the_countdown_config_trains_two_steps_with_a_tiny_model(tmp_path, tokenizer):
    """The config's env, full context and credit settings run through the real loop (a tiny random model
    only produces invalid turns). One env is enough here: the loop does not know which tool env it runs."""
    from pathlib import Path

    from turnrl.config import load_config
    from turnrl.models import tiny_model
    from turnrl.monitor.sinks import read_metrics
    from turnrl.build import build
    from turnrl.loop import train

    path = Path(__file__).resolve().parents[1] / "configs" / "countdown.yaml"
    overrides = ["train.steps=2", "rollout.tasks_per_step=1", "rollout.group_size=2", "rollout.max_new_tokens=4",
                 "env.max_turns=2", "eval.every=0", "eval.at_start=false", "log.progress=false", "log.tensorboard=false",
                 "rollout.few_shot=false", "train.micro_batch_tokens=4096", "model.autocast_bf16=false",
                 f"log.run_dir={tmp_path}", "log.name=countdown"]
    cfg = load_config(path, overrides)
    run_dir = train(cfg, components=build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer))
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows[-1]["step"] == 2 and rows[-1]["rollout/valid_action_rate"] == 0.0


@pytest.mark.parametrize("config", ["countdown", "searchqa", "sql"])
def test_shipped_configs_leave_room_for_the_oracle(tokenizer, config):
    """Under each shipped config, every gold call fits max_new_tokens and a whole oracle episode in full context
    (system prompt with the tools, few-shot exchanges, every call and result) fits max_context_tokens."""
    from pathlib import Path

    from turnrl.agent.chat import ChatRenderer
    from turnrl.config import load_config
    from turnrl.envs import make

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / f"{config}.yaml")
    assert cfg.rollout.context == "full"
    env = make(cfg.env.id, max_turns=cfg.env.max_turns)
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        renderer = ChatRenderer(tokenizer, env.instructions, env.examples(), few_shot=cfg.rollout.few_shot)
        total = len(renderer.full_initial_prompt(obs))
        for action in env.solve():
            response = len(tokenizer(action, add_special_tokens=False)["input_ids"])
            assert response + 1 <= cfg.rollout.max_new_tokens, (seed, action)
            obs, *_ = env.step(action)
            total += response + len(renderer.full_continuation(obs, True))
        assert total <= cfg.rollout.max_context_tokens, (seed, total)
