"""Baseline policies on the exact held-out tasks a run evaluates on: what a learning number must beat.

A trained model's held-out success means little on its own: with FrozenLake's neighbour hint, the fixed rule "Down
if the hint says frozen, else Right" solves most maps. This module runs, on the tasks of
``build.TaskSplit(cfg, ...).eval_tasks`` (the held-out tasks the run's evaluation uses, distinct by task key), one
episode per task of:

- ``random``: uniform random over the env's valid actions (for tool envs a random well-formed call of one of
  the env's own tools; for WebShop a random button of the page; for code a function returning a random example
  output);
- ``rule``: the best simple fixed rule written for the env (the ``*_rule`` functions; each docstring says why it
  is the best simple one found);
- ``oracle``: the env's own plan (``Env.solve()``; tool envs' oracle calls), re-asked every turn;
- ``base`` (``--base``): the untrained model through the project's own evaluate path (``turnrl.loop.evaluate``).

An episode runs as the collector runs it for the model: the env from the run's own factory (``build.env_factories``:
same id, kwargs, ``max_turns``, penalties), reset with the task's seed, each response sent as text through
``astep`` until the env terminates or truncates. A response the model could not have written in one turn is cut
to ``rollout.max_new_tokens`` tokens of the run's tokenizer, as the engine cuts the model's (``finish_reason``
"length"; counted in ``cut``). Success, its 95% Wilson interval over the distinct tasks, reward and valid-action
rate come from :func:`turnrl.monitor.metrics.eval_metrics`, the function that scores the run's evaluation.

    python bench/baselines.py -c configs/default.yaml [--base] [--policies random rule oracle] [key=value ...]

prints the table and writes ``bench/results/baselines_<name>.json`` (``<name>``: the config file's stem).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # machine.py, when run as a script

from turnrl.build import Task, TaskSplit, env_factories  # noqa: E402
from turnrl.config import Config, load_config  # noqa: E402
from turnrl.envs import Env  # noqa: E402
from turnrl.envs import frozenlake, keys, sokoban  # noqa: E402
from turnrl.envs.code import CodeEnv  # noqa: E402
from turnrl.envs.countdown import Countdown  # noqa: E402
from turnrl.envs.search import shortest_plan  # noqa: E402
from turnrl.envs.searchqa import SearchQA  # noqa: E402
from turnrl.envs.sql import SQL  # noqa: E402
from turnrl.envs.tools.calls import ToolCall  # noqa: E402
from turnrl.envs.webshop import WebShop  # noqa: E402
from turnrl.monitor.metrics import eval_metrics  # noqa: E402
from turnrl.types import Termination, Trajectory, TrajectoryGroup, Turn  # noqa: E402

POLICIES = ("random", "rule", "oracle")


@dataclass
class Seen:
    """What a policy knows at a turn: every observation so far (the current one last) and the episode's RNG.

    ``env`` is there for the oracle only (it asks the env for a plan); random and rule policies read text.
    """

    env: Env
    observations: list[str]
    rng: random.Random

    @property
    def current(self) -> str:
        return self.observations[-1]


Policy = Callable[[Seen], str]


# ---------------------------------------------------------------------------------------------- uniform random


def random_word_action(words: tuple[str, ...]) -> Policy:
    """One of the env's action words, uniformly."""
    return lambda seen: seen.rng.choice(words)


def random_tool_call(seen: Seen) -> str:
    """A well-formed call of one of the env's tools, uniformly; each string argument is a word drawn uniformly from
    the text seen so far, each number an integer in [0, 100], each boolean a coin flip."""
    tools = seen.env.unwrapped.tools
    tool = tools[seen.rng.choice(sorted(tools))]
    words = re.findall(r"[\w.-]+", " ".join(seen.observations)) or ["x"]
    draw = {"string": lambda: seen.rng.choice(words), "integer": lambda: seen.rng.randint(0, 100),
            "number": lambda: seen.rng.randint(0, 100), "boolean": lambda: seen.rng.random() < 0.5}
    args = {name: draw[prop.get("type", "string")]() for name, prop in tool.parameters["properties"].items()}
    return ToolCall(tool.name, args).to_text()


