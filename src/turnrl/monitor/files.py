"""The run directory's own files: the JSONL logs (read tolerantly, repaired on resume), ``status.json`` (is the run
alive, how did it end) and ``task_keys.jsonl`` (the tasks it evaluated and trained on).

Light on purpose (no torch): ``turnrl watch`` reads these.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

#: Logs appended to step by step; on resume they are cut back to the checkpoint's step.
LOGS = ("metrics.jsonl", "trajectories.jsonl", "alerts.jsonl", "task_keys.jsonl")
#: What a fresh start removes besides the logs: another run's leftovers in the same directory.
_FRESH_START = ("status.json", "report.html", "wandb_run_id", "mlflow_run_id")

def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSONL log; a line that is not JSON (a torn last line: a crash, or the writer mid-line) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def append_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with Path(path).open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def cut_logs(run_dir: Path, last_step: int | None) -> None:
    """Make the logs describe the run up to ``last_step``: rows of later steps and torn lines go.

    ``last_step=None`` is a fresh start: the logs and leftovers of whatever ran here before (a run that left no
    checkpoint) are removed. Each file is rewritten through a temporary file, so a crash here loses nothing.
    """
    run_dir = Path(run_dir)
    if last_step is None:
        for name in (*LOGS, *_FRESH_START):
            (run_dir / name).unlink(missing_ok=True)
        shutil.rmtree(run_dir / "tb", ignore_errors=True)
        return
    for name in LOGS:
        path = run_dir / name
        if not path.exists():
            continue
        kept = [r for r in read_jsonl(path) if isinstance(r.get("step"), int) and r["step"] <= last_step]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        tmp.replace(path)


# ---------------------------------------------------------------------------------------------- status.json


def write_status(run_dir: Path, state: str, step: int, steps: int, message: str = "") -> None:
    """``RUN/status.json``: ``state`` is ``running``, ``finished``, ``stopped`` (resumable), ``failed`` or ``aborted``."""
    status = {"state": state, "step": step, "steps": steps, "message": message, "pid": os.getpid(),
              "host": socket.gethostname(), "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
    path = Path(run_dir) / "status.json"
    tmp = path.with_name("status.json.tmp")
    tmp.write_text(json.dumps(status) + "\n")
    tmp.replace(path)


def read_status(run_dir: Path) -> dict[str, Any] | None:
    try:
        status = json.loads((Path(run_dir) / "status.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return status if isinstance(status, dict) else None


def run_ended(run_dir: Path) -> str | None:
    """How the run in ``run_dir`` ended, or None while it runs (or when nothing says: no ``status.json``, or a run on
    another host). A ``running`` status whose process is gone from this host means the run was killed."""
    status = read_status(run_dir)
    if status is None:
        return None
    if status.get("state") != "running":
        return f"{status.get('state')}: {status.get('message') or 'the run ended'}"
    if status.get("host") == socket.gethostname() and not _alive(status.get("pid")):
        return (f"killed: the training process (pid {status.get('pid')}) is gone; "
                f"resume with `turnrl train --resume {run_dir}`")
    return None


def live_owner(run_dir: Path) -> int | None:
    """The pid of another live process on this host that is training in ``run_dir``, if any."""
    status = read_status(run_dir)
    if status is None or status.get("host") != socket.gethostname() or run_ended(run_dir) is not None:
        return None
    return status.get("pid") if status.get("pid") != os.getpid() else None


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True
