"""The Python API: :func:`train`, :func:`sft` and :func:`evaluate`, the code path of ``turnrl train``, ``turnrl sft``
and ``turnrl eval``.

    import turnrl

    run = turnrl.train("configs/default.yaml", "train.steps=10")   # a Config, a YAML path, or None (the default)
    print(run.run_dir, run.evaluation)                              # the run directory, its last held-out evaluation
    print(turnrl.evaluate(checkpoint=run.run_dir))                  # success with its 95% interval

The CLI parses its arguments and calls these functions; everything between the arguments and the training loop
(which config, resuming, which checkpoint, which engine) happens here once, so a run started from Python and the
same run started from the shell write the same files. Your own code plugs in through the registries: an env with
``turnrl.register_env``, an advantage estimator with ``@turnrl.register_estimator``, and a reward function (turn
``t`` of a trajectory -> a float added to that turn's reward, as ``algo.prm``) with ``train(..., reward=fn)``.
``docs/api.md`` has a runnable example of each.

Light on purpose: torch loads when a run is built, not when this module is imported.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union

from turnrl.config import Config, ConfigChange, ConfigError, apply_overrides, load_config, record_changes, resume_config
from turnrl.credit.rewards import ProcessRewardModel, load_prm

if TYPE_CHECKING:
    from turnrl.sft import SftRun

ConfigSource = Union[Config, str, os.PathLike, None]
"""A :class:`Config`, the path of a YAML config file, or None (the built-in defaults: ``configs/default.yaml``)."""


@dataclass(frozen=True)
class EvalResult:
    """Held-out success as ``turnrl eval`` reports it.

    ``success_rate`` is the mean success over the held-out tasks (one greedy episode each by default); ``ci_low`` and
    ``ci_high`` bound it with a 95% Wilson interval over the ``distinct_tasks`` tasks (distinct by task key).
    ``metrics`` holds every ``eval/*`` metric and ``perf/eval_s`` (``docs/metrics.md``). ``str()`` is the line
    ``turnrl eval`` prints.
    """

    env_id: str
    success_rate: float
    ci_low: float
    ci_high: float
    distinct_tasks: int
    valid_action_rate: float
    metrics: dict[str, float]

    @classmethod
    def from_metrics(cls, env_id: str, m: dict[str, float]) -> EvalResult:
        """The result in a row of ``eval/*`` metrics (an evaluation's, or a ``metrics.jsonl`` row holding them)."""
        return cls(env_id, m["eval/success_rate"], m["eval/success_ci_low"], m["eval/success_ci_high"],
                   int(m["eval/distinct_tasks"]), m["eval/valid_action_rate"],
                   {k: v for k, v in m.items() if k.startswith("eval/") or k == "perf/eval_s"})

    def __str__(self) -> str:
        return (f"{self.env_id}: success {self.success_rate:.3f} (95% CI {self.ci_low:.3f}-{self.ci_high:.3f}) over "
                f"{self.distinct_tasks} distinct held-out tasks; valid actions {self.valid_action_rate:.3f}")


@dataclass(frozen=True)
class RunResult:
    """A training run as it stands after :func:`train`: where it is, how it ended, its last numbers.

    ``state`` and ``message`` are ``RUN/status.json``'s (``finished``; ``stopped`` by a signal, ``train.max_minutes``
    or a detector, resumable; ``failed``). ``metrics`` is the last step's row of ``metrics.jsonl`` (``step``
    included); ``evaluation`` the latest held-out evaluation in it (None if the run never evaluated). ``ran`` is
    False when nothing ran: the run being resumed had already finished (raise ``train.steps`` to extend it).
    """

    run_dir: Path
    state: str
    message: str
    metrics: dict[str, float]
    evaluation: EvalResult | None
    ran: bool = True

    @classmethod
    def of(cls, run_dir: str | os.PathLike, cfg: Config, ran: bool = True) -> RunResult:
        """The result of the run in ``run_dir`` (trained with ``cfg``), read from its files."""
        from turnrl.monitor.files import read_status
        from turnrl.monitor.sinks import read_metrics

        run_dir = Path(run_dir)
        rows = read_metrics(run_dir / "metrics.jsonl")
        status = read_status(run_dir) or {}
        last_eval = next((r for r in reversed(rows) if "eval/success_rate" in r), None)
        evaluation = EvalResult.from_metrics(cfg.eval.env_id or cfg.env.id, last_eval) if last_eval else None
        return cls(run_dir, status.get("state", "unknown"), status.get("message", ""), rows[-1] if rows else {},
                   evaluation, ran)


def train(config: ConfigSource = None, *overrides: str, resume: str | os.PathLike | None = None,
          reward: ProcessRewardModel | str | None = None) -> RunResult:
    """Train, as ``turnrl train [-c CONFIG] [OVERRIDES] [--resume RUN]`` does; returns the run's :class:`RunResult`.

    ``config`` is a :class:`Config`, a YAML path or None (the defaults); ``overrides`` are ``key=value`` strings, as
    on the command line (``"train.lr=1e-5"``). ``resume`` continues that run directory from its newest checkpoint,
    with its own ``config.yaml`` (a YAML ``config`` and the overrides may change what resume allows).

    Under a launcher (``torchrun --nproc-per-node N`` or several nodes, with ``scale.learner_ranks=N``), rank 0 trains
    and every other rank only serves its learner updates (:func:`turnrl.scale.distributed.serve_launched`), then
    returns a result with ``ran`` False.

    ``reward`` scores turn ``t`` of a trajectory, ``reward(trajectory, t) -> float``; the score times
    ``algo.prm_weight`` is added to that turn's reward as component ``prm`` before credit (evaluation reads only
    success). It is ``algo.prm`` given in code: a function defined at the top level of a module, or its
    ``"module:function"`` name, which ``config.yaml`` records.
    """
    from turnrl.scale.distributed import launched, serve_launched

    if (where := launched()) is not None and where[0] > 0:  # torchrun started this rank: it only serves rank 0's updates
        serve_launched()
        return RunResult(Path.cwd(), "served", f"learner rank {where[0]} of {where[1]} served rank 0's updates", {},
                         None, ran=False)
    overrides = (*overrides, f"algo.prm={_reward_name(reward)}") if reward is not None else overrides
    if resume is not None:
        return _resume(resume_dir(resume), config, overrides)
    from turnrl.loop import train as run_training

    cfg = resolve_config(config, overrides)
    return RunResult.of(run_training(cfg), cfg)


def evaluate(config: ConfigSource = None, *overrides: str, checkpoint: str | os.PathLike | None = None,
             engine: Literal["hf", "vllm", "openai"] = "hf", **engine_options: Any) -> EvalResult:
    """Held-out success of a checkpoint or the base model, as ``turnrl eval`` measures it.

    ``checkpoint`` is a checkpoint directory, its ``model/``, or a run directory (its latest checkpoint); inside a
    run, the run's ``config.yaml`` is the config unless ``config`` is given. ``engine`` is ``hf`` (in process),
    ``vllm`` or ``openai`` (a served model, ``docs/engines.md``); ``engine_options`` go to
    :func:`turnrl.engines.make_engine` for the last two (``base_url=``, ``api_model=``, ``timeout=``, ...).
    """
    from turnrl.build import build, build_for_eval, load_libraries
    from turnrl.checkpoint import load_state
    from turnrl.loop import evaluate as run_evaluation

    if engine == "hf" and engine_options:
        raise ConfigError(f"engine options {', '.join(engine_options)} are for a served model: pass engine='openai' "
                          "(turnrl eval --engine openai)")
    cfg = resolve_config(config, overrides, checkpoint=checkpoint)
    if checkpoint is not None:
        if engine == "openai":
            raise ConfigError("a checkpoint cannot be sent to a remote server; serve it there (e.g. `vllm serve "
                              f"{checkpoint_model(Path(checkpoint))}`) and pass its id: turnrl eval --engine openai "
                              "--base-url URL --api-model ID")
        cfg.model.path = str(checkpoint_model(Path(checkpoint)))
    components = build(cfg) if engine == "hf" else build_for_eval(cfg, engine, **engine_options)
    if checkpoint is not None and components.libraries:  # what the run's experience and skill libraries learnt
        load_libraries(components, load_state(checkpoint_model(Path(checkpoint)).parent))
    return EvalResult.from_metrics(cfg.eval.env_id or cfg.env.id, run_evaluation(components))


def sft(config: ConfigSource = None, *overrides: str) -> SftRun:
    """Supervised fine-tuning on demonstrations, as ``turnrl sft [-c CONFIG] [OVERRIDES]`` runs it (``docs/demos.md``).

    Returns a :class:`turnrl.sft.SftRun`: its ``model_path`` is what ``turnrl.train(config, f"model.path={...}",
    f"train.seed_start={run.next_seed}")`` starts RL from, on tasks past the demonstrated ones; ``before`` / ``after``
    are the held-out ``eval/*`` metrics around it.
    """
    from turnrl.sft import sft as run_sft

    return run_sft(resolve_config(config, overrides))


# ---------------------------------------------------------------------------------------------- configs and runs


def resolve_config(config: ConfigSource = None, overrides: Sequence[str] = (), *,
                   checkpoint: str | os.PathLike | None = None, resume: str | os.PathLike | None = None) -> Config:
    """The config a command runs with, the overrides on top: a resumed run's own (with the changes resume allows),
    else ``config``, else the config of the run that ``checkpoint`` points into, else the defaults."""
    if resume is not None:
        return _resumed_config(resume_dir(resume), config, overrides)[0]
    if isinstance(config, Config):
        return apply_overrides(config, list(overrides))
    run = run_of(Path(checkpoint)) if checkpoint is not None else None
    if config is None and run is not None:
        config = run / "config.yaml"
        print(f"config: {config} (the run's own; a config file or key=value overrides change it)", file=sys.stderr)
    return load_config(config, overrides)


def _resume(run: Path, config: ConfigSource, overrides: Sequence[str]) -> RunResult:
    """Continue ``run`` with its own config and the changes resume allows; a finished run says how to extend it."""
    from turnrl.build import build
    from turnrl.checkpoint import latest_checkpoint
    from turnrl.loop import train as run_training

    cfg, changes = _resumed_config(run, config, overrides)
    ckpt = latest_checkpoint(run)
    done = int(ckpt.name.removeprefix("step_")) if ckpt is not None else 0
    if done >= cfg.train.steps:
        print(f"{run} already finished: its last checkpoint is step {done} of train.steps={cfg.train.steps}. "
              f"To train it further, raise train.steps: turnrl train --resume {run} train.steps={2 * done}")
        return RunResult.of(run, cfg, ran=False)
    components = build(cfg)  # a model or env that fails to build stops here, before the run's files change
    record_changes(run, cfg, changes, step=done)
    for c in changes:
        print(f"from step {done}: {c.key} = {c.new!r} (was {c.old!r}; recorded in {run / 'config_changes.jsonl'})",
              file=sys.stderr)
    return RunResult.of(run_training(cfg, resume=run, components=components), cfg)


def _resumed_config(run: Path, config: ConfigSource, overrides: Sequence[str]) -> tuple[Config, list[ConfigChange]]:
    """:func:`~turnrl.config.resume_config` of ``run``; ``config`` may be a YAML file of changes, not a Config."""
    if isinstance(config, Config):
        raise ConfigError("a resumed run continues with its own config.yaml: pass key=value overrides (or a YAML file "
                          f"of changes), not a Config: turnrl train --resume {run} train.steps=N")
    return resume_config(run, list(overrides), config)


def resume_dir(run: str | os.PathLike) -> Path:
    """``run`` as a run directory to resume; raises ``FileNotFoundError`` (with the fix) when it is not one."""
    run = Path(run)
    if not (run / "config.yaml").exists():
        raise FileNotFoundError(f"{run} is not a run directory (no config.yaml); pass the directory `turnrl train` "
                                "printed: turnrl train --resume runs/NAME")
    return run


def run_of(path: Path) -> Path | None:
    """The run directory holding ``path``: the run, its ``checkpoints/``, a checkpoint, or a checkpoint's ``model/``."""
    for p in [path, *path.parents][:4]:
        if (p / "config.yaml").is_file() and (p / "checkpoints").is_dir():
            return p
    return None


def checkpoint_model(path: Path) -> Path:
    """The model directory of ``path``: a checkpoint, its ``model/``, or a run directory (its latest checkpoint)."""
    from turnrl.checkpoint import latest_checkpoint

    if (path / "checkpoints").is_dir():
        ckpt = latest_checkpoint(path)
        if ckpt is None:
            raise FileNotFoundError(f"{path} has no complete checkpoint; pass one of its checkpoints/step_* "
                                    f"directories, or train it further: turnrl train --resume {path}")
        path = ckpt
    return path / "model" if (path / "model").exists() else path


def _reward_name(reward: ProcessRewardModel | str) -> str:
    """The ``"module:function"`` that ``algo.prm`` records for ``reward``; refuses a function it cannot name."""
    if isinstance(reward, str):
        return reward
    name = f"{getattr(reward, '__module__', '')}:{getattr(reward, '__qualname__', '')}"
    try:
        found = load_prm(name)
    except (ImportError, ValueError):
        found = None
    if found is not reward:
        raise ConfigError(f"reward={reward!r} has no 'module:function' name that imports back to it (a lambda, a "
                          "nested function or a method): define it at the top level of a module, which config.yaml "
                          "records as algo.prm, e.g. turnrl.train(reward=my_reward) or "
                          "turnrl train algo.prm=mymodule:my_reward")
    return name
