"""Resume after a crash, a kill or a signal: the logs are cut back to the checkpoint, the detectors continue where
they were, damaged checkpoints fall back to older ones, and SIGTERM / Ctrl-C stop cleanly (real processes, real
signals)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_train import TINY, Parity
from turnrl.build import build
from turnrl.config import load_config
from turnrl.envs import register, registered
from turnrl.monitor.detectors import Alert, Detector
from turnrl.monitor.files import read_jsonl, read_status
from turnrl.loop import train

ROOT = Path(__file__).resolve().parents[1]


class SlowParity(Parity):
    """Parity whose steps take ``delay`` seconds, so a signal lands while a step is in flight."""

    def __init__(self, delay: float = 0.2):
        self.delay = delay

    def step(self, action_text):
        time.sleep(self.delay)
        return super().step(action_text)


if "slow-parity-v0" not in registered():
    register("slow-parity-v0", SlowParity, description="test env with slow steps")


class FiresOnThirdUpdate(Detector):
    """Fires once, on the third step it sees: an uninterrupted run alerts at step 3, a resumed one only if its count
    was checkpointed."""

    name = "grad_spike"

    def __init__(self):
        self.seen = 0

    def update(self, step, metrics):
        self.seen += 1
        return Alert(self.name, step, "third step", {}) if self.seen == 3 else None


def _cfg(tmp_path, name, overrides):
    return load_config(None, TINY + [f"log.run_dir={tmp_path}", f"log.name={name}", "log.sample_trajectories=2"] + overrides)


def _train(tmp_path, tokenizer, name, overrides, resume=False):
    from turnrl.models import tiny_model

    cfg = _cfg(tmp_path, name, overrides)
    c = build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer)
    return train(cfg, resume=(tmp_path / name) if resume else None, components=c)


def _steps(run, log="metrics.jsonl"):
    return [r["step"] for r in read_jsonl(run / log)]


def _without_perf(rows):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


COMMON = ["train.steps=4", "log.checkpoint_every=2", "log.keep_checkpoints=5", "eval.every=2", "eval.at_start=true"]


def test_a_resumed_run_cuts_the_logs_back_and_continues_like_an_uninterrupted_one(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr("turnrl.monitor.monitor.default_detectors", lambda: [FiresOnThirdUpdate()])
    full = _train(tmp_path, tokenizer, "full", COMMON)
    # the killed run: it logged steps 1-4 (and tore a line) but died before its step-4 checkpoint
    split = _train(tmp_path, tokenizer, "split", COMMON)
    for p in (split / "checkpoints" / "step_000004").rglob("*"):
        p.unlink() if p.is_file() else None
    (split / "checkpoints" / "latest").write_text("step_000002")
    for log in ("metrics.jsonl", "trajectories.jsonl", "alerts.jsonl", "task_keys.jsonl"):
        with (split / log).open("a") as f:
            f.write('{"step": 5, "torn')
    _train(tmp_path, tokenizer, "split", COMMON, resume=True)

    assert _steps(split) == _steps(full) == [0, 1, 2, 3, 4]
    assert _steps(split, "trajectories.jsonl") == _steps(full, "trajectories.jsonl") == [1, 1, 2, 2, 3, 3, 4, 4]
    assert _without_perf(read_jsonl(split / "metrics.jsonl")) == _without_perf(read_jsonl(full / "metrics.jsonl"))
    assert read_jsonl(split / "alerts.jsonl") == read_jsonl(full / "alerts.jsonl") and _steps(full, "alerts.jsonl") == [3]
    assert read_jsonl(split / "task_keys.jsonl") == read_jsonl(full / "task_keys.jsonl")
    assert read_status(split)["state"] == "finished"


def _damage_state(ckpt):
    (ckpt / "state.pt").write_bytes((ckpt / "state.pt").read_bytes()[:500])


def _damage_weights(ckpt):
    path = ckpt / "model" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:2000])


def _drop_tensors(ckpt):
    from safetensors.torch import load_file, save_file

    path = ckpt / "model" / "model.safetensors"
    tensors = load_file(path)
    first = sorted(tensors)[0]
    save_file({first: tensors[first]}, path)  # 1 tensor of many, as the probe did


@pytest.mark.parametrize("damage, file", [(_damage_state, "state.pt"), (_damage_weights, "model.safetensors"),
                                          (_drop_tensors, "tensors missing")])
@pytest.mark.probe("bad_input")
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, tokenizer, capfd, damage, file):
    overrides = ["log.checkpoint_every=1", "log.keep_checkpoints=2", "eval.every=0", "eval.at_start=false"]
    run = _train(tmp_path, tokenizer, "r", overrides + ["train.steps=2"])
    damage(run / "checkpoints" / "step_000002")
    (run / "checkpoints" / "latest").write_text("garbage\x00")
    capfd.readouterr()
    _train(tmp_path, tokenizer, "r", overrides + ["train.steps=3"], resume=True)
    err = capfd.readouterr().err
    assert "checkpoints/latest: names" in err
    line = next(x for x in err.splitlines() if "step_000002" in x and "set aside" in x)
    assert file in line
    assert _steps(run) == [1, 2, 3] and (run / "checkpoints" / "step_000002.bad").is_dir()
    assert "resumed" in err and "from the step-1 checkpoint" in err


@pytest.mark.probe("bad_input")
def test_a_run_whose_only_checkpoint_is_damaged_stops_with_one_line_and_keeps_it(tmp_path, tokenizer):
    from turnrl.checkpoint import CheckpointError

    overrides = ["log.checkpoint_every=1", "log.keep_checkpoints=1", "eval.every=0", "eval.at_start=false"]
    run = _train(tmp_path, tokenizer, "r", overrides + ["train.steps=1"])
    _drop_tensors(run / "checkpoints" / "step_000001")
    with pytest.raises(CheckpointError, match=r"step_000001/model/model\.safetensors: \d+ tensors missing") as e:
        _train(tmp_path, tokenizer, "r", overrides + ["train.steps=2"], resume=True)
    assert "\n" not in str(e.value) and (run / "checkpoints" / "step_000001").is_dir() and _steps(run) == [1]


@pytest.mark.probe("fault")
def test_a_kill_during_the_first_checkpoint_can_be_resumed_or_restarted(tmp_path, tokenizer):
    overrides = ["train.steps=2", "log.checkpoint_every=0", "log.checkpoint_at_end=false", "eval.every=0"]
    run = _train(tmp_path, tokenizer, "r", overrides)
    (run / "checkpoints" / ".tmp_step_000002" / "model").mkdir(parents=True)  # the kill, mid-save
    again = _train(tmp_path, tokenizer, "r", overrides)  # restart: a new run in the same directory
    assert _steps(again) == [0, 1, 2] and not (run / "checkpoints" / ".tmp_step_000002").exists()
    (run / "checkpoints" / ".tmp_step_000002" / "model").mkdir(parents=True)
    _train(tmp_path, tokenizer, "r", overrides, resume=True)  # resume: nothing to resume from, so it starts over
    assert _steps(run) == [0, 1, 2] and len(read_jsonl(run / "trajectories.jsonl")) == 4


# ---- real processes, real signals ---------------------------------------------------------------------------

_CHILD = """
import sys
sys.path.insert(0, {root!r})
from tests.test_resume import child_main
child_main({run_root!r}, {name!r}, {steps}, {delay})
"""


def child_main(run_root, name, steps, delay):
    """What the child process runs: a slow tiny run (checkpoint every step) in ``run_root/name``."""
    from turnrl.models import load_tokenizer, tiny_model

    tokenizer = load_tokenizer("default")
    cfg = load_config(None, TINY + [f"log.run_dir={run_root}", f"log.name={name}", "env.id=slow-parity-v0",
                                    f"env.kwargs.delay={delay}", f"train.steps={steps}", "log.checkpoint_every=1", "eval.every=0",
                                    "eval.at_start=false"])
    train(cfg, components=build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer))


def _start(tmp_path, name, steps=60, delay=0.2):
    code = _CHILD.format(root=str(ROOT), run_root=str(tmp_path), name=name, steps=steps, delay=delay)
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_step(proc, run, step, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the child exited early: {proc.communicate()[1][-2000:]}")
        if any(s >= step for s in _steps(run)):
            return
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the child never reached the step")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.probe("fault")
def test_a_signal_finishes_the_step_checkpoints_writes_the_report_and_says_how_to_resume(tmp_path, tokenizer, sig):
    run = tmp_path / "sig"
    proc = _start(tmp_path, "sig")
    _wait_for_step(proc, run, 1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    status = read_status(run)
    last = _steps(run)[-1]
    assert status["state"] == "stopped" and sig.name in status["message"] and status["step"] == last
    assert (run / "checkpoints" / "latest").read_text() == f"step_{last:06d}"
    assert (run / "report.html").exists() and f"turnrl train --resume {run}" in err
    assert _steps(run) == list(range(1, last + 1))


@pytest.mark.probe("fault")
def test_a_second_signal_aborts_at_once_leaving_the_last_checkpoint(tmp_path):
    run = tmp_path / "abort"
    proc = _start(tmp_path, "abort", delay=2.0)  # a step takes seconds: both signals land inside one
    _wait_for_step(proc, run, 2)
    while not (run / "checkpoints" / "step_000002").exists():  # step 2 is saved, so step 3 is in flight
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 15 and proc.returncode != 0
    assert read_status(run)["state"] == "aborted"
    from turnrl.checkpoint import latest_checkpoint, load_state

    assert 1 <= load_state(latest_checkpoint(run))["step"] <= _steps(run)[-1]  # intact, maybe a step behind the logs


@pytest.mark.probe("fault")
def test_a_run_killed_with_sigkill_resumes_without_duplicate_rows(tmp_path, tokenizer, capsys):
    run = tmp_path / "killed"
    proc = _start(tmp_path, "killed")
    _wait_for_step(proc, run, 3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    from turnrl.monitor.files import run_ended
    from turnrl.monitor.watch import render

    assert "killed" in run_ended(run) and "step" in render(run)
    cfg = load_config(None, TINY + [f"log.run_dir={tmp_path}", "log.name=killed", "env.id=slow-parity-v0", "train.steps=6",
                                    "log.checkpoint_every=1", "eval.every=0", "eval.at_start=false"])
    from turnrl.models import tiny_model

    train(cfg, resume=run, components=build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer))
    assert _steps(run) == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in read_jsonl(run / "trajectories.jsonl")] == [s for s in range(1, 7) for _ in range(4)]
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
