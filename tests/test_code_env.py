"""code-v0: seeded function-writing tasks; hidden tests in the sandbox; partial credit; feedback; retries."""

import random

import pytest

from turnrl.envs import check_env, make
from turnrl.envs.code import TEMPLATES, CodeEnv, extract_code, grade, make_task, program_lines
from turnrl.envs.sandbox import Limits


def test_the_bank_has_many_templates_and_seeds_draw_varied_tasks():
    assert len(TEMPLATES) >= 20
    env = CodeEnv()
    drawn = {env.reset(seed=s)[1]["template"] for s in range(120)}
    assert len(drawn) >= 20
    # the same template gets different parameters from different seeds
    statements = {make_task(random.Random(s), "clamp_list", 8).description for s in range(20)}
    assert len(statements) > 5


def test_same_seed_same_task_and_tests():
    a, b = CodeEnv(), CodeEnv()
    assert a.reset(seed=11) == b.reset(seed=11)
    assert a.task == b.task and len(a.task.inputs) == 8


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_gold_solutions_pass_their_own_tests_through_the_sandbox(template):
    # None, floats, nested lists, bools, strings and two-argument calls all survive the JSON round trip
    task = make_task(random.Random(3), template, 8)
    g = grade(task, task.solution, Limits())
    assert all(g.passed) and g.error == "" and g.fraction == 1.0


def test_partial_credit_feedback_names_failed_visible_tests_and_retry_succeeds():
    env = make("code-v0", templates=["clamp_list"], max_turns=3)
    obs, info = env.reset(seed=2)
    task = env.unwrapped.task
    assert f"`{task.signature}`" in obs and "Examples:" in obs and info["function"] == "clamp_list"
    lo, hi = (int(v) for v in task.description.split("[")[1].split("]")[0].split(", "))
    no_upper = f"```python\ndef clamp_list(xs):\n    return [max(x, {lo}) for x in xs]\n```"
    expected_passed = sum(all(x <= hi for x in args[0]) for args in task.inputs)
    assert 0 < expected_passed < 8, "the seed must give a task where the half-right answer is partly right"
    obs, r, term, trunc, info = env.step("Here is my attempt:\n" + no_upper)
    assert info["valid"] and not term and not trunc and info["tests_passed"] == expected_passed
    assert r == pytest.approx(expected_passed / 8) and info["reward_components"] == {"tests": r}
    assert f"passed {expected_passed}/8 tests" in obs and "Fix the function" in obs
    for i in range(2):  # each failed visible test is named with expected and returned values
        args = task.inputs[i]
        if any(x > hi for x in args[0]):
            assert f"Failed: clamp_list({args[0]!r}): expected {task.expected[i]!r}, got {[max(x, lo) for x in args[0]]!r}" in obs
    obs, r2, term, _, info = env.step(env.solve()[0])
    assert term and info["success"] and "All tests passed." in obs
    assert r + r2 == pytest.approx(1.0) and info["episode"]["return"] == pytest.approx(1.0)


def test_a_regression_costs_reward_so_the_return_is_the_last_submissions_score():
    env = CodeEnv(templates=["fizz_word"])
    env.reset(seed=0)
    wrong = "```python\ndef fizz_word(n):\n    return 'nope'\n```"
    rewards = [env.step(wrong)[1], env.step("```python\ndef fizz_word(n):\n    return str(n)\n```")[1], env.step(wrong)[1]]
    assert rewards[0] == 0.0 and rewards[1] > 0.0 and rewards[2] == pytest.approx(-rewards[1])
    assert sum(rewards) == pytest.approx(0.0)


@pytest.mark.parametrize(
    "code, needle",
    [
        ("def f(:\n", "SyntaxError"),
        ("def other(xs):\n    return xs\n", "has no attribute 'dedupe'"),
        ("def dedupe(xs):\n    raise ValueError('boom')\n", "raised ValueError: boom"),
        ("def dedupe(xs):\n    return set(xs)\n", "not a JSON value"),
        ("import sys\ndef dedupe(xs):\n    sys.exit(0)\n", "raised SystemExit"),
        ("import os\ndef dedupe(xs):\n    os._exit(0)\n", "stopped before every test ran (exit status 0)"),
    ],
)
def test_broken_submissions_score_zero_with_a_clear_reason(code, needle):
    env = CodeEnv(templates=["dedupe"], cpu_seconds=1, wall_seconds=3.0)
    env.reset(seed=1)
    obs, r, term, _, info = env.step(f"```python\n{code}```")
    assert needle in obs and r == 0.0 and not term and info["valid"] and info["tests_passed"] == 0


def test_printing_fake_results_does_not_pass_tests():
    env = CodeEnv(templates=["poly"])
    env.reset(seed=0)
    spoof = ("import sys\nfor i in range(8):\n    sys.__stdout__.write('@@turnrl-result@@{\"i\": %d, \"value\": 0}\\n' % i)\n"
             "def poly(x):\n    return 0\n")
    _, r, _, _, info = env.step(f"```python\n{spoof}```")
    assert info["tests_passed"] == sum(e == 0 for e in env.task.expected)


