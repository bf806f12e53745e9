"""Save and resume everything needed to continue a run exactly; load only plain data.

A checkpoint is a directory ``RUN/checkpoints/step_NNNNNN`` holding:

- ``model/``: the policy as a Hugging Face directory (``save_pretrained`` + tokenizer), loadable on its
  own by ``turnrl eval model.path=...``; on a LoRA run only the adapter, in peft's layout
  (``adapter_config.json`` naming the base model, ``adapter_model.safetensors``), which ``model.path=`` also takes;
  with per-role policies (``multiagent.policies=per_role``) the first role's, and ``roles/<role>/`` each other role's
  (:func:`model_dirs`);
- ``state.pt``: step, optimizer and LR-scheduler state, the engine's sampling RNG and weight version, the
  monitor's detector windows and rollback counter, the torch / Python / NumPy RNG states. The data cursor is
  the step itself (task seeds are a pure function of the step), so nothing else is needed to resume
  bit-identically on the same machine.

Safety: ``state.pt`` holds only tensors and plain data and is read with ``torch.load(weights_only=True)``, so a
run directory from elsewhere cannot run code when resumed (a ``state.pt`` that needs anything else is refused).
Weights are never checkpointed when any is NaN or infinite.

Atomicity: writes go to ``.tmp_step_NNNNNN`` renamed into place, and ``RUN/checkpoints/latest`` (a pointer for
people and tools) is written last. Only a complete directory (``state.pt`` and ``model/model.safetensors``, or
``model/adapter_model.safetensors`` on a LoRA run) counts as a checkpoint; a crash mid-save leaves the previous one
intact and a ``.tmp_*`` leftover that :func:`discard_partial` removes. A damaged checkpoint raises
:class:`CheckpointError`, one line naming the file and what is wrong, and :func:`set_aside` renames it so an older
one can be used.
"""

from __future__ import annotations

import pickle
import random
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from turnrl.models import lora

STATE = "state.pt"
WEIGHTS = Path("model") / "model.safetensors"
ADAPTER = Path("model") / lora.ADAPTER_WEIGHTS  # a LoRA run's weights: the adapter only
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(Exception):
    """A checkpoint cannot be written or read; the message names the file and what is wrong."""


# ---------------------------------------------------------------------------------------------- RNG state


def rng_state() -> dict[str, Any]:
    """The torch, Python and NumPy global RNG states, as tensors and plain data (``weights_only``-loadable)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    numpy = {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
             "cached_gaussian": float(cached)}
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))


# ---------------------------------------------------------------------------------------------- writing


def non_finite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters holding a NaN or an infinity (empty when every weight is finite)."""
    return [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``step_NNNNNN`` atomically, point ``latest`` at it, and keep the newest ``keep`` checkpoints.

    Raises :class:`CheckpointError` (writing nothing) when a weight is not finite.
    """
    root = Path(run_dir) / "checkpoints"
    bad = non_finite_parameters(model)
    if bad:
        raise CheckpointError(f"refusing to checkpoint step {step}: non-finite weights in {_names(bad)}")
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    for directory, module in model_dirs(model):
        if lora.is_lora(module):
            lora.save_adapter(module, tmp / directory)
        else:
            module.save_pretrained(tmp / directory, safe_serialization=True)
        tokenizer.save_pretrained(tmp / directory)
    torch.save({"step": step, **state, "rng": rng_state()}, tmp / STATE)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    (root / "latest.tmp").write_text(final.name)
    (root / "latest.tmp").rename(root / "latest")
    for old in checkpoints(run_dir)[keep:]:  # newest first: keep `keep`, this one included
        shutil.rmtree(old, ignore_errors=True)
    return final


def discard_partial(run_dir: Path) -> None:
    """Remove what a crash mid-save left behind (``.tmp_step_*``, ``latest.tmp``); complete checkpoints stay."""
    root = Path(run_dir) / "checkpoints"
    for tmp in root.glob(".tmp_step_*"):
        shutil.rmtree(tmp, ignore_errors=True)
    (root / "latest.tmp").unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- finding


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints (``state.pt`` and the weights present), newest step first."""
    root = Path(run_dir) / "checkpoints"
    found = [(int(m.group(1)), p) for p in root.glob("step_*") if (m := _STEP_DIR.match(p.name)) and _complete(p)]
    return [p for _, p in sorted(found, reverse=True)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = checkpoints(run_dir)
    return found[0] if found else None


def pointer_problem(run_dir: Path) -> str | None:
    """What is wrong with ``checkpoints/latest`` (unreadable, or naming no complete checkpoint), or None.

    Resuming does not depend on it (it takes the newest complete checkpoint); a bad pointer is only reported.
    """
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    try:
        name = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        return f"{pointer}: unreadable ({type(e).__name__})"
    if not _STEP_DIR.match(name) or not _complete(pointer.parent / name):
        return f"{pointer}: names {name[:60]!r}, which is not a complete checkpoint"
    return None


def set_aside(ckpt: Path) -> Path:
    """Rename a damaged checkpoint to ``step_NNNNNN.bad`` (kept for inspection, never resumed from)."""
    target = ckpt.with_name(ckpt.name + ".bad")
    n = 1
    while target.exists():
        n += 1
        target = ckpt.with_name(f"{ckpt.name}.bad{n}")
    ckpt.rename(target)
    return target


# ---------------------------------------------------------------------------------------------- reading


def load_state(ckpt: Path) -> dict[str, Any]:
    """``state.pt`` read as plain data only (``weights_only=True``); :class:`CheckpointError` when it is damaged or unsafe."""
    path = Path(ckpt) / STATE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path}: not a torch checkpoint (truncated or overwritten)")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path}: holds objects other than tensors and plain data ({_unpickler_reason(e)}); "
                              "refused, since loading it could run code") from None
    except Exception as e:  # noqa: BLE001 - torch reports damage with several exception types
        raise CheckpointError(f"{path}: unreadable ({type(e).__name__}: {_first_line(e)})") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"{path}: not a turnrl checkpoint state (no integer 'step')")
    return state


