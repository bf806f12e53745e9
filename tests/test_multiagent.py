"""Multi-agent rollout (exact per-role tokens), per-agent and team credit, self-play with Elo, and a training run."""

import json
import math

import numpy as np
import pytest

from turnrl.agent import ContextSpec
from turnrl.credit import CreditParams, get_estimator
from turnrl.engines import SamplingParams
from turnrl.engines.base import Completion
from turnrl.envs import make
from turnrl.learner import build_samples
from turnrl.monitor.metrics import credit_metrics
from turnrl.rollout.multiagent import MultiAgentCollector
from turnrl.rollout.selfplay import Elo, SelfPlay, expected_score
from turnrl.types import Advantages, Termination, Trajectory, TrajectoryGroup, Turn

from tests.test_rollout import RecordingEngine  # an HF engine that keeps every (prompt, response) it generated




class ScriptedEngine:
    """Answers each prompt with ``respond(decoded prompt, call index)``; records every prompt."""

    def __init__(self, tokenizer, respond):
        self.tokenizer, self.respond, self.version, self.prompts = tokenizer, respond, 0, []

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            self.prompts.append(list(p))
            ids = self.tokenizer(self.respond(self.tokenizer.decode(p), len(self.prompts)), add_special_tokens=False)["input_ids"]
            out.append(Completion(list(ids), [0.0] * len(ids), "stop"))
        return out


def oracle_text(prompt: str, code_from_prompt=True) -> str:
    """What an oracle says, read from the prompt's last user message (the relay's code or message)."""
    last = prompt.rsplit("The secret code is ", 1)
    if len(last) == 2 and "speaker:" not in last[1]:
        return f"SAY {last[1][:3]}"
    return "ENTER " + prompt.rsplit("speaker: ", 1)[1][:3]


