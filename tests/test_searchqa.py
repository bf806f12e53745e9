"""searchqa-v0: a seeded fictional corpus, BM25 search, 2-hop questions, EM and F1 reward components."""

import json
import math
import random

import pytest

from turnrl.envs import check_env, make
from turnrl.envs.searchqa import BM25, SearchQA, exact_match, generate_world, normalize_answer, token_f1, tokenize


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_check_env():
    check_env("searchqa-v0", seeds=range(5), random_tasks=True)


@pytest.mark.parametrize("seed", range(30))
def test_oracle_searches_opens_and_answers_with_full_reward(seed):
    env = make("searchqa-v0")
    env.reset(seed=seed)
    world = env.unwrapped.world
    plan = env.solve()
    assert [json.loads(p[len("<tool_call>"):-len("</tool_call>")])["name"] for p in plan] == ["search", "open", "open", "answer"]
    for i, action in enumerate(plan):
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["valid"] and terminated == (i == 3)
        if i == 0:
            assert f"{world.person_doc}: {world.person}:" in obs  # the person's document is found by name
    assert reward == 1.0 and info["success"] and info["reward_components"] == {"exact_match": 0.5, "f1": 0.5}


def test_the_question_needs_two_documents():
    for seed in range(20):
        world = generate_world(random.Random(seed))
        docs = {d.doc_id: d for d in world.docs}
        person, bridge = docs[world.person_doc], docs[world.bridge_doc]
        assert world.person in world.question and world.answer not in world.question
        assert bridge.title in person.text and world.answer in bridge.text
        assert len({d.title for d in world.docs}) == len(world.docs)  # names are unique


def test_worlds_are_seeded_and_differ_between_seeds():
    a, b = generate_world(random.Random(3)), generate_world(random.Random(3))
    assert a == b
    assert generate_world(random.Random(4)).question != a.question


def test_bm25_matches_a_hand_computed_score():
    docs = [tokenize("alpha beta"), tokenize("beta gamma gamma"), tokenize("delta")]
    index = BM25(docs, k1=1.5, b=0.75)
    avg = 2.0
    idf_gamma = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    expected = idf_gamma * 2 * 2.5 / (2 + 1.5 * (1 - 0.75 + 0.75 * 3 / avg))
    assert index.scores(["gamma"]) == pytest.approx([0.0, expected, 0.0])
    assert index.top(["beta"], 5) == [0, 1]  # the shorter document first; no zero-score documents
    assert index.top(["zeta"], 5) == []


@pytest.mark.parametrize(
    "prediction, gold, em, f1",
    [
        ("Durnhollow", "Durnhollow", 1.0, 1.0),
        ("the durnhollow.", "Durnhollow", 1.0, 1.0),
        ("Velmara", "Velmara Oskit", 0.0, 2 / 3),  # precision 1, recall 1/2
        ("Velmara Tor Oskit", "Velmara Oskit", 0.0, 0.8),  # precision 2/3, recall 1
        ("Kelmor", "Velmara Oskit", 0.0, 0.0),
        ("", "Velmara Oskit", 0.0, 0.0),
    ],
)
def test_exact_match_and_token_f1(prediction, gold, em, f1):
    assert normalize_answer("The  Durn-hollow!") == "durnhollow"
    assert exact_match(prediction, gold) == em and token_f1(prediction, gold) == pytest.approx(f1)


def test_partial_answer_gets_the_f1_half_only_and_weights_are_configurable():
    env = SearchQA()
    env.reset(seed=0)
    gold = env.world.answer
    _, reward, terminated, _, info = env.step(call("answer", answer=f"{gold} town"))
    assert terminated and not info["success"]
    assert info["reward_components"] == {"exact_match": 0.0, "f1": pytest.approx(0.5 * 2 / 3)} and reward == pytest.approx(1 / 3)
    env = SearchQA(em_weight=1.0)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(call("answer", answer=gold.upper()))
    assert reward == 1.0 and info["reward_components"] == {"exact_match": 1.0, "f1": 0.0}


def test_open_an_unknown_document_and_search_without_matches_are_reported():
    env = SearchQA()
    env.reset(seed=1)
    obs, _, _, _, info = env.step(call("open", doc_id="d99"))
    assert "no document 'd99'; ids run from d00 to d15" in obs and not info["valid"]
    obs, _, _, _, info = env.step(call("search", query="!!!"))
    assert "No document matches" in obs and info["valid"]
    obs, _, _, _, info = env.step(call("serch", query="x"))
    assert "Did you mean 'search'" in obs


def test_examples_follow_the_oracle_on_a_fixed_world():
    responses = [r for _, r in SearchQA().examples()]
    assert [json.loads(r[len("<tool_call>"):-len("</tool_call>")])["name"] for r in responses] == ["search", "open", "open", "answer"]


def test_task_key_is_the_question_over_its_corpus():
    env, twin = SearchQA(), SearchQA()
    env.reset(seed=6)
    twin.reset(seed=6)
    key = env.task_key()
    assert key == twin.task_key() and key.startswith(env.world.question + " [corpus ")
    env.step(env.solve()[0])
    assert env.task_key() == key
    smaller = SearchQA(num_people=6)  # another corpus: the same question text would still be another task
    smaller.reset(seed=6)
    assert smaller.task_key() != key
    assert len({(env.reset(seed=s), env.task_key())[1] for s in range(10)}) == 10