def random_webshop(seen: Seen) -> str:
    """On the search page a search for a random half of the instruction's words; elsewhere a random button of the
    page (its navigation buttons, product ids and option values, as the observation lists them)."""
    obs = seen.current
    if "[Search]" in obs:
        words = _instruction(obs).split()
        return f"search[{' '.join(seen.rng.sample(words, max(1, len(words) // 2)))}]"
    return f"click[{seen.rng.choice(_webshop_buttons(obs))}]"


def random_keys(seen: Seen) -> str:
    """In a room Left or Right, at the vault door one of the colours, uniformly."""
    return seen.rng.choice(keys.COLOURS if "You stand at the vault door" in seen.current else keys.DIRECTIONS)


def random_code(seen: Seen) -> str:
    """A function of the asked name that returns one of the shown examples' outputs, chosen uniformly."""
    name, examples = _code_task(seen.observations[0])
    value = seen.rng.choice([out for _, out in examples]) if examples else None
    return f"```python\ndef {name}(*args):\n    return {value!r}\n```"


# ---------------------------------------------------------------------------------------------- fixed rules


def frozenlake_hint_rule(seen: Seen) -> str:
    """Down if the neighbour hint says Down is frozen (or the goal), else Right.

    The goal is always bottom-right, so Down and Right are the useful directions, and the hint line says whether
    Down is safe. On training maps (seeds 0-1999) it solves 75.3%; also checking Right, then Left, then Up for
    safety solves the same 75.3%, and preferring Right over Down 72.8%.
    """
    hint = re.search(r"Down: (\w+)", seen.current)
    return "Down" if hint and hint.group(1) in ("frozen", "goal") else "Right"


FROZENLAKE_MOVES = ("Right", "Down", "Down", "Right", "Down", "Right")


def frozenlake_sequence_rule(seen: Seen) -> str:
    """The fixed moves Right, Down, Down, Right, Down, Right (repeated), without reading the map.

    The best fixed sequence found for the raw grid (no hint): of all 256 sequences of 8 Down/Right moves, it and
    the sequences sharing its first six moves reach the goal on the most training maps (39.5% of seeds 0-1999;
    alternating Down, Right: 38.5%). Left and Up only lead away from the goal, which is always bottom-right.
    """
    return FROZENLAKE_MOVES[(len(seen.observations) - 1) % len(FROZENLAKE_MOVES)]


def sokoban_push_rule(seen: Seen) -> str:
    """Greedy pusher for one box: walk (shortest path around walls and boxes) to the cell behind the box, then push
    it toward the nearest free target along the axis with the larger gap (the other axis when that push is blocked).

    The simplest rule that solves anything: it ignores that a push can corner the box or that the box must first
    be moved off a wall line, which the oracle's search handles.
    """
    walls, boxes, targets, player = _sokoban_grid(seen.current)
    if not boxes or not targets:
        return "Up"  # solved or unreadable: any move
    box = min(boxes)
    target = min(targets, key=lambda t: abs(t[0] - box[0]) + abs(t[1] - box[1]))
    gaps = [(abs(target[0] - box[0]), "Down" if target[0] > box[0] else "Up"),
            (abs(target[1] - box[1]), "Right" if target[1] > box[1] else "Left")]
    for _, push in sorted((g for g in gaps if g[0] > 0), reverse=True):
        dr, dc = sokoban.MOVES[push]
        behind, ahead = (box[0] - dr, box[1] - dc), (box[0] + dr, box[1] + dc)
        if behind in walls or behind in boxes or ahead in walls or ahead in boxes:
            continue
        if player == behind:
            return push
        blocked = walls | boxes
        path = shortest_plan(player, lambda p: p == behind, lambda p: (
            (a, (p[0] + m[0], p[1] + m[1])) for a, m in sokoban.MOVES.items() if (p[0] + m[0], p[1] + m[1]) not in blocked))
        if path:
            return path[0]
    return "Up"


def keys_walk_rule(seen: Seen) -> str:
    """Take the passage the current observation calls open; at the vault door say red (a fixed colour).

    The best rule that reads only the current observation, as a context that dropped the first one does: the walk
    is always right and the code a guess, 1 in 6. Reading the first observation as well is the oracle.
    """
    passage = re.search(r"The (left|right) passage is open", seen.current)
    return passage.group(1).capitalize() if passage else keys.COLOURS[0]


def countdown_sum_rule(seen: Seen) -> str:
    """Answer the sum of all the numbers: the one fixed expression that uses each number once and lands in the
    target range most often."""
    numbers = re.search(r"Numbers: ([\d ]+)", seen.observations[0]).group(1).split()
    return ToolCall("answer", {"expression": " + ".join(numbers)}).to_text()