@pytest.mark.parametrize("strategy", ["per_step", "full"])
def test_each_role_trains_on_exactly_the_ids_its_engine_saw(tokenizer, tiny_model, strategy):
    engine = RecordingEngine(tiny_model, tokenizer, seed=0)
    col = MultiAgentCollector(engine, tokenizer, lambda: make("nim-v0", max_turns=5), ContextSpec(strategy=strategy))
    groups = col.collect([3, 4], 2, SamplingParams(max_new_tokens=4))
    assert [(g.seed, g.trajectories[0].agent) for g in groups] == [(3, "first"), (3, "second"), (4, "first"), (4, "second")]
    trajs = [t for g in groups for t in g.trajectories]
    assert all(len(g.trajectories) == 2 for g in groups) and all(t.group_index == i // 2 for i, t in enumerate(trajs))
    samples = build_samples(trajs, Advantages([[1.0] * t.num_turns for t in trajs]))
    seen = [(tuple(p), tuple(r)) for p, r in engine.seen]
    for s in samples:  # every response span is a response the engine produced after exactly the ids before it
        i = s.loss_mask.index(1)
        while i < len(s.loss_mask):
            end = i
            while end < len(s.loss_mask) and s.loss_mask[end]:
                end += 1
            assert (tuple(s.input_ids[:i]), tuple(s.input_ids[i:end])) in seen
            i = next((k for k in range(end, len(s.loss_mask)) if s.loss_mask[k]), len(s.loss_mask))
    for t in trajs:  # each role's context holds its own role prompt, never the other's
        text = tokenizer.decode(t.turns[0].prompt_ids) if t.turns else ""
        own, other = ("You move first", "You move second") if t.agent == "first" else ("You move second", "You move first")
        assert not t.turns or (own in text and other not in text)
    assert sum(t.num_turns for t in trajs) == len(engine.seen)


@pytest.mark.parametrize("strategy", ["per_step", "full"])
def test_a_session_engine_keeps_each_roles_cache_and_samples_what_the_model_gives_those_ids(tokenizer, tiny_model, strategy):
    """The native engine plays each role of an episode in a session of its own: every turn's logprobs are the model's
    on exactly the ids recorded for that role, a role's cached ids are not computed again, an episode samples the same
    whichever episodes share its batches, and no session is left open."""
    import torch

    from turnrl.engines.native import NativeEngine

    engine = NativeEngine(tiny_model, tokenizer, dtype="fp32", max_len=1024, seed=2)
    col = MultiAgentCollector(engine, tokenizer, lambda: make("nim-v0", max_turns=6), ContextSpec(strategy=strategy))
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    groups = col.collect([3, 4], 2, params)
    trajs = [t for g in groups for t in g.trajectories]
    assert engine._seqs == {}  # every session closed with its episode
    for s in build_samples(trajs, Advantages([[1.0] * t.num_turns for t in trajs])):  # each role's ids as trained on
        ids = torch.tensor([s.input_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(tiny_model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        trained = [i for i, m in enumerate(s.loss_mask) if m]
        assert torch.allclose(torch.tensor([s.behaviour_logprobs[i] for i in trained]), logprobs[[i - 1 for i in trained]], atol=1e-4)
    assert engine.counters["prefill_tokens"] < col.take_stats().prompt_tokens / 2  # heads (per_step) or conversations (full) not recomputed
    alone = col.collect([4], 2, params)  # seed 4's episodes, now without seed 3's beside them
    assert [[turn.response_ids for turn in t.turns] for g in alone for t in g.trajectories] == \
        [[turn.response_ids for turn in t.turns] for g in groups[2:] for t in g.trajectories]


def test_rewards_success_and_team_return_per_role(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda prompt, n: oracle_text(prompt))
    col = MultiAgentCollector(engine, tokenizer, lambda: make("relay-v0", invalid_penalty=0.0))
    groups = col.collect([5], 3, SamplingParams(max_new_tokens=8))
    speaker, listener = groups
    assert [t.agent for t in speaker.trajectories] == ["speaker"] * 3 and [t.agent for t in listener.trajectories] == ["listener"] * 3
    for s, lis in zip(speaker.trajectories, listener.trajectories):
        assert s.num_turns == lis.num_turns == 1 and s.success and lis.success
        assert s.total_reward == lis.total_reward == 1.0 and s.team_return == 1.0  # the speaker's reward lands on its turn
        assert s.termination == lis.termination == Termination.TERMINATED and s.task_key == lis.task_key
        assert s.turns[0].actions[0].startswith("SAY") and lis.turns[0].anchor.startswith("message: ")


def test_opponent_roles_are_played_by_their_engine_and_not_recorded(tokenizer):
    def take_one(prompt, n):  # from the first non-empty heap of the newest observation
        heaps = prompt.rsplit("Heaps: ", 1)[1].split(".")[0].split()
        return f"TAKE 1 FROM {next(h.split(':')[0] for h in heaps if not h.endswith(':0'))}"

    learner = ScriptedEngine(tokenizer, take_one)

    class Lineup:
        def __init__(self):
            self.opponent = ScriptedEngine(tokenizer, take_one)

        def opponents(self, seed, roles):
            return {"second": self.opponent}

    lineup = Lineup()
    col = MultiAgentCollector(learner, tokenizer, lambda: make("nim-v0", max_turns=20), lineup=lineup)
    groups = col.collect([1], 2, SamplingParams(max_new_tokens=8))
    assert len(groups) == 1 and {t.agent for t in groups[0].trajectories} == {"first"}
    first = groups[0].trajectories[0]
    assert first.num_turns == len(learner.prompts) // 2 and lineup.opponent.prompts  # two episodes, the opponent moved too
    assert first.termination == Termination.TERMINATED and first.total_reward in (1.0, -1.0) and first.team_return == 0.0


def _traj(agent, reward, team, anchors, action="r"):
    turns = [Turn([1], [2], [0.0], "o", action, actions=[action], anchor=a) for a in anchors]
    turns[-1].reward = reward
    return Trajectory("x", 0, turns, Termination.TERMINATED, agent=agent, team_return=team)


def test_per_agent_credit_uses_each_agents_own_return_and_group(tokenizer):
    # speakers' own returns 1, 0, 1; listeners' 0, 0, 1 (say per-role penalties made them differ)
    speakers = TrajectoryGroup("x", 0, [_traj("speaker", r, 0.5, ["s"]) for r in (1.0, 0.0, 1.0)])
    listeners = TrajectoryGroup("x", 0, [_traj("listener", r, 0.5, ["m"]) for r in (0.0, 0.0, 1.0)])
    adv = get_estimator("grpo")([speakers, listeners], CreditParams(norm_std=False))
    assert np.allclose([a[0] for a in adv.turns], [1 / 3, -2 / 3, 1 / 3, -1 / 3, -1 / 3, 2 / 3])


def test_team_grpo_gives_every_agent_the_team_advantage():
    g = TrajectoryGroup("x", 0, [_traj("listener", 0.0, t, ["m"]) for t in (1.0, 0.0, 0.0, 1.0)])
    adv = get_estimator("team_grpo")([g], CreditParams())
    std = np.std([1, 0, 0, 1], ddof=1)
    assert np.allclose([a[0] for a in adv.turns], [0.5 / (std + 1e-6), -0.5 / (std + 1e-6)] * 1 + [-0.5 / (std + 1e-6), 0.5 / (std + 1e-6)])
    with pytest.raises(ValueError, match="team_return"):
        get_estimator("team_grpo")([TrajectoryGroup("x", 0, [Trajectory("x", 0, [Turn([1], [2], [0.0], "o", "r")])] * 2)], CreditParams())


def test_counterfactual_baseline_on_a_hand_made_group():
    # four listeners of one task, each entering its own code; two got message "A" (team returns 1, 0), two got "B"
    # (0, 0), one of which acted twice
    trajs = [_traj("listener", 0.0, 1.0, ["A"], "ENTER 1"), _traj("listener", 0.0, 0.0, ["A"], "ENTER 2"),
             _traj("listener", 0.0, 0.0, ["B"], "ENTER 3"), _traj("listener", 0.0, 0.0, ["B", "C"], "ENTER 4")]
    adv = get_estimator("counterfactual")([TrajectoryGroup("x", 0, trajs)], CreditParams(norm_std=False))
    # "A": baseline mean(1, 0) = 0.5; "B": mean(0, 0) = 0; "C" seen once: the group mean 0.25
    assert np.allclose(adv.turns[0], [0.5]) and np.allclose(adv.turns[1], [-0.5])
    assert np.allclose(adv.turns[2], [0.0]) and np.allclose(adv.turns[3], [0.0, -0.25])
    normed = get_estimator("counterfactual")([TrajectoryGroup("x", 0, trajs)], CreditParams())
    assert np.allclose(normed.turns[0], [0.5 / (0.5 + 1e-6)])  # sample std of (1, 0, 0, 0) is 0.5
    flat = [_traj("speaker", 0.0, 1.0, ["s"]) for _ in range(3)]
    assert get_estimator("counterfactual")([TrajectoryGroup("x", 0, flat)], CreditParams()).turns == [[0.0]] * 3


def test_counterfactual_credits_an_action_with_the_mean_return_of_the_copies_that_took_it():
    # four speakers of one task: two sent message "M" (their listeners' team returns 1 and 0: one listener erred), two
    # sent "W" (0, 0). Each speaker's Q is the mean over its message's copies, so the right message's speaker whose
    # listener erred is not blamed: both "M" speakers get 0.5 - 0.25, both "W" speakers 0 - 0.25
    speakers = [_traj("speaker", 0.0, team, ["codes"], message) for team, message in ((1.0, "M"), (0.0, "M"), (0.0, "W"), (0.0, "W"))]
    adv = get_estimator("counterfactual")([TrajectoryGroup("x", 0, speakers)], CreditParams(norm_std=False))
    assert np.allclose([a[0] for a in adv.turns], [0.25, 0.25, -0.25, -0.25])
    team = get_estimator("team_grpo")([TrajectoryGroup("x", 0, speakers)], CreditParams(norm_std=False))
    assert np.allclose([a[0] for a in team.turns], [0.75, -0.25, -0.25, -0.25])  # the shared reward blames it
    # their listeners: the two that heard "M" entered different codes, so each gets its own return against "M"'s mean
    listeners = [_traj("listener", 0.0, team, [f"message: {m}"], entry)
                 for team, m, entry in ((1.0, "M", "ENTER 1"), (0.0, "M", "ENTER 2"), (0.0, "W", "ENTER 3"), (0.0, "W", "ENTER 3"))]
    adv = get_estimator("counterfactual")([TrajectoryGroup("x", 0, listeners)], CreditParams(norm_std=False))
    assert np.allclose([a[0] for a in adv.turns], [0.5, -0.5, 0.0, 0.0])


def test_elo_update_math():
    assert expected_score(1000, 1000) == 0.5
    assert math.isclose(expected_score(1400, 1000), 1 / (1 + 10 ** -1))
    elo = Elo(k=32)
    elo.update("a", "b", 1.0)
    assert elo.ratings == {"a": 1016.0, "b": 984.0}
    elo.update("a", "b", 0.0)
    e = expected_score(1016, 984)
    assert math.isclose(elo.rating("a"), 1016 - 32 * e) and math.isclose(elo.rating("a") + elo.rating("b"), 2000)
    with pytest.raises(ValueError, match="Elo score"):
        elo.update("a", "b", 2.0)


def test_selfplay_pool_assigns_roles_snapshots_and_rates(tokenizer, tiny_model):
    made = []

    def engine_for(model):
        made.append(model)
        return ScriptedEngine(tokenizer, lambda p, n: "")

    sp = SelfPlay(tiny_model, engine_for, size=1, snapshot_every=1)
    assert made[0] is not tiny_model and not any(p.requires_grad for p in made[0].parameters())  # a frozen copy
    assert set(sp.opponents(2, ("first", "second"))) == {"second"} and set(sp.opponents(3, ("first", "second"))) == {"first"}
    won = Trajectory("nim-v0", 2, [], Termination.TERMINATED, success=True, agent="first")
    metrics = sp.after_step(1, [TrajectoryGroup("nim-v0", 2, [won])], {"eval/success_rate": 0.75})
    assert metrics["selfplay/elo"] == 1016.0 and metrics["selfplay/elo_base"] == 984.0 and metrics["selfplay/winrate_vs_base"] == 0.75
    sp.after_step(2, [], {})
    assert [m.name for m in sp.members] == ["base", "step2"]  # the base stays, the oldest snapshot goes
    assert all(e is sp.base.engine for e in sp.against_base().opponents(5, ("first", "second")).values())


def test_a_league_rule_stays_in_the_pool_and_plays_legally_in_its_own_episodes(tokenizer, tiny_model):
    from functools import reduce
    from operator import xor

    from turnrl.envs.nim import Nim
    from turnrl.rollout.multiagent import scripted

    sp = SelfPlay(tiny_model, lambda model: ScriptedEngine(tokenizer, lambda p, n: ""), size=1,
                  league={"rule": scripted(tokenizer, "rule")})
    seeds = [s for s in range(40) if sp.opponents(s, Nim.roles) and sp._played[s] == "rule"][:6]
    assert len(seeds) == 6  # drawn like any member: 1 of the pool's 2 before any snapshot
    learner = scripted(tokenizer, "oracle")  # Bouton's strategy plays the learner's role
    groups = MultiAgentCollector(learner, tokenizer, Nim, lineup=sp).collect(seeds, 2, SamplingParams(max_new_tokens=8))
    assert [g.seed for g in groups] == seeds  # one group per task: only the learner's role is recorded

    def by_hand(seed, learner_role):  # the same game played directly: the learner's oracle against the env's rule
        env = Nim()
        env.reset(seed=seed)
        winnable = learner_role == "first" and reduce(xor, env.heaps) != 0
        while env.acting():
            (role,) = env.acting()
            out = env.step({role: env.oracle(role) if role == learner_role else env.rule(role)})
            assert out.infos[role]["valid"]
        return out.infos[learner_role]["success"], winnable

    for g in groups:
        for t in g.trajectories:
            assert t.agent == SelfPlay.learner_role(g.seed, Nim.roles) and t.termination == Termination.TERMINATED
            assert all(turn.valid for turn in t.turns)
            won, winnable = by_hand(g.seed, t.agent)
            assert t.success == won and (won or not winnable)  # each rule read its own episode's heaps
    sp.after_step(1, groups, {})
    sp.after_step(2, [], {})
    assert [m.name for m in sp.members] == ["base", "rule", "step2"]  # the league stays beside the base
    assert "selfplay/elo_rule" in sp.after_step(3, [], {})


def _config(tmp_path, env_id, **over):
    from turnrl.config import Config

    raw = {"env": {"id": env_id, "max_turns": 4, "progress_reward": 0.0},
           "rollout": {"engine": "hf", "tasks_per_step": 2, "group_size": 2, "max_new_tokens": 4},
           "algo": {"skip_zero_advantage": False}, "train": {"steps": 1}, "eval": {"num_tasks": 2}, "log": {"run_dir": str(tmp_path), "checkpoint_at_end": False}}
    for section, values in over.items():
        raw.setdefault(section, {}).update(values)
    return Config.model_validate(raw)


@pytest.mark.parametrize("env_id,over", [("relay-v0", {"algo": {"estimator": "counterfactual"}}),
                                         ("nim-v0", {"multiagent": {"selfplay": True, "pool_size": 1, "league": ["rule"]}})])
def test_one_step_multiagent_training_run(tmp_path, tokenizer, tiny_model, env_id, over):
    from turnrl.build import build
    from turnrl.loop import train

    cfg = _config(tmp_path, env_id, **over)
    run = train(cfg, components=build(cfg, model=tiny_model, tokenizer=tokenizer))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    groups = 2 if cfg.multiagent.selfplay else 4  # 2 tasks x 2 roles, or x the learner's one role under self-play
    assert last["step"] == 1 and last["rollout/collected_groups"] == groups and last["train/num_samples"] > 0 and "train/loss" in last
    if cfg.multiagent.selfplay:
        assert {"selfplay/elo", "selfplay/winrate_vs_base", "selfplay/elo_base"} <= set(last)


def test_multiagent_config_errors(tmp_path, tokenizer, tiny_model):
    from turnrl.build import build
    from turnrl.config import ConfigError

    with pytest.raises(ConfigError, match="one group per role"):
        build(_config(tmp_path, "relay-v0", algo={"estimator": "remax"}), model=tiny_model, tokenizer=tokenizer)
    with pytest.raises(ConfigError, match="needs a multi-agent env"):
        build(_config(tmp_path, "frozenlake-v0", multiagent={"selfplay": True}), model=tiny_model, tokenizer=tokenizer)
    with pytest.raises(ConfigError, match=r"relay-v0 has no rule\(role\) to play; drop \['rule'\]"):
        build(_config(tmp_path, "relay-v0", multiagent={"selfplay": True, "league": ["rule"]}), model=tiny_model,
              tokenizer=tokenizer)
    with pytest.raises(ValueError, match="fills the self-play pool: set multiagent.selfplay=true"):
        _config(tmp_path, "nim-v0", multiagent={"league": ["rule"]})
    with pytest.raises(ConfigError, match="scale.async_mode=false"):
        build(_config(tmp_path, "nim-v0", multiagent={"selfplay": True}, scale={"async_mode": True}), model=tiny_model,
              tokenizer=tokenizer)


def test_a_failing_env_ends_every_role_of_its_episode_and_nothing_else(tokenizer):
    from turnrl.envs.relay import CodeRelay

    class Failing(CodeRelay):
        def step(self, actions):
            if "listener" in actions:
                raise RuntimeError("boom")
            return super().step(actions)

    envs = iter([Failing(), CodeRelay()])
    col = MultiAgentCollector(ScriptedEngine(tokenizer, lambda p, n: oracle_text(p)), tokenizer, lambda: next(envs))
    groups = col.collect([0, 1], 1, SamplingParams(max_new_tokens=8))
    failed, fine = [t for g in groups[:2] for t in g.trajectories], [t for g in groups[2:] for t in g.trajectories]
    assert all(t.termination == Termination.ENV_ERROR and "boom" in t.error for t in failed)  # speaker and listener
    assert failed[1].turns[0].valid is False
    assert all(t.termination == Termination.TERMINATED and t.success for t in fine)


def test_counterfactual_coverage_counts_turns_with_company():
    # listeners: two heard "A" and entered the same code, one heard "B"; speakers: every message worded differently
    listeners = [_traj("listener", 0.0, 1.0, ["A"], "ENTER 1"), _traj("listener", 0.0, 0.0, ["A"], "ENTER 1"),
                 _traj("listener", 0.0, 0.0, ["B"], "ENTER 2")]
    speakers = [_traj("speaker", 0.0, team, ["codes"], f"SAY {i}") for i, team in enumerate((1.0, 0.0, 0.0))]
    groups = [TrajectoryGroup("x", 0, listeners), TrajectoryGroup("x", 0, speakers)]
    m = credit_metrics(groups, get_estimator("counterfactual")(groups, CreditParams()))
    assert m["credit/shared_state_turns"] == pytest.approx(5 / 6)  # all three speakers faced "codes"; two listeners "A"
    assert m["credit/shared_action_turns"] == pytest.approx(2 / 6)  # only the two "A" listeners acted alike
    # every copy faced one state (the baseline is the group mean) and no two acted alike (Q is the turn's own return):
    # counterfactual is then team_grpo exactly, the case a low shared_action_turns flags
    group = [TrajectoryGroup("x", 0, speakers)]
    cf, team = get_estimator("counterfactual")(group, CreditParams()), get_estimator("team_grpo")(group, CreditParams())
    assert np.allclose(cf.turns, team.turns)
    single = TrajectoryGroup("x", 0, [Trajectory("x", 0, [Turn([1], [2], [0.0], "o", "r")])] * 2)
    assert "credit/shared_state_turns" not in credit_metrics([single], Advantages([[0.0], [0.0]]))