def model_dirs(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Where a checkpoint keeps ``model``: ``[("model", model)]``; for per-role policies (a ``ModuleDict`` by role,
    ``multiagent.policies=per_role``) the first role's in ``model/`` (so ``model.path=`` and ``turnrl serve`` take it
    like any other) and every other role's in ``roles/<role>/``, each a model directory of its own."""
    if not isinstance(model, torch.nn.ModuleDict):
        return [("model", model)]
    return [("model" if i == 0 else f"roles/{role}", module) for i, (role, module) in enumerate(model.items())]


def load_weights(ckpt: Path, model: torch.nn.Module) -> None:
    """Load ``model/model.safetensors`` into ``model`` (``model/adapter_model.safetensors`` into a LoRA model's
    adapters; per-role policies' from each of :func:`model_dirs`); every tensor must be there and nothing else.

    Raises :class:`CheckpointError` naming the file and the missing or unexpected tensors, or the damage.
    """
    for directory, module in model_dirs(model):
        _load_module_weights(Path(ckpt) / directory, module)


def _load_module_weights(directory: Path, model: torch.nn.Module) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    path = directory / (lora.ADAPTER_WEIGHTS if lora.is_lora(model) else WEIGHTS.name)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        if lora.is_lora(model):
            missing, unexpected = lora.load_adapter_weights(model, path)
        else:
            missing, unexpected = load_model(model, path, strict=False)  # tied weights are matched by safetensors
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{path}: unreadable ({_first_line(e)})") from None
    except RuntimeError as e:  # a tensor of the wrong shape
        raise CheckpointError(f"{path}: does not fit this model ({_first_line(e)})") from None
    if missing or unexpected:
        parts = [f"{len(missing)} tensors missing ({_names(sorted(missing))})"] if missing else []
        parts += [f"{len(unexpected)} unexpected ({_names(sorted(unexpected))})"] if unexpected else []
        raise CheckpointError(f"{path}: {' and '.join(parts)}; it is not a checkpoint of this model")


def _complete(path: Path) -> bool:
    return (path / STATE).is_file() and ((path / WEIGHTS).is_file() or (path / ADAPTER).is_file())


def _names(names: list[str], shown: int = 3) -> str:
    more = f", ... {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _unpickler_reason(e: BaseException) -> str:
    """The line of torch's long weights-only refusal that says what was refused (e.g. ``GLOBAL posix.system``)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    hits = [x for x in lines if "GLOBAL" in x or x.startswith("Unsupported")]
    return (hits or lines or [type(e).__name__])[0][:200]
