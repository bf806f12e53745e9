"""The skill library: extraction from credited trajectories, and `skill NAME` run on the env by SkillActions."""

import asyncio

import pytest

from turnrl.agent.skills import SkillActions, SkillLibrary, skill_name
from turnrl.envs import make
from turnrl.types import Advantages, Termination, Trajectory, Turn

MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]  # Right, Right, Down reaches (1, 2); Down, Right falls into the hole at (1, 1)


def episode(actions: list[list[str]], success: bool, version: int = 0, termination=Termination.TERMINATED) -> Trajectory:
    turns = [Turn([], [], [], "obs", " ".join(a), actions=a) for a in actions]
    return Trajectory("frozenlake-v0", 0, turns, termination=termination, success=success, policy_version=version)


def library_from(episodes: list[Trajectory], advantages: list[list[float]], version: int = 1, **kwargs) -> SkillLibrary:
    library = SkillLibrary(**{"max_skills": 3, "min_length": 2, "max_length": 3, "min_count": 2, **kwargs})
    library.add(episodes, Advantages(advantages), version)
    return library


def test_skills_are_the_frequent_ngrams_of_positive_runs_in_successful_episodes():
    moves = [["Down"], ["Down"], ["Right"], ["Right"]]
    episodes = [
        episode(moves, success=True),
        episode(moves, success=True),
        episode([["Up"], ["Up"], ["Left"], ["Left"]], success=False),  # failed: never counted
        episode(moves, success=True),
        episode([["Env"], ["Error"]], success=True, termination=Termination.ENV_ERROR),
    ]
    advantages = [[1.0] * 4, [1.0] * 4, [1.0] * 4, [1.0, 1.0, -1.0, 1.0], [1.0, 1.0]]
    library = library_from(episodes, advantages)
    # in the positive runs: D,D,R,R twice and D,D once (the third success's run is cut at its negative turn)
    assert [(s.name, s.actions, s.count) for s in library.skills] == [
        ("down-down", ("Down", "Down"), 3),
        ("down-down-right", ("Down", "Down", "Right"), 2),  # count ties: the longer, then alphabetical
        ("down-right-right", ("Down", "Right", "Right"), 2),
    ]


def test_rarer_sequences_than_min_count_and_stale_versions_are_not_skills():
    library = library_from([episode([["Down"], ["Right"]], success=True)], [[1.0, 1.0]])
    assert library.skills == []  # one episode < min_count
    library.add([episode([["Down"], ["Right"]], success=True, version=1)], Advantages([[1.0, 1.0]]), 1)
    assert [s.name for s in library.skills] == ["down-right"]
    library.add([], Advantages([]), 5)  # max_age 4: version 0's and 1's counts are forgotten at version 5 and 6
    assert [s.count for s in library.skills] == []


def test_state_dict_round_trip_keeps_the_skills():
    episodes = [episode([["Down"], ["Right"]], success=True) for _ in range(2)]
    library = library_from(episodes, [[1.0, 1.0]] * 2)
    restored = SkillLibrary(max_skills=3, min_length=2, max_length=3, min_count=2)
    restored.load_state_dict(library.state_dict())
    assert restored.skills == library.skills and restored.skills


def test_long_action_names_get_a_digest_and_stay_distinct():
    long = tuple(f"search[query number {i} about something]" for i in range(3))
    name = skill_name(long)
    assert len(name) <= 40 and " " not in name and name != skill_name(long[::-1])


def wrapped(skills: list[tuple[str, ...]], **env_kwargs) -> SkillActions:
    library = SkillLibrary(max_skills=4, min_length=3, max_length=3, min_count=1)
    library.add([episode([[a] for a in s], success=True) for s in skills], Advantages([[1.0] * len(s) for s in skills]), 0)
    return SkillActions(make("frozenlake-v0", desc=MAP, progress_reward=0.5, **env_kwargs), library)


