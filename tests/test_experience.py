"""The experience library (bounded, versioned, nearest-key retrieval), its env wrapper, and a tiny-model training run
with the experience and skill libraries on."""

import pytest

from turnrl.agent.experience import ExperienceLibrary, ExperienceRetrieval, Record, render_block
from turnrl.config import ConfigError, load_config
from turnrl.envs import Env, make
from turnrl.types import Advantages, Termination, Trajectory, TrajectoryGroup, Turn

MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]


def record(key: str, action: str = "Right", version: int = 0, advantage: float = 0.5, success: bool = True) -> Record:
    return Record(key, action, 0.2, success, advantage, version)


def test_exact_matches_come_first_newest_first_then_the_most_similar_keys():
    library = ExperienceLibrary(top_k=5, min_similarity=0.3)
    library.add([record("left hole right frozen", "Down"), record("left hole right frozen", "Up"),
                 record("right hole left frozen", "Right"),  # the same words, but no word pair in common: 4/10
                 record("left hole right wall", "Left"),  # one word less, but the pairs "left hole", "hole right": 5/9
                 record("left hole right frozen", "Right")], version=0)
    found = library.nearest("left hole right frozen")
    assert [(r.action, sim) for r, sim in found] == [("Right", 1.0), ("Up", 1.0), ("Down", 1.0),
                                                      ("Left", pytest.approx(5 / 9)), ("Right", pytest.approx(4 / 10))]
    assert [r.key for r, _ in found[3:]] == ["left hole right wall", "right hole left frozen"]
    assert [r.action for r, _ in ExperienceLibrary(top_k=2).nearest("x")] == []


def test_keys_below_the_similarity_threshold_are_not_retrieved():
    library = ExperienceLibrary(top_k=3, min_similarity=0.9)
    library.add([record("a b c d"), record("x y z")], version=0)
    assert library.nearest("a b c e") == [] and [r.key for r, _ in library.nearest("x y z")] == ["x y z"]
    exact_only = ExperienceLibrary(min_similarity=1.0)
    exact_only.add([record("a b c d")], version=0)
    assert exact_only.nearest("a b c") == []


def test_the_library_stays_within_its_bound_evicting_the_oldest():
    library = ExperienceLibrary(max_records=3, max_age=10)
    library.add([record(f"k{i}", version=0) for i in range(2)], version=0)
    library.add([record(f"k{i}", version=1) for i in range(2, 5)], version=1)
    assert len(library) == 3 and [r.key for r in library] == ["k2", "k3", "k4"]
    assert library.nearest("k0") == []  # evicted records are gone from the index too


def test_records_older_than_max_age_versions_are_dropped():
    library = ExperienceLibrary(max_age=2)
    library.add([record("a", version=0), record("b", version=1)], version=1)
    library.add([record("c", version=3)], version=3)  # 3 - 2 = 1: version 0 is stale, version 1 is kept
    assert sorted(r.key for r in library) == ["b", "c"]


def test_the_state_dict_round_trips():
    library = ExperienceLibrary(max_age=3)
    library.add([record("a", version=2), record("b", "Down", version=3)], version=3)
    restored = ExperienceLibrary(max_age=3)
    restored.load_state_dict(library.state_dict())
    assert list(restored) == list(library) and restored.nearest("b")[0][0].action == "Down"


