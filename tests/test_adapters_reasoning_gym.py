"""reasoning-gym adapter (turnrl.envs.adapters.reasoning_gym) against the real reasoning-gym package."""

import pytest
import reasoning_gym

from turnrl.envs import check_env, make
from turnrl.envs.adapters.reasoning_gym import ReasoningGym


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "leg_counting", "word_sorting", "maze", "knights_knaves"])
@pytest.mark.parametrize("attempts", [1, 3])
def test_datasets_pass_check_env(dataset, attempts):
    # The oracle (the reference answer) must score 1.0 with the dataset's own score_answer.
    check_env("reasoning-gym-v0", dataset=dataset, attempts=attempts, random_tasks=True)


def test_checker_scored_dataset_has_no_oracle_but_passes_check_env():
    check_env("reasoning-gym-v0", dataset="graph_color", random_tasks=True)  # answer None: scored by a checker
    env = ReasoningGym("graph_color", attempts=1)
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match="no reference answer"):
        env.solve()
    obs, reward, terminated, _, info = env.step("<answer>{}</answer>")
    assert obs == "Incorrect." and terminated and reward == info["score"] < 1.0 and env.examples() == []


def test_question_is_the_datasets_item_for_the_seed():
    env = ReasoningGym("chain_sum", dataset_seed=7, size=50)
    reference = reasoning_gym.create_dataset("chain_sum", seed=7, size=50)
    for seed in (0, 3, 49, 53):
        obs, info = env.reset(seed=seed)
        assert obs == reference[seed % 50]["question"] and info["index"] == seed % 50


def test_reward_is_the_datasets_score_answer_including_partial_credit():
    env = make("reasoning-gym-v0", dataset="leg_counting")
    env.reset(seed=5)
    entry = env.unwrapped.entry
    answer = f"{entry['answer']} legs"  # leg_counting gives partial credit for the answer inside longer text
    expected = env.unwrapped.dataset.score_answer(answer, entry)
    assert 0.0 < expected < 1.0
    obs, reward, terminated, _, info = env.step(f"Thinking... <answer>{answer}</answer>")
    assert reward == pytest.approx(expected) and info["score"] == pytest.approx(expected)
    assert terminated and not info["success"] and info["reward_components"] == {"outcome": reward}
    assert entry["answer"] in obs  # the last attempt shows the expected answer


def test_multi_attempt_feedback_then_success():
    env = make("reasoning-gym-v0", dataset="basic_arithmetic", attempts=3, max_turns=6)
    question, _ = env.reset(seed=11)
    answer = env.unwrapped.entry["answer"]
    obs, reward, terminated, _, info = env.step("<answer>not a number</answer>")
    assert (reward, terminated, info["valid"], info["attempts_left"]) == (0.0, False, True, 2)
    assert obs.startswith("Incorrect. 2 attempts left.") and obs.endswith(question)
    obs, reward, terminated, _, info = env.step("I forgot the tags")  # invalid: no attempt used
    assert not info["valid"] and not terminated and env.unwrapped.used == 1
    obs, reward, terminated, _, info = env.step(f"<answer>{answer}</answer>")
    assert (obs, reward, terminated, info["success"]) == ("Correct.", 1.0, True, True)
    assert info["episode"]["return"] == 1.0 and info["episode"]["invalid"] == 1


def test_attempts_run_out_and_anchor_counts_them():
    env = ReasoningGym("basic_arithmetic", attempts=2)
    env.reset(seed=2)
    anchors = [env.anchor()]
    for _ in range(2):
        _, reward, terminated, _, info = env.step("<answer>zzz</answer>")
        anchors.append(env.anchor())
    assert terminated and reward == 0.0 and not info["success"] and len(set(anchors)) == 3
    assert env.solve() is None
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("<answer>1</answer>")


def test_require_tag_false_scores_the_whole_text_and_examples_come_from_another_seed():
    env = ReasoningGym("basic_arithmetic", require_tag=False)
    env.reset(seed=1)
    _, reward, _, _, info = env.step(f"  {env.entry['answer']} ")
    assert reward == 1.0 and info["success"]
    questions = {env.reset(seed=s)[0] for s in range(50)}
    examples = env.examples()
    assert len(examples) == 2 and all(r.startswith("<answer>") for _, r in examples)
    assert not questions & {q for q, _ in examples}


def test_unknown_dataset_names_the_closest():
    with pytest.raises(ValueError, match="Did you mean 'basic_arithmetic'"):
        ReasoningGym("basic_arithmetik")


@pytest.mark.parametrize("answer", ["2 x 3", "2*3", "six"])
def test_an_answer_the_datasets_scorer_cannot_read_is_an_invalid_turn_with_feedback(answer):
    # prime_factorization's score_answer calls int() on each factor and raises ValueError on these
    env = make("reasoning-gym-v0", dataset="prime_factorization", attempts=2, max_turns=6)
    question, _ = env.reset(seed=0)
    anchor = env.anchor()
    obs, reward, terminated, truncated, info = env.step(f"<answer>{answer}</answer>")
    assert (reward, terminated, truncated, info["valid"], info["actions"]) == (0.0, False, False, False, [])
    assert "could not be scored" in obs and "ValueError" in obs and obs.endswith(question)
    assert env.anchor() == anchor and env.unwrapped.used == 0  # no attempt used
    obs, reward, terminated, _, info = env.step(env.solve()[0])
    assert (reward, terminated, info["success"]) == (1.0, True, True)


@pytest.mark.parametrize(("dataset", "answer", "error"), [
    ("boxnet", "null", "TypeError"),
    ("coin_flip", "1e309", "OverflowError"),
    ("game_of_life", '{"a": 1}', "KeyError"),
])
def test_other_scorers_that_raise_on_model_text_give_invalid_turns(dataset, answer, error):
    # what reasoning-gym 0.1.25's score_answer raises on these fuzz-stage answers
    env = make("reasoning-gym-v0", dataset=dataset)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step(f"<answer>{answer}</answer>")
    assert (reward, terminated, info["valid"]) == (0.0, False, False) and f"could not be scored ({error}" in obs


def test_task_key_is_the_dataset_and_the_question():
    env = make("reasoning-gym-v0", dataset="chain_sum", size=50)
    questions, keys = set(), set()
    for seed in range(100):  # size 50: seeds s and s + 50 pose the same item
        question, _ = env.reset(seed=seed)
        assert env.task_key() == f"chain_sum: {question}"
        questions.add(question)
        keys.add(env.task_key())
    assert len(keys) == len(questions) <= 50
