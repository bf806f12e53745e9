"""Difficulty keywords a curriculum moves: searchqa's ``hops`` and code's ``max_lines`` (FrozenLake's size and
p_frozen, Sokoban's num_boxes and solution length, countdown's num_numbers and target_range have their own tests)."""

import json
import random

import pytest

from turnrl.envs import check_env, make
from turnrl.envs.code import TEMPLATES, program_lines
from turnrl.envs.searchqa import generate_world


def _names(plan):
    return [json.loads(p[len("<tool_call>"):-len("</tool_call>")])["name"] for p in plan]


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_searchqa_questions_need_hops_documents_and_the_oracle_reads_them(hops):
    env = make("searchqa-v0", hops=hops)
    assert f"a question needs {['one', 'two', 'three'][hops - 1]}" in env.instructions
    for seed in range(15):
        env.reset(seed=seed)
        world = env.unwrapped.world
        docs = {d.doc_id: d for d in world.docs}
        path = [docs[d] for d in world.path]
        assert len(path) == hops and path[0].title == world.person
        assert all(b.title in a.text for a, b in zip(path, path[1:]))  # each document names the next
        assert world.answer in path[-1].text and world.answer not in world.question
        plan = env.solve()
        assert _names(plan) == ["search", *["open"] * hops, "answer"]
        for action in plan:
            _, reward, terminated, _, info = env.step(action)
        assert terminated and reward == 1.0 and info["success"]


def test_searchqa_default_draws_the_same_tasks_as_before_hops_existed():
    world = generate_world(random.Random(0))
    assert world.question == "In which town is the headquarters of the organisation that Sosfor Nimbre works for?"
    env = make("searchqa-v0")
    env.reset(seed=1)
    assert env.task_key() == "Who founded the organisation that Duthshin Kromoth works for? [corpus 72eb0e1818fc]"


@pytest.mark.parametrize("hops", [1, 3])
def test_searchqa_passes_check_env_at_other_depths(hops):
    check_env("searchqa-v0", seeds=range(3), random_tasks=True, hops=hops)


def test_searchqa_refuses_a_depth_it_has_no_questions_for():
    with pytest.raises(ValueError, match="hops=4 must be 1, 2 or 3"):
        make("searchqa-v0", hops=4)


def test_code_max_lines_keeps_the_short_programs_only():
    assert sorted(program_lines(t) for t in TEMPLATES)[0] == 2 and max(program_lines(t) for t in TEMPLATES) == 10
    env = make("code-v0", max_lines=3)
    assert 0 < len(env.unwrapped.templates) < len(TEMPLATES)
    for seed in range(20):
        env.reset(seed=seed)
        assert program_lines(env.unwrapped.task.template) <= 3
    assert len(make("code-v0").unwrapped.templates) == len(TEMPLATES)


def test_code_max_lines_that_leaves_nothing_is_a_clear_error():
    with pytest.raises(ValueError, match="max_lines=1 leaves no template.*has 2 lines; raise max_lines"):
        make("code-v0", max_lines=1)
    with pytest.raises(ValueError, match="among them has 8 lines"):
        make("code-v0", templates=["caesar"], max_lines=4)