SQL_FIXED_QUERY = "SELECT city, COUNT(*) FROM customers GROUP BY city"


def sql_fixed_query_rule(seen: Seen) -> str:
    """Submit one fixed query: the count of customers per city, the only question template whose gold query has
    no parameter, so one fixed query answers every task of that template (1 in 8) and earns column credit on
    some others."""
    return ToolCall("submit", {"sql": SQL_FIXED_QUERY}).to_text()


def searchqa_top_hit_rule(seen: Seen) -> str:
    """Search the question, then answer the top hit's title: what a retrieve-and-read pipeline with no reading does."""
    hit = re.search(r'<tool_response name="search">\n\w+: ([^:\n]+):', seen.current)
    if hit:
        return ToolCall("answer", {"answer": hit.group(1)}).to_text()
    question = re.search(r"Question: (.*)", seen.observations[0]).group(1)
    return ToolCall("search", {"query": question}).to_text()


def webshop_first_result_rule(seen: Seen) -> str:
    """Search what the instruction asks for, open the first result, select every option value it names, buy.

    WebShop's own rule-based baseline (search the instruction, buy the first item) plus option selection, which
    the instruction spells out (``size: 9``), so reading it costs nothing. The query is the instruction up to its
    options (``i need bed sheets that are quick dry``): the whole instruction does not fit in one turn's tokens.
    """
    obs = seen.current
    if "[Search]" in obs:
        return f"search[{_instruction(obs).split(', with')[0]}]"
    if obs.startswith("Instruction:") and "Results for" in obs:
        first = re.search(r"^\[(\w+)\] ", obs, re.MULTILINE)
        return f"click[{first.group(1)}]" if first else "click[Back to Search]"
    instruction = _instruction(obs)
    for kind, values, selected in re.findall(r"^(\w+): ((?:\[[^\]]+\] ?)+)(?:\(selected: ([^)]*)\))?$", obs, re.MULTILINE):
        for value in re.findall(r"\[([^\]]+)\]", values):
            if f"{kind}: {value}" in instruction and value != selected:
                return f"click[{value}]"
    return "click[Buy Now]"


def code_examples_rule(seen: Seen) -> str:
    """Return the shown example's output for an example's input, else the first argument unchanged.

    The simplest program that passes what the task shows: it memorises the visible tests, and the identity
    fallback is right for the templates whose output often equals the input (clamping, filtering, sorting).
    """
    name, examples = _code_task(seen.observations[0])
    return (f"```python\ndef {name}(*args):\n    for given, out in {examples!r}:\n        if args == given:\n"
            "            return out\n    return args[0] if args else None\n```")


# ---------------------------------------------------------------------------------------------- oracle


def oracle(seen: Seen) -> str:
    """The first action of the env's plan from the current state (``Env.solve()``); no text when it has none."""
    plan = seen.env.solve()
    return plan[0] if plan else ""


# ---------------------------------------------------------------------------------------------- reading observations


def _instruction(obs: str) -> str:
    return re.search(r"Instruction: (.*)", obs).group(1)


def _webshop_buttons(obs: str) -> list[str]:
    """The page's buttons as its observation lists them: named ``click[...]`` actions, ``[id]`` results, ``[value]`` options."""
    named = [b for b in re.findall(r"click\[([^\]]+)\]", obs) if not b.startswith("<")]
    listed = re.findall(r"\[([^\]]+)\]", "\n".join(line for line in obs.splitlines()[1:] if not line.startswith("Actions:")))
    return named + [b for b in listed if b != "Search"]


def _code_task(statement: str) -> tuple[str, list[tuple[tuple[Any, ...], Any]]]:
    """The function's name and the shown examples ``(arguments, output)`` of a code task's statement."""
    name = re.search(r"`def (\w+)\(", statement).group(1)
    examples = []
    for line in re.findall(rf"^  ({name}\(.*)$", statement, re.MULTILINE):
        with contextlib.suppress(ValueError, SyntaxError):
            test = ast.parse(line, mode="eval").body
            examples.append((tuple(ast.literal_eval(a) for a in test.left.args), ast.literal_eval(test.comparators[0])))
    return name, examples


