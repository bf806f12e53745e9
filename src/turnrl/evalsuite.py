"""`turnrl eval --suite SUITE`: a transfer matrix of checkpoints (rows) over env / difficulty entries (columns).

A suite is a YAML list of entries, each an env and a difficulty to evaluate on (``configs/suites/``)::

    - name: frozenlake-4x4
      env: {id: frozenlake-v0, kwargs: {size: 4}}
      num_tasks: 16
      max_turns: 8            # optional: the row's env.max_turns and rollout.max_new_tokens otherwise
      max_new_tokens: 6

Each cell evaluates one model on one entry's held-out tasks, as ``turnrl eval`` does (:func:`turnrl.loop.evaluate`,
one greedy episode per task by default) with the row's own config (context strategy, turn limit, sampling), and
reports the success rate with its 95% Wilson interval over distinct tasks, the valid-action rate, the number of
distinct tasks and, with ``pass_k = k``, pass@k: ``k`` sampled episodes per task (at ``rollout.temperature``) and
the fraction of tasks at least one of them solved (Chen et al. 2021's estimator with ``n = k`` samples), with its
interval.

Held out means unseen by content. An entry's tasks are the seeds from ``eval.seed_start`` upwards whose task keys are
distinct and are none the given checkpoints trained on, where that is known: the ``train`` rows of a run's
``task_keys.jsonl`` (every step of the run, a superset for an earlier checkpoint), its SFT ``demos.jsonl``, and those
of the run its ``model.path`` started from. Every row sees the same tasks per column. At most ``16 * num_tasks`` seeds
are scanned, so an entry with few distinct tasks gets fewer; each cell reports how many it had.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnrl.api import checkpoint_model, resolve_config, run_of
from turnrl.build import Components, Task, build, env_factories, load_libraries, sampling_params, task_keys
from turnrl.checkpoint import load_state
from turnrl.config import Config, ConfigError
from turnrl.envs import Env
from turnrl.envs.multiagent import MultiAgentEnv
from turnrl.loop import evaluate
from turnrl.monitor.files import read_jsonl
from turnrl.monitor.metrics import wilson_interval
from turnrl.rollout import Collector
from turnrl.types import TrajectoryGroup

SCAN_FACTOR = 16  # seeds scanned per task asked, as TaskSplit scans for its held-out set
EXAMPLE = "configs/suites/transfer.yaml"


class SuiteEnv(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(description="registered env id, see `turnrl envs`")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="env keywords: the difficulty (size, num_boxes, ...)")


class SuiteEntry(BaseModel):
    """One column of the matrix: an env at a difficulty and how many held-out tasks to evaluate on."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, description="the column's name")
    env: SuiteEnv
    num_tasks: int = Field(16, ge=1, description="distinct held-out tasks asked for")
    max_turns: int | None = Field(None, ge=1, description="turn limit per episode (default: the row's env.max_turns)")
    max_new_tokens: int | None = Field(None, ge=1, description="tokens per response (default: the row's "
                                                               "rollout.max_new_tokens); tool calls need more than moves")


@dataclasses.dataclass(frozen=True)
class Cell:
    """One model on one entry. ``pass_at_k`` (and its interval) is None unless pass@k was asked."""

    column: str
    success: float
    ci_low: float
    ci_high: float
    valid_action_rate: float
    distinct_tasks: int
    pass_at_k: float | None = None
    pass_ci: tuple[float, float] | None = None

    def text(self, k: int) -> str:
        """``0.250 [0.10-0.47] · pass@4 0.500 [0.28-0.72] · valid 0.93 · n=16``."""
        out = f"{self.success:.3f} [{self.ci_low:.2f}-{self.ci_high:.2f}]"
        if self.pass_at_k is not None and self.pass_ci is not None:
            out += f" · pass@{k} {self.pass_at_k:.3f} [{self.pass_ci[0]:.2f}-{self.pass_ci[1]:.2f}]"
        return out + f" · valid {self.valid_action_rate:.2f} · n={self.distinct_tasks}"


@dataclasses.dataclass(frozen=True)
class Row:
    """One model's cells. ``model``: the checkpoint as given, or ``base (model.path)``."""

    model: str
    cells: list[Cell]


