"""The multi-agent env contract and the built-in multi-agent envs: relay-v0 (cooperative) and nim-v0 (competitive)."""

import random
import re

import pytest

from turnrl.envs import EnvCheckError, check_env, make, registered
from turnrl.envs.multiagent import MultiAgentEnv, MultiStep, check_multiagent_env, parse_message
from turnrl.envs.nim import Nim, largest_heap_rule
from turnrl.envs.relay import CodeRelay, no_message_rule


def play(env, policies, seed):
    """Play one episode; ``policies[role](env, role)`` gives each response. Returns each role's last info and the steps."""
    env.reset(seed=seed)
    infos, steps = {}, 0
    while env.acting():
        out = env.step({r: policies[r](env, r) for r in env.acting()})
        infos.update(out.infos)
        steps += 1
    return infos, steps


def oracle(env, role):
    return env.oracle(role)


@pytest.mark.parametrize("env_id", ["relay-v0", "relay-doors-v0", "nim-v0"])
def test_builtin_multiagent_envs_pass_check_env(env_id):
    assert env_id in registered()
    check_env(env_id, seeds=range(5), random_tasks=True)


def test_the_checker_rejects_a_broken_multiagent_env():
    class MissingRole(CodeRelay):
        def step(self, actions):
            out = super().step(actions)
            del out.rewards["speaker"]
            return out

    with pytest.raises(EnvCheckError, match="rewards has roles"):
        check_multiagent_env(MissingRole())


def test_relay_cannot_be_solved_without_a_message():
    env = CodeRelay(digits=2)
    seeds = range(300)
    team = [play(env, {"speaker": oracle, "listener": oracle}, s)[0]["listener"]["success"] for s in seeds]
    assert all(team)  # the oracle team, which talks, always succeeds
    # the best rule that ignores messages: the speaker says nothing useful, the listener enters a fixed code
    silent = {"speaker": lambda e, r: "SAY hello", "listener": lambda e, r: no_message_rule(2)}
    alone = [play(env, silent, s)[0]["listener"]["success"] for s in seeds]
    assert sum(alone) / len(alone) < 0.05  # chance is 1 in 100 codes
    # the oracle listener acts on what it was told: a wrong message makes the team fail
    lied = {"speaker": lambda e, r: "SAY 99" if e.code != "99" else "SAY 98", "listener": oracle}
    assert not any(play(env, lied, s)[0]["listener"]["success"] for s in range(20))


def test_relay_roles_see_only_their_own_part():
    env = CodeRelay(digits=3)
    obs, _ = env.reset(seed=4)
    assert env.code in obs["speaker"] and env.code not in obs["listener"]
    assert env.acting() == ("speaker",)
    out = env.step({"speaker": "I refuse."})  # no SAY: invalid, the speaker acts again, nothing changes
    assert out.infos["speaker"]["valid"] is False and env.acting() == ("speaker",) and out.rewards == {"speaker": 0.0, "listener": 0.0}
    out = env.step({"speaker": f"SAY it is {env.code}"})
    assert out.observations == {"listener": f"speaker: it is {env.code}\nEnter the 3-digit code: ENTER <code>"}
    assert env.acting() == ("listener",) and env.anchor("listener") == f"message: it is {env.code}"
    out = env.step({"listener": f"ENTER {env.code}"})
    assert out.rewards == {"speaker": 1.0, "listener": 1.0} and all(out.terminated.values()) and env.acting() == ()
    with pytest.raises(ValueError, match="acting now"):
        env.step({"listener": "ENTER 123"})


def test_relay_task_key_is_the_code():
    env = CodeRelay(digits=3)
    keys = set()
    for s in range(50):
        env.reset(seed=s)
        assert env.task_key() == f"relay:{env.code}"
        keys.add(env.task_key())
    assert len(keys) > 40