def test_a_skill_runs_its_actions_one_env_step_each_and_sums_the_rewards():
    env = wrapped([("Right", "Right", "Down")])
    obs, _ = env.reset(seed=0)
    assert "Skills (answer `skill NAME`): right-right-down = Right, Right, Down" in obs
    assert "skill NAME" in env.instructions
    obs, reward, terminated, truncated, info = env.step("skill right-right-down")
    assert env.unwrapped.pos == (1, 2) and not terminated and not truncated
    assert info["actions"] == ["Right", "Right", "Down"] and info["valid"]
    assert reward == pytest.approx(3 * 0.5) and info["reward_components"]["progress"] == pytest.approx(1.5)
    assert info["skill"] == {"name": "right-right-down", "known": True, "ran": ["Right", "Right", "Down"], "completed": True}
    assert obs.startswith("> Right\n") and "\n> Down\n" in obs and obs.count("> ") == 3


def test_a_skill_stops_when_the_episode_terminates_or_hits_the_turn_limit():
    env = wrapped([("Down", "Right", "Right")])
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("skill down-right-right")
    assert terminated and info["skill"]["ran"] == ["Down", "Right"] and not info["skill"]["completed"]
    assert env.unwrapped.pos == (1, 1)  # the hole; the third action never ran

    env = wrapped([("Right", "Right", "Down")], max_turns=2)
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step("skill right-right-down")
    assert truncated and not terminated and info["skill"]["ran"] == ["Right", "Right"]  # each step counts a turn


def test_async_and_sync_expansion_agree():
    sync_env, async_env = wrapped([("Right", "Right", "Down")]), wrapped([("Right", "Right", "Down")])
    sync_env.reset(seed=0)
    asyncio.run(async_env.areset(seed=0))
    assert asyncio.run(async_env.astep("skill right-right-down")) == sync_env.step("skill right-right-down")


def test_an_unknown_skill_is_an_invalid_turn_that_leaves_the_env_alone():
    env = wrapped([("Right", "Right", "Down")])
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("skill fly-home")
    assert not info["valid"] and reward == 0.0 and not terminated and not truncated
    assert obs.startswith("There is no skill 'fly-home' (skills: right-right-down).") and env.unwrapped.pos == (0, 0)
    assert info["skill"] == {"name": "fly-home", "known": False}
    env.step("skill fly-home")  # the second (max_unknown=2) is answered here too; the third goes to the env
    obs, _, _, _, info = env.step("skill fly-home")
    assert "skill" not in info and not info["valid"] and "There is no skill" not in obs


def test_plain_actions_pass_through_with_the_list():
    env = wrapped([])
    obs, _ = env.reset(seed=0)
    assert "Skills" not in obs  # an empty library lists nothing
    _, _, _, _, info = env.step("Right")
    assert info["actions"] == ["Right"] and "skill" not in info and env.unwrapped.pos == (0, 1)


def test_the_wrapped_env_passes_check_env():
    from turnrl.agent.experience import ExperienceLibrary, ExperienceRetrieval, Record
    from turnrl.envs.checker import check_env

    experience = ExperienceLibrary(key="observation")
    first, _ = make("frozenlake-v0", desc=MAP).reset(seed=0)  # the key: the env's observation, without the skill list
    experience.add([Record(first, "Down", 0.2, True, 0.5, 0)], version=0)
    env = ExperienceRetrieval(wrapped([("Right", "Right", "Down")]), experience)
    check_env(env, random_tasks=False)  # seeded determinism, types, close(), the fuzz stage: raises on a problem
    obs, _ = env.reset(seed=0)
    assert "Skills (answer" in obs and "Past steps here: Down +0.50." in obs


def test_observation_keys_leave_out_the_skill_list_and_the_steps_a_skill_ran_through():
    from turnrl.agent.experience import ExperienceLibrary, ExperienceRetrieval

    env = ExperienceRetrieval(wrapped([("Right", "Right", "Down")]), ExperienceLibrary(key="observation"))
    first, info = env.reset(seed=0)
    assert info["experience"]["key"] == first.split("\nSkills (answer")[0]
    obs, _, _, _, _ = env.step("skill right-right-down")
    _, _, _, _, info = env.step("Down")
    plain = make("frozenlake-v0", desc=MAP)
    plain.reset(seed=0)
    for action in ("Right", "Right", "Down"):
        state, *_ = plain.step(action)
    assert info["experience"]["key"] == state and obs.count("> ") == 3  # the state the skill ended in, not its run