def test_the_wrapper_shows_the_block_and_records_what_it_showed():
    library = ExperienceLibrary()
    env = ExperienceRetrieval(make("frozenlake-v0", desc=MAP), library)
    start = "/".join(MAP) + "@0,0"
    library.add([record(start, "Right", advantage=0.5), record(start, "Right", advantage=0.3, success=False)], version=0)
    obs, info = env.reset(seed=0)
    block = "Past steps here: Right +0.40."
    assert obs.endswith("\n" + block) and info["experience"] == {"key": start, "retrieved": 2, "exact": 2, "block": block}
    obs, _, _, _, info = env.step("Right")
    assert info["experience"]["block"] == block  # what the observation this turn answered held
    # nothing is stored under the new state: the records of the similar key (the same map, one cell away) are shown
    assert env.anchor() == "/".join(MAP) + "@0,1" and obs.endswith("\nPast steps nearby: Right +0.40.")
    _, _, _, _, info = env.step("Down")
    assert info["experience"]["key"] == "/".join(MAP) + "@0,1" and info["experience"]["exact"] == 0

    exact_only = ExperienceRetrieval(make("frozenlake-v0", desc=MAP), ExperienceLibrary(min_similarity=1.0))
    exact_only.library.add(list(library), version=0)
    exact_only.reset(seed=0)
    obs, _, _, _, _ = exact_only.step("Right")
    assert "Experience" not in obs


def test_the_line_ranks_actions_by_mean_advantage_and_says_whether_all_records_are_exact():
    records = [record("k", "Down", advantage=-0.8), record("k", "Right", advantage=0.2), record("j", "Right", advantage=0.6)]
    assert render_block(records, 2) == "Past steps nearby: Right +0.40, Down -0.80."
    assert render_block(records[:1], 1) == "Past steps here: Down -0.80." and render_block([], 0) == ""


def test_the_few_shot_examples_show_the_line_ranking_their_own_answer_first():
    env = ExperienceRetrieval(make("frozenlake-v0"), ExperienceLibrary())
    plain = make("frozenlake-v0").examples()
    assert [r for _, r in env.examples()] == [r for _, r in plain] == ["Down", "Right"]
    assert [o for o, _ in env.examples()] == [plain[0][0] + "\nPast steps here: Down +0.50, Right -0.50.",
                                             plain[1][0] + "\nPast steps here: Right +0.50, Down -0.50."]

    class LongAnswers(NoAnchor):
        def examples(self):
            return [("obs", "def f():\n    return 1")]

    assert ExperienceRetrieval(LongAnswers(), ExperienceLibrary()).examples() == [("obs", "def f():\n    return 1")]


def test_observation_keys_look_up_by_the_raw_observation():
    library = ExperienceLibrary(key="observation")
    env = ExperienceRetrieval(make("frozenlake-v0", desc=MAP), library)
    obs, info = env.reset(seed=0)
    assert info["experience"]["key"] == obs  # nothing stored yet: the observation is unchanged


def test_situation_keys_match_across_maps():
    """A record stored on one map is found exactly on another map where the agent faces the same cells and goal."""
    library = ExperienceLibrary(key="situation", min_similarity=1.0)
    trained = ExperienceRetrieval(make("frozenlake-v0", desc=MAP), library)
    _, info = trained.reset(seed=0)
    assert info["experience"]["key"] == "Left: wall, Down: frozen, Right: frozen, Up: wall; goal down-right"
    library.add([record(info["experience"]["key"], "Down")], version=0)
    unseen = ExperienceRetrieval(make("frozenlake-v0", desc=["SFF", "FFF", "FHG"]), library)
    obs, info = unseen.reset(seed=0)
    assert info["experience"]["exact"] == 1 and obs.endswith("\nPast steps here: Down +0.50.")


def test_an_env_without_a_situation_names_the_keys_it_can_use():
    with pytest.raises(TypeError, match="NoAnchor has no situation\\(\\).*experience.key=observation"):
        ExperienceRetrieval(NoAnchor(), ExperienceLibrary(key="situation")).reset(seed=0)


def credited_batch() -> tuple[list[TrajectoryGroup], Advantages]:
    def turn(key: str | None, actions: list[str], reward: float) -> Turn:
        info = {"experience": {"key": key, "retrieved": 1 if key == "a" else 0, "exact": 1 if key == "a" else 0,
                               "block": ""}} if key else {}
        return Turn([], [], [], "obs", "text", actions=actions, reward=reward, info=info)

    good = Trajectory("e", 0, [turn("a", ["Right"], 0.2), turn("b", [], 0.0), turn("c", ["Down"], 1.0)],
                      termination=Termination.TERMINATED, success=True, policy_version=4)
    broken = Trajectory("e", 0, [turn("d", ["Up"], 0.0)], termination=Termination.ENV_ERROR, policy_version=4)
    memory_turn = Trajectory("e", 0, [turn(None, ["Left"], 0.0)], policy_version=4)
    return [TrajectoryGroup("e", 0, [good, broken, memory_turn])], Advantages([[0.7, -0.1, 0.9], [0.3], [0.2]])


