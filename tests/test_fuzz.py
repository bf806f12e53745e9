"""The fuzz stage of check_env: the hostile stream itself, its failure reports, and every env surviving a longer stream."""

import re
import time

import pytest

from turnrl.envs import EnvCheckError, TurnLimit, check_env, registered
from turnrl.envs.base import Env
from turnrl.envs.fuzz import KINDS, fuzz_action, fuzz_actions

SAMPLES = ['<tool_call>{"name": "calculate", "arguments": {"expression": "3 * 8"}}</tool_call>', "<answer>Left</answer>"]


def test_the_stream_is_a_function_of_seed_index_and_samples():
    stream = fuzz_actions(0, 3 * len(KINDS), SAMPLES)
    assert stream == fuzz_actions(0, 3 * len(KINDS), SAMPLES) and stream[7] == fuzz_action(0, 7, SAMPLES)
    assert stream != fuzz_actions(1, 3 * len(KINDS), SAMPLES)
    assert fuzz_actions(0, 9) != fuzz_actions(0, 9, SAMPLES)  # the env's own actions are mutated
    for text in stream:
        text.encode("utf-8")  # valid Unicode, as decoded model text always is (no lone surrogates)


def test_the_stream_covers_every_kind_of_hostile_text():
    stream = fuzz_actions(0, 20 * len(KINDS), SAMPLES)
    by_kind = {kind.__name__: stream[i::len(KINDS)] for i, kind in enumerate(KINDS)}
    assert all(not t.strip("\u200b\u200d\ufeff \t\r\n\u00a0\u2003\u3000") for t in by_kind["_blank"])
    assert min(len(t) for t in by_kind["_long"]) >= 20_000
    assert all(re.search(r"[\x00-\x08\x1b\x7f\u200b-\u200d\u202e\ufeff\ufffd]|[^\x00-\x7f]", t) for t in by_kind["_unicode"])
    assert any(t.count("<answer>") != t.count("</answer>") for t in by_kind["_tags"])
    assert any("<answer>null</answer>" == t or "2 x 3" in t for t in by_kind["_wrong_type_in_tags"])
    assert any(t.count("[") > 1000 or t.count("{") > 1000 for t in by_kind["_wrong_json"])
    swapped = by_kind["_swapped_kinds"]
    assert any(t.isalpha() for t in swapped) and any(t.lstrip("-").replace(".", "").isdigit() for t in swapped)
    assert any("three * eight" in t for t in swapped)  # the sample's digits spelt out
    assert all('"name"' in t for t in by_kind["_unknown_tool"])
    assert any('"calculate"' in t and '"3 * 8"' not in t for t in by_kind["_mutated_sample"])  # wrong-typed arguments


class _Echo(Env):
    """Valid on 'go'; everything else is an invalid turn."""

    def reset(self, *, seed=None, options=None):
        return "ready", {}

    def step(self, action_text):
        valid = action_text.strip() == "go"
        info = {"actions": ["go"] if valid else [], "valid": valid, "success": valid, "reward_components": {"outcome": float(valid)}}
        return "done" if valid else "say go", float(valid), valid, False, info

    def anchor(self):
        return "start"

    def examples(self):
        return [("ready", "go")]


class _ChokesOnControlCharacters(_Echo):
    def step(self, action_text):
        if "\x1b" in action_text:
            raise UnicodeError("cannot print an escape sequence")
        return super().step(action_text)


class _HangsOnLongText(_Echo):
    def step(self, action_text):
        if len(action_text) > 10_000:
            time.sleep(30)
        return super().step(action_text)


def test_a_failing_case_is_reported_with_the_seed_and_index_that_reproduce_it():
    env = TurnLimit(_ChokesOnControlCharacters(), 4)
    with pytest.raises(EnvCheckError) as err:
        check_env(env, seeds=(0, 1), random_tasks=False, fuzz=50, fuzz_seed=3)
    message = str(err.value)
    found = re.search(r"fuzz case (\d+) after reset\(seed=(\d+)\).*fuzz_action\(3, \1, ", message)
    assert found and "raised UnicodeError: cannot print an escape sequence. Fix: never raise on model text" in message
    env.reset(seed=int(found.group(2)))
    with pytest.raises(UnicodeError):
        env.step(fuzz_action(3, int(found.group(1)), [r for _, r in env.examples()]))


def test_a_step_that_hangs_is_reported_at_the_time_limit():
    start = time.monotonic()
    with pytest.raises(EnvCheckError, match=r"fuzz case 1 .* did not return within 0.5 s. Fix: bound the work"):
        check_env(TurnLimit(_HangsOnLongText(), 4), random_tasks=False, step_timeout_s=0.5)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("env_id", sorted(set(registered()) - {"openenv-v0"}))  # openenv: tests/test_adapters_openenv.py
@pytest.mark.probe("bad_input")
def test_every_registered_env_survives_a_longer_stream(env_id):
    """Ten cases of every kind from another stream than check_env's default (which test_envs.py runs)."""
    check_env(env_id, seeds=(0, 1), fuzz=10 * len(KINDS), fuzz_seed=1, random_tasks=env_id != "gym-cliffwalking-v0")
