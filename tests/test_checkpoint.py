"""Checkpoints: plain-data state loaded safely, strict weights, atomic writes, damage named in one line."""

import os
import random

import numpy as np
import pytest
import torch

from turnrl import checkpoint
from turnrl.checkpoint import CheckpointError


def _save(run_dir, model, tokenizer, step=1, state=None, keep=2):
    return checkpoint.save_checkpoint(run_dir, step, model, tokenizer, state or {"learner": {"x": torch.ones(2)}}, keep=keep)


def test_state_loads_as_plain_data_and_restores_every_rng(tmp_path, tiny_model, tokenizer):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.normal()  # leaves a cached Gaussian in NumPy's state
    ckpt = _save(tmp_path, tiny_model, tokenizer)
    expected = (random.random(), np.random.normal(), torch.rand(1).item())
    torch.load(ckpt / "state.pt", weights_only=True)  # no pickled classes, only tensors and plain data
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    checkpoint.set_rng_state(checkpoint.load_state(ckpt)["rng"])
    assert (random.random(), np.random.normal(), torch.rand(1).item()) == expected


class _Payload:
    """Unpickling this runs ``os.system``: what a malicious ``state.pt`` would carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.probe("bad_input")
def test_a_malicious_state_pt_is_refused_and_runs_nothing(tmp_path, tiny_model, tokenizer):
    ckpt = _save(tmp_path, tiny_model, tokenizer)
    marker = tmp_path / "pwned"
    torch.save({"step": 1, "learner": _Payload(marker)}, ckpt / "state.pt")
    with pytest.raises(CheckpointError, match=r"state\.pt: holds objects other than tensors.*posix\.system"):
        checkpoint.load_state(ckpt)
    assert not marker.exists()
    torch.load(ckpt / "state.pt", weights_only=False)  # the payload is real: an unsafe load runs it
    assert marker.exists()


@pytest.mark.probe("bad_input")
def test_missing_or_unexpected_tensors_are_an_error_naming_them(tmp_path, tiny_model, tokenizer):
    from safetensors.torch import load_file, save_file

    ckpt = _save(tmp_path, tiny_model, tokenizer)
    path = ckpt / "model" / "model.safetensors"
    tensors = load_file(path)
    dropped = next(k for k in sorted(tensors) if ".layers.1." in k)  # not a tied tensor
    del tensors[dropped]
    tensors["extra.weight"] = torch.zeros(2)
    save_file(tensors, path)
    with pytest.raises(CheckpointError) as e:
        checkpoint.load_weights(ckpt, tiny_model)
    msg = str(e.value)
    assert "model.safetensors" in msg and dropped in msg and "extra.weight" in msg and "\n" not in msg


def test_complete_weights_load_strictly_with_tied_embeddings(tmp_path, tiny_model, tokenizer):
    ckpt = _save(tmp_path, tiny_model, tokenizer)
    from turnrl.models import tiny_model as make_tiny

    other = make_tiny(tokenizer, seed=1)
    checkpoint.load_weights(ckpt, other)
    assert all(torch.equal(a, b) for a, b in zip(tiny_model.state_dict().values(), other.state_dict().values()))


@pytest.mark.parametrize("damage, what", [
    (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "not a torch checkpoint"),
    (lambda p: p.write_bytes(b"garbage" * 100), "not a torch checkpoint"),
    (lambda p: p.unlink(), "missing"),
])
@pytest.mark.probe("bad_input")
def test_a_damaged_state_pt_is_one_line_naming_it(tmp_path, tiny_model, tokenizer, damage, what):
    ckpt = _save(tmp_path, tiny_model, tokenizer)
    damage(ckpt / "state.pt")
    with pytest.raises(CheckpointError, match=what) as e:
        checkpoint.load_state(ckpt)
    assert str(ckpt / "state.pt") in str(e.value) and "\n" not in str(e.value)


@pytest.mark.probe("bad_input")
def test_truncated_weights_are_one_line_naming_them(tmp_path, tiny_model, tokenizer):
    ckpt = _save(tmp_path, tiny_model, tokenizer)
    path = ckpt / "model" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="unreadable") as e:
        checkpoint.load_weights(ckpt, tiny_model)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.probe("bad_input")
def test_only_complete_checkpoints_count_and_a_bad_pointer_is_reported(tmp_path, tiny_model, tokenizer):
    _save(tmp_path, tiny_model, tokenizer, step=1)
    _save(tmp_path, tiny_model, tokenizer, step=2)
    root = tmp_path / "checkpoints"
    (root / ".tmp_step_000003" / "model").mkdir(parents=True)  # a kill mid-save
    (root / "step_000004").mkdir()  # a directory without its files
    assert [p.name for p in checkpoint.checkpoints(tmp_path)] == ["step_000002", "step_000001"]
    assert checkpoint.pointer_problem(tmp_path) is None
    (root / "latest").write_bytes(b"\x00\xffjunk")
    assert "latest" in checkpoint.pointer_problem(tmp_path)
    assert checkpoint.latest_checkpoint(tmp_path).name == "step_000002"
    checkpoint.discard_partial(tmp_path)
    assert not (root / ".tmp_step_000003").exists()


@pytest.mark.probe("fault")
def test_a_kill_during_the_first_checkpoint_leaves_no_checkpoint(tmp_path):
    (tmp_path / "checkpoints" / ".tmp_step_000001" / "model").mkdir(parents=True)
    assert checkpoint.latest_checkpoint(tmp_path) is None and checkpoint.checkpoints(tmp_path) == []


@pytest.mark.probe("fault")
def test_non_finite_weights_are_never_checkpointed(tmp_path, tiny_model, tokenizer):
    with torch.no_grad():
        next(tiny_model.parameters())[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match="non-finite weights"):
        _save(tmp_path, tiny_model, tokenizer)
    assert checkpoint.checkpoints(tmp_path) == [] and not (tmp_path / "checkpoints" / "latest").exists()


def test_keep_retains_the_newest_and_set_aside_renames(tmp_path, tiny_model, tokenizer):
    for step in (1, 2, 3):
        _save(tmp_path, tiny_model, tokenizer, step=step, keep=2)
    assert [p.name for p in checkpoint.checkpoints(tmp_path)] == ["step_000003", "step_000002"]
    moved = checkpoint.set_aside(checkpoint.latest_checkpoint(tmp_path))
    assert moved.name == "step_000003.bad" and checkpoint.latest_checkpoint(tmp_path).name == "step_000002"