def _sokoban_grid(obs: str) -> tuple[set, set, set, tuple[int, int] | None]:
    """Walls, boxes off target, free targets and the player of a Sokoban observation."""
    walls, boxes, targets, player = set(), set(), set(), None
    for r, line in enumerate(row for row in obs.splitlines() if row.startswith("#")):
        for c, cell in enumerate(line.split()):
            pos = (r, c)
            walls |= {pos} if cell == "#" else set()
            boxes |= {pos} if cell == "X" else set()
            targets |= {pos} if cell in "OS" else set()
            player = pos if cell in "PS" else player
    return walls, boxes, targets, player


# ---------------------------------------------------------------------------------------------- which policy for which env


def policies_for(env: Env) -> dict[str, Policy]:
    """``{"random", "rule", "oracle"}`` for a built-in env; ValueError naming the env for any other."""
    inner = env.unwrapped
    rules: dict[type, tuple[Policy, Policy]] = {
        sokoban.Sokoban: (random_word_action(sokoban.ACTIONS), sokoban_push_rule),
        keys.KeysAndDoors: (random_keys, keys_walk_rule),
        Countdown: (random_tool_call, countdown_sum_rule),
        SQL: (random_tool_call, sql_fixed_query_rule),
        SearchQA: (random_tool_call, searchqa_top_hit_rule),
        WebShop: (random_webshop, webshop_first_result_rule),
        CodeEnv: (random_code, code_examples_rule),
    }
    if isinstance(inner, frozenlake.FrozenLake):
        rule = frozenlake_hint_rule if inner.show_hints else frozenlake_sequence_rule
        return {"random": random_word_action(frozenlake.ACTIONS), "rule": rule, "oracle": oracle}
    for kind, (uniform, rule) in rules.items():
        if isinstance(inner, kind):
            return {"random": uniform, "rule": rule, "oracle": oracle}
    built_in = "frozenlake, " + ", ".join(k.__name__ for k in rules)
    raise ValueError(f"no baseline policies for {type(inner).__name__}: bench/baselines.py has them for {built_in}; "
                     "add a rule there for a new env")


# ---------------------------------------------------------------------------------------------- the runner


@dataclass
class Cap:
    """The per-turn response limit: ``max_new_tokens`` tokens of ``tokenizer`` (None: no limit, e.g. in tests)."""

    tokenizer: Any = None
    max_new_tokens: int = 0

    def apply(self, text: str) -> tuple[str, list[int], str]:
        """``(text as the engine would return it, its token ids, finish reason)``."""
        if self.tokenizer is None:
            return text, [], "stop"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= self.max_new_tokens:
            return text, ids, "stop"
        ids = ids[: self.max_new_tokens]
        return self.tokenizer.decode(ids, skip_special_tokens=True), ids, "length"


async def run_episode(env: Env, task: Task, policy: Policy, cap: Cap, env_id: str, seed: int = 0) -> Trajectory:
    """One episode of ``policy`` on ``task`` in ``env``, recorded as the collector records the model's."""
    traj = Trajectory(env_id=env_id, seed=task.seed)
    try:
        observation, _ = await env.areset(seed=task.seed)
        traj.task_key = env.task_key()
        seen = Seen(env, [observation], random.Random(f"{seed}-{task.seed}"))
        while True:
            text, ids, finish = cap.apply(policy(seen))
            turn = Turn([], ids, [0.0] * len(ids), seen.current, text, finish_reason=finish)
            traj.turns.append(turn)
            observation, turn.reward, terminated, truncated, info = await env.astep(text)
            turn.reward_components = dict(info.get("reward_components", {"reward": turn.reward}))
            turn.actions, turn.valid = list(info.get("actions", [])), bool(info.get("valid", True))
            traj.success = bool(info.get("success", False))
            if terminated or truncated:
                traj.termination = Termination.TERMINATED if terminated else Termination.TRUNCATED_TURNS
                return traj
            seen.observations.append(observation)
    except Exception as e:  # noqa: BLE001 - as in the collector, a failing env ends only its own episode
        traj.termination, traj.error = Termination.ENV_ERROR, f"{type(e).__name__}: {e}"
        return traj
    finally:
        with contextlib.suppress(Exception):
            env.close()