def test_relay_doors_splits_the_information_both_ways():
    env = CodeRelay(digits=3, doors=3)
    obs, _ = env.reset(seed=11)
    assert set(env.door_codes) >= {env.door} and env.door_codes[env.door] == env.code and len(set(env.door_codes)) == 3
    assert all(code in obs["speaker"] for code in env.door_codes.values()) and f"the {env.door} door" not in obs["speaker"]
    assert f"Open the {env.door} door" in obs["listener"] and not any(c in obs["listener"] for c in env.door_codes.values())
    seeds = range(300)
    team = [play(env, {"speaker": oracle, "listener": oracle}, s)[0]["listener"]["success"] for s in seeds]
    assert all(team)

    def first_code(e, r):  # the listener enters the first code it hears, whatever its door
        return "ENTER " + re.search(r"\d{3}", e.message).group(0)

    first = [play(env, {"speaker": oracle, "listener": first_code}, s)[0]["listener"]["success"] for s in seeds]
    assert 0.2 < sum(first) / len(first) < 0.47  # the door comes first in 1 of 3 orders
    # a message with only the listener's door's code is enough; one without it is not
    only_door = {"speaker": lambda e, r: f"SAY {e.door} {e.code}", "listener": oracle}
    assert all(play(env, only_door, s)[0]["listener"]["success"] for s in range(30))


def test_relay_doors_task_key_names_every_door_and_the_one_to_open():
    env = CodeRelay(doors=3)
    keys = set()
    for s in range(50):
        env.reset(seed=s)
        key = env.task_key()
        assert key.startswith("relay-doors:") and key.endswith(f":open={env.door}") and env.code in key
        keys.add(key)
    assert len(keys) == 50
    with pytest.raises(ValueError, match="doors=7"):
        CodeRelay(doors=7)


def test_nim_oracle_wins_every_winnable_game_against_the_fixed_rule_and_random_play():
    env = Nim()
    rng = random.Random(0)

    def rule(e, r):
        return largest_heap_rule(e.heaps)

    def uniform(e, r):
        heap = rng.choice([i for i, n in enumerate(e.heaps) if n])
        return f"TAKE {rng.randint(1, e.heaps[heap])} FROM {heap + 1}"

    winnable = 0
    for seed in range(60):
        env.reset(seed=seed)
        if env.heaps[0] ^ env.heaps[1] ^ env.heaps[2] == 0:
            continue  # the first player loses against perfect play
        winnable += 1
        for opponent in (rule, uniform):
            infos, _ = play(env, {"first": oracle, "second": opponent}, seed)
            assert infos["first"]["success"] and not infos["second"]["success"]
    assert winnable > 20


def test_nim_pays_the_winner_and_the_loser_on_the_last_move():
    env = Nim(heaps=1, max_heap=3)
    env.reset(seed=0)
    n = env.heaps[0]
    out = env.step({"first": "TAKE 9 FROM 1"})  # illegal: feedback, same player
    assert out.infos["first"]["valid"] is False and env.acting() == ("first",) and env.heaps == [n]
    out = env.step({"first": f"take {n} from heap 1"})
    assert out.rewards == {"first": 1.0, "second": -1.0} and out.infos["second"]["success"] is False
    assert "you lost" in out.observations["second"] and env.acting() == ()


def test_make_applies_the_multiagent_turn_limit_and_penalty():
    env = make("nim-v0", max_turns=2, invalid_penalty=0.5)
    assert isinstance(env, MultiAgentEnv)
    env.reset(seed=1)
    out = env.step({"first": "pass"})
    assert out.rewards["first"] == -0.5 and out.infos["first"]["reward_components"] == {"outcome": 0.0, "invalid_penalty": -0.5}
    out = env.step({"first": "pass"})
    assert out.truncated == {"first": True, "second": True} and out.infos["second"]["truncation"] == "turns"
    with pytest.raises(ValueError, match="progress_reward=0"):
        make("relay-v0", progress_reward=0.2)
    with pytest.raises(ValueError, match="env.reward=env"):
        make("nim-v0", reward="success")


