"""`turnrl watch RUN`: a live terminal view of a run directory (works while training writes to it).

It waits while the run has logged nothing yet (the evaluation before step 1 comes first), counts the steps the
run has logged, and stops once the run has ended (``RUN/status.json``; a run whose process is gone from this
machine counts as ended). On a terminal it redraws in place; piped, it prints each changed view as plain text.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from turnrl.monitor.files import read_jsonl, run_ended
from turnrl.monitor.sinks import read_metrics

_CLEAR = "\x1b[2J\x1b[H"  # clear the screen, cursor home
_COLUMNS = [
    ("step", "step", "{:>5.0f}"),
    ("succ", "rollout/success_rate", "{:>5.2f}"),
    ("reward", "rollout/reward", "{:>7.3f}"),
    ("valid", "rollout/valid_action_rate", "{:>5.2f}"),
    ("turns", "rollout/turns", "{:>5.1f}"),
    ("entropy", "train/entropy", "{:>7.3f}"),
    ("gradnorm", "train/grad_norm", "{:>8.3f}"),
    ("step_s", None, "{:>6.1f}"),
    ("eval", "eval/success_rate", "{:>5.2f}"),
]


def render(run_dir: Path, last: int = 12) -> str:
    """The view as text: progress, the last ``last`` steps, the evaluation history, any alerts, and how the run ended."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a run directory; pass the directory `turnrl train` printed")
    rows = read_metrics(run_dir / "metrics.jsonl")
    done = max((r["step"] for r in rows if isinstance(r.get("step"), int)), default=0)
    total = _total_steps(run_dir)
    lines = [f"run {run_dir}  step {done}" + (f" of {total}" if total is not None else ""), ""]
    if not rows:
        lines.append("nothing logged yet: the run is starting (the evaluation before step 1 comes first)")
    else:
        lines.append("  ".join(f"{name:>{len(fmt.format(0))}}" for name, _, fmt in _COLUMNS))
        lines += [_row(r) for r in rows[-last:]]
    evals = [(r["step"], r["eval/success_rate"]) for r in rows if isinstance(r.get("eval/success_rate"), (int, float))]
    if evals:
        lines += ["", "held-out success: " + ", ".join(f"step {s}: {v:.2f}" for s, v in evals)]
    alerts = read_jsonl(run_dir / "alerts.jsonl")
    if alerts:
        lines += ["", f"ALERTS ({len(alerts)}):"] + [f"  step {a.get('step')} [{a.get('name')}] {a.get('message')}" for a in alerts[-5:]]
    ended = run_ended(run_dir)
    if ended:
        lines += ["", f"run {ended}"]
    return "\n".join(lines)


def _row(r: dict) -> str:
    cells = []
    for _, key, fmt in _COLUMNS:
        if key is None:
            value = r.get("perf/rollout_s", 0.0) + r.get("perf/train_s", 0.0) if "perf/train_s" in r else None
        else:
            value = r.get(key)
        width = len(fmt.format(0))
        cells.append(fmt.format(value) if isinstance(value, (int, float)) else f"{'-':>{width}}")
    return "  ".join(cells)


def _total_steps(run_dir: Path) -> int | None:
    """``train.steps`` from the run's ``config.yaml`` (None when it cannot be read)."""
    try:
        steps = yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["steps"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return steps if isinstance(steps, int) else None


def watch(run_dir: Path, once: bool = False, interval: float = 2.0, out: Callable[[str], None] = print,
          terminal: bool | None = None) -> None:
    """Print the view; unless ``once``, print it again whenever it changes, until the run ends or Ctrl-C.

    ``terminal`` (default: whether stdout is one) redraws in place; otherwise each view is printed plainly, once.
    """
    terminal = sys.stdout.isatty() if terminal is None else terminal
    shown = None
    while True:
        ended = run_ended(run_dir) is not None
        text = render(run_dir)
        if once:
            out(text)
            return
        if text != shown:
            out(_CLEAR + text if terminal else text + "\n")
            shown = text
        if ended:
            return
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return