def test_learn_stores_credited_turns_and_reports_what_was_shown():
    library = ExperienceLibrary()
    groups, advantages = credited_batch()
    metrics = library.learn(groups, advantages, version=5)
    # an invalid turn (no action), an env error's turns and a turn without a lookup are not stored
    assert list(library) == [Record("a", "Right", 0.2, True, 0.7, 4), Record("c", "Down", 1.0, True, 0.9, 4)]
    assert metrics == {"experience/retrieved_per_turn": pytest.approx(1 / 4), "experience/hit_rate": pytest.approx(1 / 4),
                       "experience/exact_rate": pytest.approx(1 / 4), "experience/records": 2.0}


class NoAnchor(Env):
    instructions = "Say anything."

    def reset(self, *, seed=None, options=None):
        return "start", {}

    def step(self, action_text):
        return "done", 0.0, True, False, {"actions": [action_text], "valid": True, "success": True}


def test_an_env_without_anchor_needs_observation_keys():
    from turnrl.agent.experience import agent_libraries
    from turnrl.build import env_factories

    cfg = load_config(None, ["env.id=tests.test_experience:NoAnchor", "env.progress_reward=0", "experience.retrieve=true"])
    with pytest.raises(ConfigError, match="experience.key=anchor: NoAnchor has no anchor.*set experience.key=observation"):
        env_factories(cfg, *agent_libraries(cfg))
    cfg.experience.key = "observation"
    env_factories(cfg, *agent_libraries(cfg))


def test_config_errors_are_one_clear_line():
    with pytest.raises(ConfigError, match="skill_min_length=4 is above experience.skill_max_length=3"):
        load_config(None, ["experience.skill_min_length=4", "experience.skill_max_length=3"])
    from turnrl.agent.experience import agent_libraries

    with pytest.raises(ConfigError, match="set scale.workers=0"):
        agent_libraries(load_config(None, ["experience.skills=true", "scale.workers=2"]))


