"""What a run prints: where it is before step 1, a progress bar and messages while it trains, a summary at the end."""

from __future__ import annotations

import sys
from pathlib import Path


class Progress:
    """A tqdm bar showing step, success rate, reward and the held-out score (messages go to stderr when off)."""

    def __init__(self, enabled: bool, total: int, start: int) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)

    def update(self, m: dict[str, float]) -> None:
        if self.bar is None:
            return
        post = {"succ": f"{m.get('rollout/success_rate', 0):.2f}", "rew": f"{m.get('rollout/reward', 0):.2f}",
                "valid": f"{m.get('rollout/valid_action_rate', 0):.2f}"}
        if "eval/success_rate" in m:
            post["eval"] = f"{m['eval/success_rate']:.2f}"
        self.bar.set_postfix(post)
        self.bar.update(1)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def header(run_dir: Path, facts: dict[str, str], resumed_at: int | None) -> str:
    """The lines printed before step 1: where the run writes, what it is made of, how to watch it."""
    rows = {"run": str(run_dir), **facts, "watch": f"turnrl watch {run_dir}",
            "report": f"{run_dir / 'report.html'} when training ends or stops (`turnrl report {run_dir}` rewrites it)"}
    width = max(len(k) for k in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows.items()]
    if resumed_at is not None:
        lines.insert(1, f"{'resumed':<{width}}  from the step-{resumed_at} checkpoint")
    return "\n".join(lines)


def held_out_line(first: dict[str, float] | None, last: dict[str, float] | None) -> str:
    """Held-out success at the first and last evaluation, with 95% intervals and the number of distinct tasks."""
    if first is None or last is None:
        return "held-out success: no evaluation ran"

    def one(m: dict[str, float]) -> str:
        return (f"{m['eval/success_rate']:.3f} (95% CI {m.get('eval/success_ci_low', 0):.3f}-"
                f"{m.get('eval/success_ci_high', 1):.3f}) at step {int(m['step'])}")

    tasks = last.get("eval/distinct_tasks", last.get("eval/num_tasks"))
    over = f" over {int(tasks)} distinct held-out tasks" if tasks is not None else ""
    if first["step"] == last["step"]:
        return f"held-out success: {one(last)}{over}"
    return f"held-out success: {one(first)} -> {one(last)}{over}"


def duration(seconds: float) -> str:
    """``"1h02m03s"``, ``"4m05s"`` or ``"12.3s"``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"
