"""Demonstration sets on disk: successful episodes with their exact token ids, for ``turnrl sft`` and demo-guided RL.

A demonstration is a :class:`~turnrl.types.Trajectory` as the collector records it: each turn's prompt ids (the chat
template and context strategy of the run), the agent's response ids and the env's reply. Training on it uses the
learner's own layout (:func:`turnrl.learner.build_samples`), so the loss mask covers exactly the agent's tokens. Where
demonstrations come from (``docs/demos.md``):

- the env's oracle (``Env.solve()``) played through the collector (:mod:`turnrl.sft`, ``sft.demos=oracle``);
- rejection sampling from any engine: the successful episodes of a model (``sft.demos=sample``);
- an earlier run's recorded trajectories (:func:`demos_from_run`), or a file this module wrote (:func:`read_demos`).

The file is JSONL, one demonstration per line (:func:`demo_row` is the schema). Ids belong to one tokenizer: each
row records its vocabulary size and :func:`read_demos` refuses rows of another.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from turnrl.config import ConfigError, load_config
from turnrl.types import Termination, Trajectory, Turn

FORMAT = "turnrl-demo-v1"
"""The ``format`` field of every row; a row of another format is refused."""

T = TypeVar("T")


def demo_row(traj: Trajectory, source: str, vocab_size: int) -> dict[str, Any]:
    """One JSONL row: ``format``, ``source`` (``oracle``, ``sample``, ``run:DIR``, ...), ``vocab_size`` (of the tokenizer
    the ids belong to), ``env_id``, ``seed``, ``task_key``, ``context`` (``per_step`` or ``full``: how ``prompt_ids``
    are laid out), ``success``, ``reward``, ``termination`` and ``turns``: per turn ``prompt_ids`` (the whole prompt
    under ``per_step``; the ids new since the last response under ``full``), ``response_ids`` (the agent's tokens, the
    only ones trained on), ``response_text``, ``observation`` (what the response answered), ``actions``, ``valid``,
    ``reward``, ``finish_reason``."""
    return {
        "format": FORMAT, "source": source, "vocab_size": vocab_size, "env_id": traj.env_id, "seed": traj.seed,
        "task_key": traj.task_key, "context": traj.context, "success": traj.success, "reward": traj.total_reward,
        "termination": traj.termination.value,
        "turns": [{"prompt_ids": t.prompt_ids, "response_ids": t.response_ids, "response_text": t.response_text,
                   "observation": t.observation, "actions": t.actions, "valid": t.valid, "reward": t.reward,
                   "finish_reason": t.finish_reason} for t in traj.turns],
    }


def trajectory_of(row: dict[str, Any]) -> Trajectory:
    """The :class:`Trajectory` of a :func:`demo_row` (behaviour logprobs are not kept: 0 on every token)."""
    turns = [Turn(prompt_ids=list(t["prompt_ids"]), response_ids=list(t["response_ids"]),
                  logprobs=[0.0] * len(t["response_ids"]), observation=t["observation"], response_text=t["response_text"],
                  actions=list(t["actions"]), valid=bool(t["valid"]), reward=float(t["reward"]),
                  finish_reason=t["finish_reason"]) for t in row["turns"]]
    return Trajectory(env_id=row["env_id"], seed=int(row["seed"]), turns=turns, termination=Termination(row["termination"]),
                      success=bool(row["success"]), context=row["context"], task_key=row["task_key"])


def write_demos(path: str | Path, demos: Iterable[Trajectory], source: str, vocab_size: int) -> Path:
    """Write ``demos`` to the JSONL file ``path`` (replacing it); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(demo_row(t, source, vocab_size)) + "\n" for t in demos))
    return path


def read_demos(path: str | Path, vocab_size: int | None = None) -> list[Trajectory]:
    """The demonstrations of a JSONL file :func:`write_demos` wrote; with ``vocab_size``, refuses ids of another
    tokenizer. Every problem is a :class:`ConfigError` naming the file, the line and the fix."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no demonstration file {path}: `turnrl sft` writes RUN/demos.jsonl (docs/demos.md)")
    demos = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if row.get("format") != FORMAT:
                raise ValueError(f"format is {row.get('format')!r}, not {FORMAT!r}")
            if vocab_size is not None and row["vocab_size"] != vocab_size:
                raise ValueError(f"its ids are of a tokenizer of {row['vocab_size']} tokens, this model's has {vocab_size}; "
                                 "make demonstrations with this model's tokenizer")
            demos.append(trajectory_of(row))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{path}:{n} is not a demonstration ({type(e).__name__}: {e}); docs/demos.md has the "
                              "schema") from None
    return demos


def demos_from_run(run_dir: str | Path) -> list[Trajectory]:
    """The successful trajectories a training run recorded (``RUN/trajectories.jsonl``, ``log.sample_trajectories``
    per step), laid out by the run's ``rollout.context``. Task keys are not recorded there: None (whoever trains on
    them recomputes them from the seeds)."""
    run_dir = Path(run_dir)
    records, config = run_dir / "trajectories.jsonl", run_dir / "config.yaml"
    if not (records.is_file() and config.is_file()):
        raise ConfigError(f"{run_dir} is not a training run with recorded trajectories (no trajectories.jsonl and "
                          "config.yaml); pass the directory `turnrl train` printed")
    context = load_config(config).rollout.context
    demos = []
    for line in records.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a torn last line: the run was killed while writing it
            continue
        if row["success"] and row["termination"] != Termination.ENV_ERROR.value:
            turns = [dict(t, response_text=t["response"]) for t in row["turns"]]
            demos.append(trajectory_of(dict(row, turns=turns, context=context, task_key=None)))
    return demos


def demo_batch(items: Sequence[T], step: int, size: int) -> list[T]:
    """Step ``step``'s ``size`` items of ``items``, cycled in order (all of them when there are fewer)."""
    if not items:
        return []
    n = min(size, len(items))
    return [items[(step * n + i) % len(items)] for i in range(n)]
