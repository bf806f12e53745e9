"""`turnrl watch RUN`: a live terminal view of a run directory (works while training writes to it)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from turnrl.monitor.sinks import read_metrics

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
    """The view as text: the last ``last`` steps, the evaluation history, and any alerts."""
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").exists():
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl yet (is it a run directory? has training started?)")
    rows = read_metrics(run_dir / "metrics.jsonl")
    lines = [f"run {run_dir}  ({len(rows) - 1 if rows else 0} steps logged)", ""]
    lines.append("  ".join(f"{name:>{len(fmt.format(0))}}" for name, _, fmt in _COLUMNS))
    for r in rows[-last:]:
        cells = []
        for _, key, fmt in _COLUMNS:
            if key is None:
                value = r.get("perf/rollout_s", 0.0) + r.get("perf/train_s", 0.0) if "perf/train_s" in r else None
            else:
                value = r.get(key)
            width = len(fmt.format(0))
            cells.append(fmt.format(value) if isinstance(value, (int, float)) else f"{'-':>{width}}")
        lines.append("  ".join(cells))
    evals = [(r["step"], r["eval/success_rate"], r.get("eval/success_ci_low"), r.get("eval/success_ci_high"))
             for r in rows if "eval/success_rate" in r]
    if evals:
        lines += ["", "held-out success: " + ", ".join(f"step {s}: {v:.2f}" for s, v, _, _ in evals)]
    alerts_path = run_dir / "alerts.jsonl"
    if alerts_path.exists():
        alerts = [json.loads(x) for x in alerts_path.read_text().splitlines() if x.strip()]
        lines += ["", f"ALERTS ({len(alerts)}):"] + [f"  step {a['step']} [{a['name']}] {a['message']}" for a in alerts[-5:]]
    return "\n".join(lines)


def watch(run_dir: Path, once: bool = False, interval: float = 2.0, out: Callable[[str], None] = print) -> None:
    """Print the view; unless ``once``, redraw it every ``interval`` seconds until interrupted."""
    while True:
        text = render(run_dir)
        if once:
            out(text)
            return
        out("\x1b[2J\x1b[H" + text)  # clear the screen, cursor home
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return
