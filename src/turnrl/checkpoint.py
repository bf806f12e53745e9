"""Save and resume everything needed to continue a run exactly.

A checkpoint is a directory ``RUN/checkpoints/step_NNNNNN`` holding:

- ``model/``: the policy as a Hugging Face directory (``save_pretrained`` + tokenizer), loadable on its
  own by ``turnrl eval model.path=...``;
- ``state.pt``: step, optimizer and LR-scheduler state, the engine's sampling RNG and weight version,
  the torch / Python / NumPy RNG states. The data cursor is the step itself (task seeds are a pure
  function of the step), so nothing else is needed to resume bit-identically on the same machine.

Writes go to a temporary directory renamed into place, and ``RUN/checkpoints/latest`` is updated last:
a crash mid-save leaves the previous checkpoint intact and pointed to.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict[str, Any], keep: int = 2) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp / "model", safe_serialization=True)
    tokenizer.save_pretrained(tmp / "model")
    torch.save({"step": step, **state, "rng": rng_state()}, tmp / "state.pt")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    (root / "latest.tmp").write_text(final.name)
    (root / "latest.tmp").rename(root / "latest")
    older = sorted(p for p in root.glob("step_*") if p != final)
    for old in older[: max(0, len(older) - (keep - 1))]:  # keep `keep` checkpoints, this one included
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if path.exists() else None


def load_state(ckpt: Path) -> dict[str, Any]:
    return torch.load(Path(ckpt) / "state.pt", weights_only=False)