def test_parse_message():
    assert parse_message("ok. say  the code is 12\nthanks") == "the code is 12"
    assert parse_message("nothing to SAY") is None
    assert isinstance(MultiStep({}, {}, {}, {}), MultiStep)


def test_textarena_two_player_games_map_onto_the_contract():
    pytest.importorskip("textarena")
    check_env("textarena-duel-v0", seeds=(0, 1))
    env = make("textarena-duel-v0", game="TicTacToe-v0")
    obs, _ = env.reset(seed=0)
    assert "Player 0" in obs["player0"] and obs["player1"] == "Wait for your opponent's move."
    out = None
    for role, move in [("player0", "[4]"), ("player1", "nonsense"), ("player1", "[0]"), ("player0", "[3]"),
                       ("player1", "[1]"), ("player0", "[5]")]:
        assert env.acting() == (role,)
        out = env.step({role: move})
        assert out.infos[role]["valid"] is (move != "nonsense")
    assert out.rewards == {"player0": 1.0, "player1": -1.0} and out.infos["player0"]["success"] and env.acting() == ()
    assert all("Game over" in o for o in out.observations.values())


def test_the_checker_reports_an_env_that_raises_on_model_text():
    class Raises(Nim):
        def step(self, actions):
            if "TAKE" not in next(iter(actions.values())):
                raise KeyError("no move")
            return super().step(actions)

    with pytest.raises(EnvCheckError, match="Raises raised KeyError"):
        check_multiagent_env(Raises())


def test_the_checker_plays_a_rule_team_and_reports_an_invalid_rule():
    class BadRule(Nim):
        def rule(self, role):
            return "TAKE 9 FROM 1"  # never legal: heaps hold at most 4

    check_multiagent_env(Nim())  # nim's rule (one from the largest heap) is always legal
    with pytest.raises(EnvCheckError, match=r"rule\(\) sent an invalid action.*Fix: make rule\(\) act validly"):
        check_multiagent_env(BadRule())


def test_hot_seat_plays_every_role_by_hand():
    from turnrl.envs.multiagent import hot_seat

    lines = iter(["?", "SAY 123", "ENTER 123"])
    printed = []
    env = CodeRelay(digits=3)
    result = hot_seat(env, seed=0, input_fn=lambda prompt: next(lines), print_fn=printed.append)
    assert any(p.startswith("oracle: SAY ") for p in printed) and result["finished"]
    assert result["success"] == {"speaker": env.code == "123", "listener": env.code == "123"}
    quit_early = hot_seat(CodeRelay(), seed=0, input_fn=lambda prompt: "q", print_fn=printed.append)
    assert quit_early["finished"] is False


def test_turnrl_play_on_a_multi_agent_env_is_the_hot_seat():
    from turnrl.envs.play import play

    printed = []
    result = play("nim-v0", seed=0, input_fn=lambda prompt: "q", print_fn=printed.append)  # once raised AttributeError
    assert result["finished"] is False and set(result["returns"]) == set(result["success"]) and printed


def test_nim_forfeits_a_player_that_cannot_move_legally():
    env = Nim(forfeit_after=3)
    env.reset(seed=0)
    for _ in range(2):
        out = env.step({"first": "pass"})  # invalid: feedback, the same player again
        assert env.acting() == ("first",) and not any(out.terminated.values())
    out = env.step({"first": "pass"})  # the third in a row loses the game
    assert out.rewards == {"first": -1.0, "second": 1.0} and all(out.terminated.values()) and env.acting() == ()
    assert out.infos["second"]["success"] and "forfeited" in out.observations["second"]
    assert "you lost" in out.observations["first"] and "you won" in out.observations["second"]
    env.reset(seed=0)  # a legal move resets the count
    env.step({"first": "pass"}), env.step({"first": "pass"}), env.step({"first": "TAKE 1 FROM 1"})
    env.step({"second": "pass"})
    assert env.acting() == ("second",) and env.invalid_in_a_row == 1
