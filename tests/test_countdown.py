"""countdown-v0: a reachable target per seed, a safe evaluator (ast, exact fractions) and a strict verifier."""

import json
from fractions import Fraction

import pytest

from turnrl.envs import check_env, make
from turnrl.envs.countdown import Countdown, check_answer, evaluate
from turnrl.envs.tools import ToolError


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_check_env():
    check_env("countdown-v0", seeds=range(5), random_tasks=True)


@pytest.mark.parametrize("seed", range(40))
def test_every_seed_is_solved_by_the_oracle_with_full_reward(seed):
    env = make("countdown-v0")
    obs, _ = env.reset(seed=seed)
    inner = env.unwrapped
    assert obs == f"Numbers: {' '.join(map(str, inner.numbers))}\nTarget: {inner.target}"
    assert 10 <= inner.target <= 200 and len(inner.numbers) == 4
    plan = env.solve()
    assert len(plan) == 1
    _, reward, terminated, _, info = env.step(plan[0])
    assert terminated and info["success"] and reward == 1.0 and info["reward_components"] == {"outcome": 1.0}


def test_evaluator_is_exact_and_rejects_anything_but_arithmetic():
    assert evaluate("(25 - 3) * 4") == (Fraction(88), [25, 3, 4])
    assert evaluate("7 / 2 - -1") == (Fraction(9, 2), [7, 2, 1])
    for bad, needle in [("2 ** 3", "Pow is not allowed"), ("__import__('os')", "Call is not allowed"),
                        ("x + 1", "Name is not allowed"), ("1 / (2 - 2)", "division by zero"), ("3 +", "cannot parse"),
                        ("1" + " * 99999" * 40, "characters"), ("99999 * 99999 * 99999", "exceeds"), ("2 % 3", "Mod is not allowed")]:
        with pytest.raises(ToolError, match=needle):
            evaluate(bad)


@pytest.mark.parametrize(
    "expression, correct, needle",
    [
        ("3 * 8 + 12 + 25", False, "equals 61, not 133"),
        ("(25 - 12) * (8 + 3)", False, "equals 143, not 133"),
        ("25 * 8 / (3 - 12)", False, "equals -200/9"),
        ("(12 - 3) * 8 + 25 * 3", False, "uses 3, more often than given"),
        ("(12 - 3) * 8 + 61", False, "uses 61"),
        ("(12 + 8) * 25 / 3 - 33.66", False, "whole numbers"),
    ],
)
def test_verifier_rejects_wrong_answers_with_the_reason(expression, correct, needle):
    ok, message = check_answer(expression, (3, 8, 12, 25), 133)
    assert ok is correct and needle in message


@pytest.mark.parametrize("expression", ["(25 - 12) * 8 + 3 * 10 - 1", "8 * 12 + 25 + 3 + 9"])
def test_verifier_hand_checked_cases(expression):
    # (25-12)*8 = 104; 104 + 3*10 - 1 = 133 but 10 and 1 are not given; 8*12+25+3 = 124 (+9 not given)
    assert not check_answer(expression, (3, 8, 12, 25), 133)[0]


def test_verifier_accepts_correct_answers_including_unused_numbers_and_repeats():
    assert check_answer("(12 - 3) * 8 + 25 * 2 + 11", (3, 8, 12, 25, 2, 11), 133) == (True, "Correct: (12 - 3) * 8 + 25 * 2 + 11 = 133.")
    assert check_answer("12 * 8 + 25 + 12", (3, 8, 12, 25, 12), 133)[0]  # 12 given twice: used twice
    assert check_answer("25 * 8 - 12 * 3 - 31", (3, 8, 12, 25, 31), 133)[0]
    assert check_answer("(8 + 3) * 12 + 1", (1, 3, 8, 12, 25), 133)[0]  # 25 unused
    assert check_answer("25 * 8 / 2", (2, 8, 25), 100)[0]  # exact division


def test_episode_with_calculator_then_a_wrong_answer_and_an_unparsable_one():
    env = Countdown()
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(call("calculate", expression="(1 + 2) / 7"))
    assert "3/7 (= 0.4286)" in obs and info["valid"] and not terminated
    obs, reward, terminated, _, info = env.step(call("answer", expression="1 +"))
    assert "cannot parse" in obs and not info["valid"] and not terminated  # unparsable: the episode goes on
    obs, reward, terminated, _, info = env.step(call("answer", expression="1 + 1"))
    assert terminated and reward == 0.0 and not info["success"] and "uses 1, 1" in obs


def test_examples_are_correct_tool_calls_on_fixed_instances():
    env = Countdown()
    for obs, response in env.examples():
        numbers = tuple(int(x) for x in obs.splitlines()[0].split()[1:])
        target = int(obs.splitlines()[1].split()[1])
        expression = json.loads(response.removeprefix("<tool_call>").removesuffix("</tool_call>"))["arguments"]["expression"]
        assert check_answer(expression, numbers, target)[0]


def test_play_runs_an_episode():
    from turnrl.envs.play import play

    env = make("countdown-v0")
    env.reset(seed=4)
    plan = env.solve()
    lines = []
    play("countdown-v0", seed=4, input_fn=lambda _prompt: plan.pop(0) if plan else "quit", print_fn=lines.append)
    assert any("Correct" in str(line) for line in lines)


def test_task_key_is_the_numbers_as_a_multiset_and_the_target():
    env = Countdown()
    env.reset(seed=4)
    key = env.task_key()
    assert key == f"{' '.join(map(str, sorted(env.numbers)))} -> {env.target}"
    env.numbers = tuple(reversed(env.numbers))  # the same puzzle, listed in another order
    assert env.task_key() == key
    env.target += 1
    assert env.task_key() != key
