"""What a resumed run may change, and the record of what it changed."""

from __future__ import annotations

import fnmatch
import json
import shlex
from pathlib import Path
from typing import Any, NamedTuple

from turnrl.config.load import _read_yaml, _validate, _with_overrides, load_config, write_config
from turnrl.config.schema import Config, ConfigError


#: What ``turnrl train --resume RUN`` may change (``fnmatch`` patterns): how long to train, how to evaluate, log and
#: watch, where the rollout service listens, and knobs that change neither the method nor what the checkpoint's state
#: means. ``train.lr`` is the one optimizer setting: Adam's moments do not depend on it, so a new rate continues the
#: run as a schedule would.
RESUMABLE = ("train.steps", "train.max_minutes", "train.threads", "train.lr", "train.grad_clip",
             "train.micro_batch_tokens", "env.step_timeout_s", "eval.*", "log.*", "monitor.*",
             "serve.host", "serve.port", "serve.*_timeout_s", "serve.record_file", "scale.sync_timeout_s",
             "scale.env_actors", "train.activation_checkpointing", "train.heap_mmap_threshold_kb",
             "train.group_by_prompt", "train.prefix_once")
#: Inside those sections, what names the run directory (the resumed run is the directory given).
FIXED_ON_RESUME = ("log.run_dir", "log.name")


def may_change_on_resume(key: str) -> bool:
    """Whether a resumed run may take a new value for ``key``; see :data:`RESUMABLE`."""
    return key not in FIXED_ON_RESUME and any(fnmatch.fnmatchcase(key, pattern) for pattern in RESUMABLE)


class ConfigChange(NamedTuple):
    """One key a resumed run changed, with its values (as written in ``config.yaml``) before and after."""

    key: str
    old: Any
    new: Any


def _flat(cfg: Config) -> dict[str, Any]:
    return {f"{s}.{k}": v for s, section in cfg.model_dump(mode="json").items() for k, v in section.items()}


def resume_config(run_dir: str | Path, overrides: list[str] | tuple[str, ...] = (),
                  path: str | Path | None = None) -> tuple[Config, list[ConfigChange]]:
    """The config a resumed run continues with (the run's ``config.yaml``, then the values of the YAML file at
    ``path`` key by key, then the overrides), and the keys whose value changed. Raises :class:`ConfigError` if it is
    invalid or changes a key :func:`may_change_on_resume` refuses, naming them and the command that starts a new
    run from the checkpoint's weights with those values instead."""
    run_dir = Path(run_dir)
    old = load_config(run_dir / "config.yaml")
    tree = old.model_dump(mode="json")
    for section, values in (_read_yaml(path) if path is not None else {}).items():
        if isinstance(values, dict) and isinstance(tree.get(section), dict):
            tree[section].update(values)
        else:
            tree[section] = values  # not a section: validation names it
    new = _validate(_with_overrides(tree, overrides))
    before, after = _flat(old), _flat(new)
    changes = [ConfigChange(k, before[k], after[k]) for k in after if after[k] != before[k]]
    refused = [c for c in changes if not may_change_on_resume(c.key)]
    if refused:
        listed = ", ".join(f"{c.key} ({c.old!r} -> {c.new!r})" for c in refused)
        raise ConfigError(
            f"cannot change on resume: {listed}. A resumed run continues one experiment from its checkpoint; these keys "
            f"change the method, the tasks or what the saved state means (resume may change {', '.join(RESUMABLE)}, "
            f"except {', '.join(FIXED_ON_RESUME)}). To try them, start a new run from the "
            f"checkpoint's weights: {_new_run_command(run_dir, old, refused)}"
        )
    return new, changes


def _new_run_command(run_dir: Path, old: Config, refused: list[ConfigChange]) -> str:
    from turnrl.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    args = {"model.path": str(ckpt / "model")} if ckpt is not None else {}
    args |= {c.key: c.new for c in refused}
    if old.log.name and "log.name" not in args:  # a new directory beside the run, not the run's own
        args["log.name"] = f"{old.log.name}-2"
    shown = (f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in args.items())
    return f"turnrl train -c {run_dir / 'config.yaml'} " + " ".join(shlex.quote(a) for a in shown)


def record_changes(run_dir: str | Path, cfg: Config, changes: list[ConfigChange], step: int) -> None:
    """Record a resumed run's changes: one ``RUN/config_changes.jsonl`` line each (``step``: the checkpoint step
    they apply from, ``key``, ``old``, ``new``), and ``RUN/config.yaml`` rewritten to ``cfg``. No changes: nothing."""
    if not changes:
        return
    run_dir = Path(run_dir)
    with open(run_dir / "config_changes.jsonl", "a") as f:
        for c in changes:
            f.write(json.dumps({"step": step, "key": c.key, "old": c.old, "new": c.new}) + "\n")
    write_config(cfg, run_dir / "config.yaml")