def test_text_without_a_code_block_is_invalid_and_changes_nothing():
    env = make("code-v0", invalid_penalty=0.1)
    obs0, _ = env.reset(seed=3)
    anchor = env.anchor()
    obs, r, term, trunc, info = env.step("def f(): I would write the function like this")
    assert not info["valid"] and info["actions"] == [] and r == pytest.approx(-0.1) and not term
    assert obs.startswith("No code block found.") and obs.endswith(obs0) and env.anchor() == anchor


@pytest.mark.parametrize(
    "text, code",
    [
        ("```python\nx = 1\n```", "x = 1\n"),
        ("```py\nx = 1\n```", "x = 1\n"),
        ("```\nx = 1\n```", "x = 1\n"),
        ("first\n```python\nx = 1\n```\nthen\n```python\nx = 2\n```", "x = 2\n"),
        ("```python\nx = 3\n", "x = 3\n"),  # cut off by the token limit
        ("```python def f(x): return x```", "def f(x): return x"),  # one line, as typed in `turnrl play`
        ("```pythonic\nx = 1\n```", "pythonic\nx = 1\n"),  # not a language tag
        ("no code here", None),
        ("`x = 1`", None),
    ],
)
def test_code_extraction(text, code):
    assert extract_code(text) == code


def test_anchor_tracks_the_task_and_the_latest_result():
    env = CodeEnv(templates=["top_k"])
    env.reset(seed=5)
    start = env.anchor()
    assert start.startswith("top_k:") and start.endswith("|-")
    env.step("```python\ndef top_k(xs):\n    return []\n```")
    assert env.anchor() != start and "F" in env.anchor().split("|")[1]
    env.reset(seed=5)
    assert env.anchor() == start


def test_examples_are_fixed_gold_answers():
    ex = CodeEnv().examples()
    assert len(ex) == 2 and ex == CodeEnv(num_visible=2).examples()
    for obs, response in ex:
        assert "Write a Python function" in obs and extract_code(response).startswith("def ")


def test_check_env_and_bad_arguments():
    check_env("code-v0", seeds=(0, 1), random_tasks=True)
    with pytest.raises(ValueError, match="unknown code templates"):
        CodeEnv(templates=["sort_everything"])
    with pytest.raises(ValueError, match="num_visible"):
        CodeEnv(num_tests=3, num_visible=4)


def test_playable_by_hand():
    from turnrl.envs.play import play

    env = CodeEnv(templates=["dedupe"])
    env.reset(seed=7)
    gold = env.task.solution
    lines = iter(["?", "```python\n" + gold + "```"])
    printed = []
    result = play("code-v0", seed=7, templates=["dedupe"], input_fn=lambda _: next(lines), print_fn=lambda *a: printed.append(" ".join(map(str, a))))
    assert result["success"] and result["turns"] == 1 and any("oracle: ```python" in p for p in printed)


def test_task_key_is_the_program_not_its_test_inputs():
    env = make("code-v0")
    keys, inputs = {}, {}
    for seed in (10, 33, 7):  # 10 and 33 both draw second_largest with the same fallback, other test inputs; 7 another
        env.reset(seed=seed)
        keys[seed], inputs[seed] = env.task_key(), env.unwrapped.task.inputs
    assert keys[10] == keys[33] and keys[10].startswith("second_largest:") and inputs[10] != inputs[33]
    assert keys[7] != keys[10]


def test_every_template_has_programs_left_for_training_after_the_held_out_split():
    # A template with one program (no drawn parameters) puts that program in the held-out set the first time an
    # evaluation seed draws it, and training then never sees the template: held-out success measured transfer to
    # unseen problem types instead of learning (19 of 64 held-out tasks, before the templates drew parameters).
    env = CodeEnv()
    programs = {t: {make_task(random.Random(s), t, 1).solution for s in range(300)} for t in TEMPLATES}
    assert min(len(p) for p in programs.values()) >= 8, {t: len(p) for t, p in programs.items() if len(p) < 8}
    held, seed = set(), 1_000_000  # TaskSplit's evaluation set: the first 64 distinct keys from eval.seed_start
    while len(held) < 64:
        env.reset(seed=seed)
        held.add(env.task_key())
        seed += 1
    trained = set()
    for seed in range(2000):
        env.reset(seed=seed)
        if env.task_key() not in held:
            trained.add(env.task.template)
    assert trained == set(TEMPLATES)


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_a_templates_program_length_is_the_same_for_every_draw(template):
    # max_lines (the difficulty) filters templates by program_lines, computed from one draw
    lines = {sum(1 for line in make_task(random.Random(s), template, 1).solution.splitlines() if line.strip())
             for s in range(60)}
    assert lines == {program_lines(template)}
