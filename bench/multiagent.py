"""Multi-agent training: per-agent credit vs a shared team reward (relay-doors-v0), self-play against the base (nim-v0), and
a planner / executor hierarchy vs flat training on a long-horizon task (8x8 FrozenLake).

Three measurements, each training the default model (SmolLM2-135M-Instruct) from scratch with the run's own loop
(``turnrl.loop.train``), evaluated greedily on held-out tasks distinct by task key (``build.TaskSplit``):

- **cooperative** (relay-doors-v0: 3 coloured doors, 3-digit codes; ``--doors 1`` is relay-v0): the same budget and
  training tasks under ``algo.estimator=counterfactual``
  (per-agent credit: the team reward credited to the agent whose action mattered) and ``team_grpo`` (every agent gets
  the shared team advantage). Success is the team's (both roles share it).
- **self-play** (nim-v0 with ``multiagent.selfplay=true``): the learner plays one role per task against a pool of its
  frozen past versions (with ``--league rule``, also the always-legal rule); evaluation plays every task against the
  base model, so its success is the win rate vs base.
  The base model forfeits by invalid moves, so every legal player beats it; each player is also evaluated against
  the fixed rule (one object from the largest heap), an opponent that always moves legally (``selfplay_vs_rule``).
  With ``--sft N`` the learner starts from the base fine-tuned on both roles' oracle moves; the pool's first member
  is then that start (row ``sft``), and the base model is loaded again to be played against.
- **hierarchy** (``frozenlake-hier-v0`` vs ``frozenlake-8x8-v0``, docs/hierarchy.md): the same steps, tasks and
  episodes per step; the hierarchy's executor has the flat agent's 24 moves, its planner's turns come on top (joint
  limit 40). Both are evaluated every tenth of the run on the same held-out maps; ``hier_steps_ratio`` is the first
  evaluated step at which the hierarchy's success reaches flat training's final success, over flat's steps (target
  <= 0.6; null with ``hier.ratio_note`` saying why when flat did not improve on its base or the hierarchy never got
  there).

Every learning number stands beside, on the same held-out tasks: uniform random, the best simple fixed rule, the base
model (each run's step-0 evaluation) and the oracle, with 95% Wilson intervals over the distinct tasks. The policies
read only their own role's prompt (:class:`PolicyEngine`) and play through the same multi-agent collector as the
model. Cooperative: random = random digits said and entered; rule = with doors, say every door's colour and code and
enter the first code heard (one message-reading rule; without doors, the listener enters a fixed code,
:func:`~turnrl.envs.relay.no_message_rule`); oracle = say every door's code (or the code), enter your own door's.
Self-play (all against the base model): random = a uniform legal move; rule = one object from the largest heap;
oracle = Bouton's nim-sum strategy. Hierarchy: bench/baselines.py's FrozenLake policies on the flat env's held-out
maps (random move; Down if the hint says frozen, else Right; the shortest path), the ceiling of both arms.

    python bench/multiagent.py --smoke     # end-to-end check: 1 step per arm, 1 task x 2 episodes, 4 eval tasks
    python bench/multiagent.py             # full budget: 30 steps per arm, 4 tasks x 8 episodes, 32 eval tasks
    python bench/multiagent.py --arms hier # one measurement; the result file keeps the others' fields
    python bench/multiagent.py --arms coop --sft 5 --seeds 0 1 2  # both coop arms from 5 SFT steps, three seeds
    python bench/multiagent.py --smoke --arms per_role  # shared model vs a policy per role (relay-v0)
    python bench/multiagent.py --arms selfplay --league rule  # self-play with the legal-moving rule in the pool
    python bench/multiagent.py --arms hier --sft 10 --hier-side flat --hier-dir D &  # the two hierarchy sides in two
    python bench/multiagent.py --arms hier --sft 10 --hier-side hier --hier-dir D    # processes, then both read D:
    python bench/multiagent.py --arms hier --sft 10 --hier-side none --hier-dir D    # the ratio from the saved sides

A fourth measurement, only when asked (``--arms per_role``): relay-v0 trained with one shared model for both roles and
with a policy per role (``multiagent.policies=per_role``, docs/multiagent.md), the same estimator (counterfactual),
budget and tasks, beside the same baselines; with each arm's parameter count and mean seconds per training step.

merges into ``bench/results/multiagent.json`` (``machine.merge_result``: each field's command, date and commit under
``sources``) ``coop_per_agent``, ``coop_shared``, ``distinct_eval_tasks``, ``selfplay_winrate``, ``selfplay_ci95``,
``selfplay_vs_rule``, ``selfplay_vs_rule_ci95``, ``hier_steps_ratio`` (and ``policies_shared``,
``policies_per_role`` with ``--arms per_role``), plus every row. Run
directories go to a temporary directory that is deleted (no checkpoints are kept).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from baselines import measure  # noqa: E402
from machine import commit, cpu_model, merge_result  # noqa: E402

from turnrl.build import build, sampling_params  # noqa: E402
from turnrl.config import Config  # noqa: E402
from turnrl.engines.base import Completion, Engine, SamplingParams  # noqa: E402
from turnrl.envs.nim import Nim, largest_heap_rule  # noqa: E402
from turnrl.envs.relay import doors_message, no_message_rule  # noqa: E402
from turnrl.loop import train  # noqa: E402
from turnrl.monitor.metrics import eval_metrics  # noqa: E402
from turnrl.rollout.multiagent import Lineup, MultiAgentCollector, scripted  # noqa: E402
from turnrl.rollout.selfplay import SelfPlay  # noqa: E402
from turnrl.sft import sft  # noqa: E402

BUDGETS = {"smoke": dict(steps=1, tasks=1, group=2, eval_tasks=4), "full": dict(steps=30, tasks=4, group=8, eval_tasks=32)}
DIGITS, DOORS = 3, 3  # the cooperative arms' env: relay-doors-v0 (``--digits``, ``--doors``)
Policy = Callable[[str], str]


class PolicyEngine:
    """An engine whose response to a prompt is ``policy(decoded prompt)``: a fixed rule that sees what the role sees."""

    def __init__(self, tokenizer, policy: Policy) -> None:
        self.tokenizer, self.policy, self.version = tokenizer, policy, 0

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        out = []
        for p in prompts:
            ids = self.tokenizer(self.policy(self.tokenizer.decode(p)), add_special_tokens=False)["input_ids"]
            out.append(Completion(list(ids), [0.0] * len(ids), "stop"))
        return out


def _last(pattern: str, text: str) -> str | None:
    """The first group of the last match of ``pattern`` in ``text`` (the newest observation, after the few-shot ones)."""
    found = re.findall(pattern, text)
    return found[-1] if found else None


def relay_policies(rng: random.Random, n_digits: int) -> dict[str, Policy]:
    """Random, rule and oracle teams of relay-v0, one code or coloured doors (read from the prompt)."""
    def role_of(prompt: str) -> str:
        return "speaker" if "You are the speaker" in prompt else "listener"

    def digits() -> str:
        return "".join(str(rng.randrange(10)) for _ in range(n_digits))

    def say_all(prompt: str) -> str:
        doors = _last(r"Door codes: ([^\n]*?)\. Your teammate", prompt)
        if doors is None:
            return "SAY " + str(_last(r"The secret code is (\d+)", prompt))
        return "SAY " + doors_message(re.findall(r"(\w+) door (\d+)", doors))

    def enter(prompt: str, own_door: bool) -> str:
        message, door = _last(r"speaker: ([^\n]*)", prompt) or "", _last(r"Open the (\w+) door", prompt)
        found = re.search(rf"{door}\W*(\d{{{n_digits}}})" if own_door and door else rf"(\d{{{n_digits}}})", message)
        return "ENTER " + (found.group(1) if found else "0" * n_digits)

    def rule(prompt: str) -> str:
        if "Door codes:" in prompt or "Open the" in prompt:  # doors: say everything, enter the first code heard
            return say_all(prompt) if role_of(prompt) == "speaker" else enter(prompt, own_door=False)
        return "SAY hello" if role_of(prompt) == "speaker" else no_message_rule(n_digits)

    return {
        "random": lambda p: f"SAY {digits()}" if role_of(p) == "speaker" else f"ENTER {digits()}",
        "rule": rule,
        "oracle": lambda p: say_all(p) if role_of(p) == "speaker" else enter(p, own_door=True),
    }


def nim_policies(rng: random.Random) -> dict[str, Policy]:
    def heaps(prompt: str) -> list[int]:
        return [int(n) for n in re.findall(r"\d+:(\d+)", _last(r"Heaps: ([\d: ]+)", prompt) or "")]

    def uniform(prompt: str) -> str:
        h = heaps(prompt)
        i = rng.choice([k for k, n in enumerate(h) if n])
        return f"TAKE {rng.randint(1, h[i])} FROM {i + 1}"

    def oracle(prompt: str) -> str:
        env = Nim()
        env.heaps = heaps(prompt)
        return env.oracle("")

    return {"random": uniform, "rule": lambda p: largest_heap_rule(heaps(p)), "oracle": oracle}


def config(env_id: str, budget: dict[str, int], run_dir: str, overrides: dict[str, Any]) -> Config:
    raw: dict[str, Any] = {
        "env": {"id": env_id, "max_turns": 12, "progress_reward": 0.0, "invalid_penalty": 0.1},
        "rollout": {"tasks_per_step": budget["tasks"], "group_size": budget["group"], "max_new_tokens": 10},
        "train": {"steps": budget["steps"]},
        "eval": {"num_tasks": budget["eval_tasks"], "every": max(1, budget["steps"] // 3)},
        "log": {"run_dir": run_dir, "checkpoint_at_end": False, "checkpoint_every": 0},
    }
    for section, values in overrides.items():
        raw.setdefault(section, {}).update(values)
    return Config.model_validate(raw)


def from_sft(run, extra: dict[str, Any]) -> dict[str, Any]:
    """Overrides that start RL from SFT ``run``'s checkpoint, on training tasks past the demonstrated ones
    (``SftRun.next_seed``), keeping ``extra``'s other ``train`` keys (they are merged per section, ``extra`` first)."""
    return {"model": {"path": str(run.model_path)}, "train": {**extra.get("train", {}), "seed_start": run.next_seed}}