@dataclasses.dataclass(frozen=True)
class SuiteResult:
    """The matrix, with what it was measured on: the suite's entries, pass@k's ``k`` (0: not asked), the first seed
    scanned and how many trained task keys were held out of it (None: no checkpoint's training tasks were known)."""

    suite: str
    entries: list[SuiteEntry]
    rows: list[Row]
    pass_k: int
    seed_start: int
    excluded_keys: int | None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(dataclasses.replace(self, entries=[]))
        out["entries"] = [e.model_dump() for e in self.entries]
        return out

    def markdown(self) -> str:
        """The matrix as a markdown table: rows are models, columns the suite's entries."""
        heads = [f"{e.name} ({e.env.id}{''.join(f', {k}={v}' for k, v in e.env.kwargs.items())})" for e in self.entries]
        known = "none known" if self.excluded_keys is None else f"{self.excluded_keys} trained task keys excluded"
        lines = [f"# Eval suite {self.suite}", "",
                 f"Success [95% interval over distinct tasks]{f' · pass@{self.pass_k}' if self.pass_k else ''} · "
                 f"valid-action rate · n distinct held-out tasks (seeds from {self.seed_start}; {known}).", "",
                 "| model | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
        lines += [f"| {r.model} | " + " | ".join(c.text(self.pass_k) for c in r.cells) + " |" for r in self.rows]
        return "\n".join(lines) + "\n"

    def write(self, out_dir: Path) -> tuple[Path, Path]:
        """Write ``OUT/suite-NAME.json`` and ``OUT/suite-NAME.md``; returns their paths."""
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = out_dir / f"suite-{self.suite}.json", out_dir / f"suite-{self.suite}.md"
        paths[0].write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        paths[1].write_text(self.markdown())
        return paths


def load_suite(path: str | os.PathLike) -> list[SuiteEntry]:
    """The entries of a suite file; ConfigError naming the entry and the fix when it is malformed."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"suite {path} does not exist; pass a suite YAML file such as {EXAMPLE}")
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"suite {path}: a suite is a non-empty YAML list of entries {{name, env: {{id, kwargs}}, "
                          f"num_tasks}}; see {EXAMPLE}")
    entries = []
    for i, item in enumerate(raw):
        try:
            entries.append(SuiteEntry.model_validate(item))
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the entry"
            raise ConfigError(f"suite {path}, entry {i}: {where}: {first['msg']} (an entry is {{name, env: {{id, kwargs}}, "
                              f"num_tasks}}; see {EXAMPLE})") from None
    names = [e.name for e in entries]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"suite {path}: entry names {dupes} repeat; give each column its own name")
    return entries


def trained_keys(checkpoint: str | os.PathLike, depth: int = 4) -> set[str] | None:
    """The task keys the run holding ``checkpoint`` trained on (RL tasks and SFT demonstrations), with those of the
    run its ``model.path`` started from; None when ``checkpoint`` lies in no run directory."""
    run = run_of(Path(checkpoint))
    if run is None:
        return None
    keys = {t["key"] for row in read_jsonl(run / "task_keys.jsonl") if row.get("split") == "train"
            for t in row["tasks"] if t.get("key") is not None}
    keys |= {row["task_key"] for row in read_jsonl(run / "demos.jsonl") if row.get("task_key") is not None}
    start = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("model", {}).get("path", "")
    earlier = trained_keys(start, depth - 1) if depth > 1 and start else None
    return keys | (earlier or set())


def held_out_tasks(envs: Callable[[], Env], seed_start: int, num: int, exclude: set[str]) -> list[Task]:
    """The first ``num`` seeds from ``seed_start`` whose task keys are distinct and not in ``exclude`` (a seed whose
    reset fails counts as a task of its own), scanning at most ``SCAN_FACTOR * num`` seeds."""
    chosen: list[Task] = []
    seen = set(exclude)
    seed, last = seed_start, seed_start + SCAN_FACTOR * num
    while len(chosen) < num and seed < last:
        batch = task_keys(envs, range(seed, min(seed + 2 * (num - len(chosen)), last)))
        seed = batch[-1].seed + 1
        for t in batch:
            if len(chosen) < num and (t.key is None or t.key not in seen):
                chosen.append(t)
                seen.add(t.key)
    return chosen


def run_suite(suite: str | os.PathLike, checkpoints: Sequence[str | os.PathLike] = (), base: bool = False,
              config: Config | str | os.PathLike | None = None, overrides: Sequence[str] = (), pass_k: int = 0
              ) -> SuiteResult:
    """Evaluate each checkpoint (and the untrained ``model.path`` when ``base`` or no checkpoint is given) on every
    entry of ``suite``; returns the matrix. ``config`` and ``overrides`` are as for :func:`turnrl.evaluate`."""
    if pass_k < 0:
        raise ConfigError(f"pass_k={pass_k} must be >= 0 (0: no pass@k)")
    entries = load_suite(suite)
    known = [k for k in (trained_keys(c) for c in checkpoints) if k is not None]
    exclude = set().union(*known)
    rows, seed_start = [], 0
    first = checkpoints[0] if checkpoints else None  # the base row runs with the first checkpoint's run config
    for checkpoint, weights in ([(first, False)] if base or not checkpoints else []) + [(c, True) for c in checkpoints]:
        c = _components(config, overrides, checkpoint, weights, max(e.num_tasks for e in entries) * max(1, pass_k))
        seed_start = c.cfg.eval.seed_start
        label = str(checkpoint) if weights else f"base ({c.cfg.model.path})"
        rows.append(Row(label, [_cell(c, e, exclude, pass_k) for e in entries]))
        del c  # one model in memory at a time
    return SuiteResult(Path(suite).stem, entries, rows, pass_k, seed_start, len(exclude) if known else None)


def _components(config, overrides: Sequence[str], checkpoint: str | os.PathLike | None, weights: bool, slots: int
                ) -> Components:
    """The model of one row, built as :func:`turnrl.evaluate` builds it, with the config of the run ``checkpoint`` lies
    in (unless ``config`` is given) and its weights when ``weights`` (else the run's starting ``model.path``)."""
    cfg = resolve_config(config, overrides, checkpoint=checkpoint)
    cfg.eval.num_tasks = slots  # the engine's resident sequences: every episode of a cell at once
    cfg.curriculum.enabled = False  # the suite's entries set the difficulty
    if weights:
        cfg.model.path = str(checkpoint_model(Path(checkpoint)))
    c = build(cfg)
    if weights and c.libraries:  # what the run's experience and skill libraries learnt
        load_libraries(c, load_state(checkpoint_model(Path(checkpoint)).parent))
    return c


def _cell(c: Components, entry: SuiteEntry, exclude: set[str], pass_k: int) -> Cell:
    """Evaluate ``c``'s model on ``entry``'s held-out tasks."""
    cfg = c.cfg.model_copy(deep=True)
    cfg.env.id, cfg.env.kwargs, cfg.eval.env_id = entry.env.id, dict(entry.env.kwargs), ""
    cfg.env.max_turns = entry.max_turns or cfg.env.max_turns
    cfg.rollout.max_new_tokens = entry.max_new_tokens or cfg.rollout.max_new_tokens
    envs, _ = env_factories(cfg, c.experience, c.skills)
    probe = envs()
    probe.close()
    if isinstance(probe, MultiAgentEnv):
        raise ConfigError(f"suite entry {entry.name}: {entry.env.id} is multi-agent; a suite evaluates single-agent envs")
    collector = Collector(c.engine, c.tokenizer, envs, c.collector.context, step_timeout_s=cfg.env.step_timeout_s)
    seeds = [t.seed for t in held_out_tasks(envs, cfg.eval.seed_start, entry.num_tasks, exclude)]
    m = evaluate(dataclasses.replace(c, cfg=cfg, collector=collector, eval_collector=None), seeds)
    cell = Cell(entry.name, m["eval/success_rate"], m["eval/success_ci_low"], m["eval/success_ci_high"],
                m["eval/valid_action_rate"], int(m["eval/distinct_tasks"]))
    if not pass_k:
        return cell
    solved = _any_success(collector.collect(seeds, pass_k, sampling_params(cfg), env_id=entry.env.id))
    return dataclasses.replace(cell, pass_at_k=solved / max(1, len(seeds)), pass_ci=wilson_interval(solved, len(seeds)))


def _any_success(groups: list[TrajectoryGroup]) -> int:
    """How many groups (one per distinct task) have at least one successful episode."""
    return sum(any(t.success for t in g.trajectories) for g in groups)