def run_policy(factory: Callable[[], Env], tasks: list[Task], policy: Policy, cap: Cap, env_id: str,
               seed: int = 0) -> list[TrajectoryGroup]:
    """One episode per task (all concurrently, a fresh env each, as the evaluation runs them); one group per task."""

    async def every() -> list[Trajectory]:
        return list(await asyncio.gather(*(run_episode(factory(), t, policy, cap, env_id, seed) for t in tasks)))

    return [TrajectoryGroup(env_id=env_id, seed=t.seed, trajectories=[traj]) for t, traj in zip(tasks, asyncio.run(every()))]


def summary(m: dict[str, float]) -> dict[str, Any]:
    """The row of a policy from its ``eval/*`` metrics."""
    return {"success": m["eval/success_rate"], "ci95": [m["eval/success_ci_low"], m["eval/success_ci_high"]],
            "distinct_tasks": int(m["eval/distinct_tasks"]), "reward": m["eval/reward"],
            "valid": m["eval/valid_action_rate"], "turns": m["eval/turns"], "cut": m["eval/response_truncated_rate"]}


def held_out(cfg: Config) -> tuple[TaskSplit, Callable[[], Env], str]:
    """The run's split, the factory of the envs it evaluates on, and that env's id."""
    train_envs, eval_envs = env_factories(cfg)
    split = TaskSplit(cfg, train_envs, eval_envs)
    return split, split.eval_envs, cfg.eval.env_id or cfg.env.id


def measure(cfg: Config, names: tuple[str, ...] = POLICIES, tokenizer=None) -> dict[str, dict[str, Any]]:
    """Each named policy's row on the run's held-out tasks (``tokenizer``: cut responses as the engine would)."""
    split, factory, env_id = held_out(cfg)
    probe = factory()
    policies = policies_for(probe)
    probe.close()
    cap = Cap(tokenizer, cfg.rollout.max_new_tokens)
    rows = {}
    for name in names:
        t0 = time.perf_counter()
        groups = run_policy(factory, split.eval_tasks, policies[name], cap, env_id, cfg.train.seed)
        rows[name] = summary(eval_metrics(groups, time.perf_counter() - t0)) | {"seconds": time.perf_counter() - t0}
    return rows


def base_model(cfg: Config) -> dict[str, Any]:
    """The untrained model's row: the run's own components and evaluation (``turnrl.loop.evaluate``)."""
    from turnrl.build import build
    from turnrl.loop import evaluate

    t0 = time.perf_counter()
    row = summary(evaluate(build(cfg)))
    return row | {"seconds": time.perf_counter() - t0}


def cell(row: dict[str, Any] | None) -> str:
    """``0.781 [0.66-0.87]``: success with its interval, for tables."""
    if row is None:
        return "-"
    return f"{row['success']:.3f} [{row['ci95'][0]:.2f}-{row['ci95'][1]:.2f}]"


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = ["| policy | success [95% CI] | distinct tasks | reward | valid actions | turns | cut responses |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {cell(r)} | {r['distinct_tasks']} | {r['reward']:.3f} | {r['valid']:.2f} "
                     f"| {r['turns']:.1f} | {r['cut']:.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--config", type=Path, default=ROOT / "configs" / "default.yaml")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    ap.add_argument("--base", action="store_true", help="also evaluate the untrained model (loads it)")
    ap.add_argument("--name", help="result name (default: the config file's stem)")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides, as for turnrl train")
    args = ap.parse_args()
    if not args.config.exists():
        raise SystemExit(f"no config {args.config}: pass -c with a file under configs/")

    from machine import write_result
    from turnrl.build import quiet_transformers
    from turnrl.models import load_tokenizer

    cfg = load_config(args.config, args.overrides)
    with quiet_transformers():
        tokenizer = load_tokenizer(cfg.model.path)
    rows = measure(cfg, tuple(args.policies), tokenizer)
    if args.base:
        rows["base"] = base_model(cfg)
    env_id, distinct = cfg.eval.env_id or cfg.env.id, next(iter(rows.values()))["distinct_tasks"]
    print(f"{env_id} ({args.config}): {distinct} distinct held-out tasks from eval seed {cfg.eval.seed_start}, "
          "the run's own eval tasks (distinct by task key; training skips them)")
    print(table(rows))
    path = write_result(f"baselines_{args.name or args.config.stem}", {
        "config": str(args.config), "overrides": args.overrides, "env": env_id, "distinct_eval_tasks": distinct,
        "policies": rows}, measure=False)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