def row(metrics: dict[str, float]) -> dict[str, Any]:
    return {"success": metrics["eval/success_rate"], "ci95": [metrics["eval/success_ci_low"], metrics["eval/success_ci_high"]],
            "distinct_tasks": int(metrics["eval/distinct_tasks"])}


def trained(cfg: Config) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, float]], Any]:
    """Train ``cfg``; returns the base (step 0) and final evaluation rows, every logged row, and the components."""
    c = build(cfg)
    t0 = time.perf_counter()
    run = train(cfg, components=c)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/success_rate" in r]
    print(f"  trained {cfg.env.id} {cfg.algo.estimator} {cfg.multiagent.policies}{' self-play' if cfg.multiagent.selfplay else ''} in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return row(evals[0]), row(evals[-1]), rows, c


def play(c: Any, engine: Engine, lineup: Lineup | None) -> dict[str, Any]:
    """``engine`` on the run's held-out tasks, greedy, through the multi-agent collector; ``lineup`` plays the other
    roles (None: ``engine`` plays every role)."""
    collector = MultiAgentCollector(engine, c.tokenizer, c.collector.env_factory, c.collector.context, lineup=lineup)
    t0 = time.perf_counter()
    groups = collector.collect([t.seed for t in c.tasks.eval_tasks], 1, sampling_params(c.cfg, greedy=True), env_id=c.cfg.env.id)
    return row(eval_metrics(groups, time.perf_counter() - t0))


def baselines(c: Any, policies: dict[str, Policy], lineup: Lineup | None = None) -> dict[str, dict[str, Any]]:
    """Each policy on the run's held-out tasks (:func:`play`), reading only its own role's prompt."""
    return {name: play(c, PolicyEngine(c.tokenizer, policy), lineup) for name, policy in policies.items()}  # type: ignore[arg-type]


def cell(r: dict[str, Any]) -> str:
    return f"{r['success']:.3f} [{r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}]"


def relay_code(budget: dict[str, int]) -> dict[str, Any]:
    """The config override that sets relay-v0's code length and doors to the bench's ``--digits`` and ``--doors``, with
    room in a response for every door's colour and code."""
    return {"env": {"kwargs": {"digits": budget["digits"], "doors": budget["doors"]}},
            "rollout": {"max_new_tokens": 10 + 6 * (budget["doors"] - 1)}}


def coop_runs(budget: dict[str, Any], tmp: str, extra: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """One seed of the cooperative arms: the held-out rows of the base, the SFT start (with ``--sft``), per-agent
    and shared credit, and the last run's components."""
    rows: dict[str, Any] = {}
    code = relay_code(budget)
    start: dict[str, Any] = {}
    if budget["sft"]:
        run = sft(config("relay-v0", budget, tmp, {"sft": {"steps": budget["sft"], "num_demos": 64}, **code, **extra}))
        rows["base"] = row(run.before)
        start = from_sft(run, extra)
        gc.collect()
    first = "sft" if budget["sft"] else "base"  # the arms' step-0 evaluation
    for arm, estimator in (("per_agent", "counterfactual"), ("shared", "team_grpo")):
        cfg = config("relay-v0", budget, tmp, {"algo": {"estimator": estimator}, **code, **extra, **start})
        rows[first], rows[arm], _, c = trained(cfg)
    return rows, c


def coop_arm(budget: dict[str, Any], tmp: str, extra: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """relay-v0: per-agent (counterfactual) credit vs the shared team reward, beside the baselines, for each of
    ``--seeds`` (``train.seed``); with ``--sft N`` both arms of a seed start from one checkpoint fine-tuned for N steps
    on the oracle team's episodes of training tasks. ``coop_per_agent`` and ``coop_shared`` are the means over seeds."""
    seeds: dict[int, dict[str, Any]] = {}
    for seed in budget["seeds"]:
        seeds[seed], c = coop_runs(budget, tmp, {**extra, "train": {**extra.get("train", {}), "seed": seed}})
    coop: dict[str, Any] = {**seeds[budget["seeds"][0]], "seeds": seeds}
    coop.update(baselines(c, relay_policies(rng, budget["digits"])))
    mean = {arm: sum(r[arm]["success"] for r in seeds.values()) / len(seeds) for arm in ("per_agent", "shared")}
    print(f"\nrelay-v0 ({budget['doors']} doors, {budget['digits']}-digit codes), team success on {coop['base']['distinct_tasks']} held-out tasks ({budget}):")
    for name in ("random", "rule", "oracle"):
        print(f"  {name:10s} {cell(coop[name])}")
    for seed, r in seeds.items():
        print(f"  seed {seed}: " + ", ".join(f"{name} {cell(r[name])}" for name in ("base", "sft", "per_agent", "shared") if name in r))
    print(f"  mean over {len(seeds)} seeds: per_agent {mean['per_agent']:.3f}, shared {mean['shared']:.3f}, "
          f"difference {mean['per_agent'] - mean['shared']:+.3f} (target >= +0.10)")
    return {"coop_per_agent": mean["per_agent"], "coop_shared": mean["shared"],
            "distinct_eval_tasks": coop["base"]["distinct_tasks"], "coop": coop}


def selfplay_arm(budget: dict[str, Any], tmp: str, extra: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """nim-v0 under self-play (with ``--league``, scripted members in the pool for good; with ``--sft N``, from the base
    fine-tuned for N steps on both roles' oracle moves): the trained learner's win rate against the base model and
    against the rule, beside the baselines and the starting model."""
    start: dict[str, Any] = {}
    if budget["sft"]:
        run = sft(config("nim-v0", budget, tmp, {"sft": {"steps": budget["sft"], "num_demos": 64}, **extra}))
        start = from_sft(run, extra)
        gc.collect()
    cfg = config("nim-v0", budget, tmp, {"multiagent": {"selfplay": True, "pool_size": 2, "league": budget["league"]},
                                         **extra, **start})
    _, _, curve, c = trained(cfg)
    begun = c.selfplay.base.engine  # the pool's "base" is the model training started from: with --sft, the fine-tuned one
    players = {"base": base_engine(c, config("nim-v0", budget, tmp, extra).model.path) if budget["sft"] else begun, "trained": c.engine} | ({"sft": begun} if budget["sft"] else {})
    policies = nim_policies(rng)
    # the base model forfeits by invalid moves, so anything legal beats it: a legal opponent (the rule) tells skill apart
    opponents = {"vs_base": players["base"], "vs_rule": scripted(c.tokenizer, "rule")}  # nim's rule(role)
    selfplay: dict[str, Any] = {"elo": {k: v for k, v in curve[-1].items() if k.startswith("selfplay/elo")}}
    for against, opponent in opponents.items():
        lineup = SelfPlay.against(opponent)
        selfplay[against] = baselines(c, policies, lineup) | {name: play(c, e, lineup) for name, e in players.items()}
    vs_base, vs_rule = selfplay["vs_base"], selfplay["vs_rule"]
    print(f"nim-v0, win rate on {vs_base['base']['distinct_tasks']} held-out tasks, against the base model | against the rule:")
    for name in ("random", "rule", "base", "sft", "trained", "oracle"):
        if name in vs_base:
            print(f"  {name:10s} {cell(vs_base[name])} | {cell(vs_rule[name])}")
    print(f"  Elo after training: {json.dumps({k: round(v, 1) for k, v in selfplay['elo'].items()})}")
    return {"selfplay_winrate": vs_base["trained"]["success"], "selfplay_ci95": vs_base["trained"]["ci95"],
            "selfplay_vs_rule": vs_rule["trained"]["success"], "selfplay_vs_rule_ci95": vs_rule["trained"]["ci95"],
            "selfplay": selfplay}


def base_engine(c: Any, path: str) -> Engine:
    """An engine of the run's kind over the model at ``path`` (the base the bench's fine-tuned start came from)."""
    from turnrl.engines import make_engine
    from turnrl.models import load_model

    return make_engine(c.cfg.rollout.engine, load_model(path), c.tokenizer, seed=c.cfg.train.seed,
                       threads=c.cfg.train.threads or None)


def success_curve(rows: list[dict[str, float]]) -> list[tuple[int, float]]:
    """``(step, held-out success)`` of every evaluation of a run, in order."""
    return [(int(r["step"]), r["eval/success_rate"]) for r in rows if "eval/success_rate" in r]


def steps_ratio(flat: list[tuple[int, float]], hier: list[tuple[int, float]]) -> tuple[float | None, str]:
    """``hier_steps_ratio``: the first evaluated step at which the hierarchy's held-out success reaches flat training's
    final success, over flat's step count; None (with the reason) when flat did not improve on its step-0 success
    (there is nothing to reach) or the hierarchy never reached it."""
    (_, flat_base), (flat_steps, flat_final) = flat[0], flat[-1]
    if flat_final <= flat_base:
        return None, f"flat training did not improve on its base ({flat_base:.3f} -> {flat_final:.3f}): nothing to reach"
    reached = next((step for step, success in hier if success >= flat_final), None)
    if reached is None:
        return None, (f"the hierarchy never reached flat's final success {flat_final:.3f} in its {hier[-1][0]} steps (its best: "
                      f"{max(s for _, s in hier):.3f}){'; it trained fewer steps than flat' if hier[-1][0] < flat_steps else ''}")
    return reached / flat_steps, f"the hierarchy reached {flat_final:.3f} at step {reached} of flat's {flat_steps}"


def hier_side(side: str, env_id: str, max_turns: int, budget: dict[str, Any], tmp: str, extra: dict[str, Any]) -> dict[str, Any]:
    """One side of the hierarchy measurement: (with ``--sft N``, fine-tune the base on N steps of the side's own oracle
    demonstrations first, then) train ``env_id``, evaluated every tenth of the run; the step-0 and final rows, the
    held-out success curve and the milestone reward paid per step. Saved to ``--hier-dir`` when given."""
    every = {"eval": {"every": budget["eval_every"] or max(1, budget["steps"] // 10)}}
    shaping = budget["flat_progress"] if side == "flat" else budget["hier_progress"]
    env = {"env": {"max_turns": max_turns, "progress_reward": shaping}}
    start: dict[str, Any] = {}
    side_rows: dict[str, Any] = {}
    if budget["sft"]:  # evaluated before (the base row) and after (also the RL run's step 0) only
        run = sft(config(env_id, budget, tmp, {**env, "sft": {"steps": budget["sft"], "num_demos": 64}, "eval": {"every": 0},
                                                **extra}))
        side_rows["base"], start = row(run.before), from_sft(run, extra)
        gc.collect()
    cfg = config(env_id, budget, tmp, {**env, **every, **extra, **start})
    first, side_rows["trained"], rows, c = trained(cfg)
    side_rows["sft" if budget["sft"] else "base"] = first
    out = {**side_rows, "curve": success_curve(rows), "progress_reward": cfg.env.progress_reward,
           "milestone_per_step": [r["rollout/reward/milestone"] for r in rows if "rollout/reward/milestone" in r],
           "seconds": sum(r.get("perf/rollout_s", 0.0) + r.get("perf/train_s", 0.0) for r in rows)}
    if side == "flat":
        out["baselines"] = {name: {k: r[k] for k in ("success", "ci95", "distinct_tasks")}
                            for name, r in measure(cfg, tokenizer=c.tokenizer).items()}
    if budget["hier_dir"]:
        out = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit(),
               "cpu": cpu_model(), **out}
        Path(budget["hier_dir"]).mkdir(parents=True, exist_ok=True)
        (Path(budget["hier_dir"]) / f"{side}.json").write_text(json.dumps(out, indent=1))
    return out


HIER_SIDES = {"flat": ("frozenlake-8x8-v0", 24), "hier": ("frozenlake-hier-v0", 40)}


def hier_arm(budget: dict[str, Any], tmp: str, extra: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """8x8 FrozenLake: planner / executor with milestone and hindsight rewards vs flat training, same steps, tasks and
    episodes per step (and, with ``--sft N``, the same SFT steps on each side's own oracle), evaluated every tenth of
    the run on the same held-out maps (the hierarchy's task key is the map's), beside the flat env's random, rule and
    oracle. ``--hier-side`` trains one side only (two processes can then train the two sides side by side), saving it
    to ``--hier-dir``; a side not trained here is read from there."""
    sides: dict[str, Any] = {}
    for side, (env_id, max_turns) in HIER_SIDES.items():
        saved = Path(budget["hier_dir"] or tmp) / f"{side}.json"
        if budget["hier_side"] in (side, "both"):
            sides[side] = hier_side(side, env_id, max_turns, budget, tmp, extra)
            gc.collect()  # one run's model, optimizer and engine in memory at a time
        elif saved.exists():
            sides[side] = json.loads(saved.read_text())
    if len(sides) < 2:
        print(f"hierarchy: trained {budget['hier_side']} only (saved in {budget['hier_dir']}); the ratio needs both sides")
        return {}
    flat, hier = sides["flat"], sides["hier"]
    table = {**flat["baselines"], **{f"{name}_{side}": sides[side][name] for side in sides for name in ("base", "sft")
                                     if name in sides[side]}, "flat": flat["trained"], "hier": hier["trained"]}
    curves = {"flat_curve": [tuple(p) for p in flat["curve"]], "hier_curve": [tuple(p) for p in hier["curve"]]}
    ratio, note = steps_ratio(curves["flat_curve"], curves["hier_curve"])
    print(f"8x8 FrozenLake, success on {flat['trained']['distinct_tasks']} held-out maps (flat trained with "
          f"env.progress_reward={flat.get('progress_reward', 0.0)}):")
    for name in ("random", "rule", "base_flat", "sft_flat", "flat", "base_hier", "sft_hier", "hier", "oracle"):
        if name in table:
            print(f"  {name:10s} {cell(table[name])}")
    print(f"  curves: flat {curves['flat_curve']}; hier {curves['hier_curve']}")
    print(f"  hier_steps_ratio: {ratio} ({note})")
    return {"hier_steps_ratio": ratio, "hier": {**table, **curves, "ratio_note": note, "sides": sides}}


def per_role_arm(budget: dict[str, int], tmp: str, extra: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """relay-v0: one shared model for both roles vs a policy per role, the same counterfactual credit, budget and tasks,
    beside the baselines; with each arm's parameters (millions) and mean seconds per step (rollout + update)."""
    arms: dict[str, Any] = {}
    c = None
    for policies in ("shared", "per_role"):
        c = None  # one run's models, optimizers and engines in memory at a time
        gc.collect()
        cfg = config("relay-v0", budget, tmp, {"algo": {"estimator": "counterfactual"}, "multiagent": {"policies": policies},
                                               **relay_code(budget), **extra})
        arms["base"], arms[policies], rows, c = trained(cfg)
        steps = [r for r in rows if "perf/train_s" in r]
        arms[policies] |= {"parameters_m": sum(p.numel() for p in c.model.parameters()) / 1e6,
                           "step_s": sum(r["perf/rollout_s"] + r["perf/train_s"] for r in steps) / len(steps)}
    arms.update(baselines(c, relay_policies(rng, budget["digits"])))
    print(f"\nrelay-v0 ({budget['doors']} doors), team success on {arms['base']['distinct_tasks']} held-out tasks, shared model vs per-role ({budget}):")
    for name in ("random", "rule", "base", "shared", "per_role", "oracle"):
        more = f"  {arms[name]['parameters_m']:.1f}M parameters, {arms[name]['step_s']:.1f} s/step" if "step_s" in arms[name] else ""
        print(f"  {name:10s} {cell(arms[name])}{more}")
    return {"policies_shared": arms["shared"]["success"], "policies_per_role": arms["per_role"]["success"], "policies": arms}


ARMS = {"coop": coop_arm, "selfplay": selfplay_arm, "hier": hier_arm, "per_role": per_role_arm}
DEFAULT_ARMS = ["coop", "selfplay", "hier"]  # the three measurements


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the reduced budget (an end-to-end check, not a measurement)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=DEFAULT_ARMS,
                        help="which measurements to run (default: coop selfplay hier); the others' fields in the result "
                        "file are kept")
    parser.add_argument("--digits", type=int, default=DIGITS,
                        help="relay-v0's code length in the cooperative arms")
    parser.add_argument("--doors", type=int, default=DOORS,
                        help="relay-v0's coloured doors in the cooperative arms (1: one code, which the base model "
                        "already relays 0.94 of the time at 5 and 8 digits; 3: relay-doors-v0)")
    parser.add_argument("--sft", type=int, default=0, metavar="STEPS",
                        help="cooperative, self-play and hierarchy arms: start from the base fine-tuned for STEPS steps on 64 "
                        "oracle-team demonstrations of training tasks (0: from the base model)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="cooperative arms: train.seed of each repeat "
                        "(the SFT start and both arms); the result fields are the means over them")
    parser.add_argument("--steps", type=int, default=0, help="training steps per arm (0: the budget's, 30 in full)")
    parser.add_argument("--eval-every", type=int, default=0, help="hierarchy arm: evaluate every N steps (0: every "
                        "tenth of the run)")
    parser.add_argument("--flat-progress", type=float, default=0.0, help="hierarchy arm: the flat side's "
                        "env.progress_reward (oracle-progress shaping; 0: the goal reward only)")
    parser.add_argument("--hier-progress", type=float, default=0.0, help="hierarchy arm: the same oracle-progress "
                        "shaping in the hierarchy's env (its env.progress_reward: in the env it wraps, paid to both roles); 0: "
                        "milestone and hindsight rewards only")
    parser.add_argument("--hier-side", choices=["both", "none", *HIER_SIDES], default="both",
                        help="hierarchy arm: train only this side (run the two in two processes with one --hier-dir; "
                        "none: train neither, report from --hier-dir)")
    parser.add_argument("--hier-dir", default="", help="hierarchy arm: save each trained side's curve here and read "
                        "the side not trained from here")
    parser.add_argument("--league", nargs="*", choices=["rule", "oracle"], default=[],
                        help="self-play arm: scripted members kept in the pool beside the base model and the 2 newest "
                        "snapshots (multiagent.league; rule: one object from the largest heap, always legal)")
    parser.add_argument("--no-write", action="store_true", help="print the measurements, leave bench/results/multiagent.json "
                        "as it is")
    args = parser.parse_args()
    budget = {**BUDGETS["smoke" if args.smoke else "full"], "digits": args.digits, "doors": args.doors, "sft": args.sft,
              "seeds": args.seeds, "league": args.league, "hier_side": args.hier_side, "hier_dir": args.hier_dir, "eval_every": args.eval_every,
              "flat_progress": args.flat_progress, "hier_progress": args.hier_progress}
    if args.steps:
        budget["steps"] = args.steps
    rng = random.Random(0)
    extra = {"train": {"threads": args.threads}} if args.threads else {}
    t0 = time.perf_counter()
    fields: dict[str, Any] = {"budget": "smoke" if args.smoke else "full", **budget}
    measured: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in args.arms:
            measured |= ARMS[arm](budget, tmp, extra, rng)
    if not measured:  # one hierarchy side only: its curve is in --hier-dir
        return
    if args.no_write:
        print(json.dumps(fields | measured, indent=1, default=str))
        return
    path = merge_result("multiagent", fields | measured | {"wall_s": time.perf_counter() - t0})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