def test_a_tiny_run_with_both_libraries_logs_their_metrics_and_checkpoints_them(tmp_path, tokenizer, monkeypatch):
    from tests.test_train import _run
    from turnrl.build import build, restore
    from turnrl.monitor.sinks import read_metrics
    from turnrl.models import tiny_model

    overrides = ["experience.retrieve=true", "experience.skills=true", "experience.skill_min_count=1",
                 "algo.skip_zero_advantage=false", "eval.every=0", "eval.at_start=false"]
    run_dir, c = _run(tmp_path, tokenizer, overrides, "libraries")
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "experience/records" in r]
    assert len(rows) == 2 and rows[0]["experience/hit_rate"] == 0.0  # step 1's rollouts saw an empty library
    assert rows[1]["experience/hit_rate"] > 0 and rows[1]["experience/retrieved_per_turn"] > 0  # parity's anchors repeat
    assert rows[1]["experience/records"] >= rows[0]["experience/records"] > 0
    assert "skills/used_frac" in rows[1] and rows[0]["skills/count"] > 0  # random text succeeds: its pairs are skills
    fresh = build(c.cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    restore(fresh, run_dir / "checkpoints" / "step_000002")
    assert list(fresh.experience) == list(c.experience) and fresh.skills.skills == c.skills.skills

    import turnrl.loop
    from turnrl import api

    evaluated, real = [], turnrl.loop.evaluate
    monkeypatch.setattr(turnrl.loop, "evaluate", lambda comps: evaluated.append(comps) or real(comps))
    api.evaluate(None, "eval.num_tasks=2", checkpoint=run_dir)  # turnrl eval --checkpoint: the libraries come along
    assert list(evaluated[0].experience) == list(c.experience) and evaluated[0].skills.skills == c.skills.skills


def bench_module():
    from tests.bench_modules import load_bench

    return load_bench("experience")


def curve(*points: tuple[int, float]) -> list[dict]:
    return [{"step": s, "success": v} for s, v in points]


def test_the_bench_counts_steps_to_the_off_arms_final_success():
    compare = bench_module().compare
    off = curve((0, 0.1), (5, 0.3), (10, 0.5), (15, 0.4))  # final 0.4, first reached at step 10
    on = curve((0, 0.1), (5, 0.45), (10, 0.2), (15, 0.3))
    assert compare(on, off) == {"steps_on": 5, "steps_off": 10, "final_on": 0.3, "final_off": 0.4,
                                "steps_ratio": 0.5, "off_learned": True}
    never = compare(curve((0, 0.1), (5, 0.2), (10, 0.3), (15, 0.3)), off)
    assert never["steps_on"] is None and never["steps_ratio"] is None
    flat = compare(on, curve((0, 0.2), (5, 0.2), (10, 0.0), (15, 0.2)))  # the off arm learned nothing: nothing to reach
    assert not flat["off_learned"] and flat["steps_ratio"] is None


def test_the_bench_links_a_full_runs_summary_into_memory_json_and_leaves_the_rest(tmp_path, monkeypatch):
    import json

    bench = bench_module()
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    assert bench.link_into_memory() is None  # nothing to link yet
    memory = {"env": "keys-v0", "memory_actions": {"success": 1.0}, "experience": None}
    (tmp_path / "memory.json").write_text(json.dumps(memory))
    run = {"command": "python bench/experience.py", "date": "d", "commit": "c", "env": "frozenlake-v0", "budget": "smoke",
           "steps_ratio": 0.5, "curve_on": [{"step": 0}]}
    (tmp_path / "experience.json").write_text(json.dumps(run))
    assert bench.link_into_memory() is None  # a smoke run is not a measurement
    (tmp_path / "experience.json").write_text(json.dumps(run | {"budget": "full"}))
    assert bench.link_into_memory() == tmp_path / "memory.json"
    linked = json.loads((tmp_path / "memory.json").read_text())
    assert linked["memory_actions"] == {"success": 1.0} and linked["env"] == "keys-v0"
    assert linked["experience"]["steps_ratio"] == 0.5 and linked["experience"]["env"] == "frozenlake-v0"
    assert linked["experience"]["source"]["command"] == "python bench/experience.py" and "curve_on" not in linked["experience"]


def test_the_bench_resumes_only_a_finished_arm_of_the_same_config(tmp_path):
    import argparse
    import json

    from turnrl.config import write_config

    bench = bench_module()
    args = argparse.Namespace(smoke=True, config=None, out=tmp_path, key="situation", overrides=[], resume=True)
    cfg = bench.arm_config(args, retrieve=True)
    run_dir = tmp_path / cfg.log.name
    assert bench.finished_rows(cfg) is None  # nothing ran
    run_dir.mkdir()
    write_config(cfg, run_dir / "config.yaml")
    rows = [{"step": 0, "eval/success_rate": 0.0}, {"step": 1, "perf/train_s": 1.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.finished_rows(cfg) is None  # stopped before its last step's evaluation
    rows.append({"step": cfg.train.steps, "eval/success_rate": 0.5})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.finished_rows(cfg) == rows
    assert bench.finished_rows(bench.arm_config(argparse.Namespace(**{**vars(args), "key": "anchor"}), True)) is None


def test_the_benches_run_jobs_in_order_or_in_spawned_processes_with_the_same_results():
    bench_module()  # puts bench/ on sys.path
    from machine import run_jobs

    jobs = {"a": (7, 2), "b": (9, 4)}
    assert run_jobs(divmod, jobs) == run_jobs(divmod, jobs, processes=2) == {"a": (3, 1), "b": (2, 1)}
