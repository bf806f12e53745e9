"""`turnrl watch`: waits for a run that has logged nothing, counts steps right, stops when the run has ended, and
prints plain text when its output is not a terminal."""

import json
import os
import socket
import subprocess

import pytest

from turnrl.cli import main
from turnrl.monitor import watch as W


def _run_dir(tmp_path, steps=5):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"train:\n  steps: {steps}\n")
    return run


def _status(run, state, pid=None):
    (run / "status.json").write_text(json.dumps({"state": state, "step": 0, "steps": 5, "message": "",
                                                 "pid": pid or os.getpid(), "host": socket.gethostname()}))


def _metrics(run, *rows):
    with (run / "metrics.jsonl").open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def _scripted_sleeps(monkeypatch, *actions):
    """Replace the watcher's sleep: each sleep runs the next action (the training process writing); past the script
    it interrupts, as Ctrl-C would, so a watcher that never stops cannot hang the test."""
    it = iter(actions)
    calls = []

    def sleep(_):
        calls.append(1)
        action = next(it, None)
        if action is None:
            raise KeyboardInterrupt
        action()

    monkeypatch.setattr(W.time, "sleep", sleep)
    return calls


def test_it_waits_while_the_run_has_logged_nothing_then_follows_it_to_the_end(tmp_path, monkeypatch):
    run = _run_dir(tmp_path)
    _status(run, "running")  # the step-0 evaluation is in progress: no metrics.jsonl yet
    views = []
    _scripted_sleeps(monkeypatch,
                     lambda: _metrics(run, {"step": 0, "eval/success_rate": 0.25}),
                     lambda: _metrics(run, {"step": 1, "rollout/success_rate": 0.5}),
                     lambda: _status(run, "finished"))
    W.watch(run, interval=0, out=views.append, terminal=False)
    assert "nothing logged yet" in views[0] and "step 0 of 5" in views[0]
    assert "step 1 of 5" in views[2] and "run finished" in views[-1] and len(views) == 4


def test_steps_are_counted_from_the_steps_logged_without_a_step_zero_row(tmp_path):
    run = _run_dir(tmp_path, steps=40)
    _metrics(run, {"step": 1, "rollout/success_rate": 0.5}, {"step": 2, "rollout/success_rate": 0.5})
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "rollout/succ')  # the writer mid-line
    assert render_first_line(run) == f"run {run}  step 2 of 40"


def render_first_line(run):
    return W.render(run).splitlines()[0]


@pytest.mark.parametrize("state", ["finished", "stopped", "failed", "killed"])
def test_it_stops_once_the_run_has_ended(tmp_path, monkeypatch, state):
    run = _run_dir(tmp_path)
    _metrics(run, {"step": 1, "rollout/success_rate": 0.5})
    if state == "killed":  # status says running, but its process is gone
        gone = subprocess.Popen(["true"])
        gone.wait()
        _status(run, "running", pid=gone.pid)
    else:
        _status(run, state)
    calls = _scripted_sleeps(monkeypatch)
    views = []
    W.watch(run, interval=0, out=views.append, terminal=True)
    assert calls == [] and len(views) == 1 and f"run {state}" in views[0]


def test_piped_output_is_plain_text_and_a_terminal_is_redrawn(tmp_path, monkeypatch, capsys):
    run = _run_dir(tmp_path)
    _metrics(run, {"step": 1, "rollout/success_rate": 0.5})
    _status(run, "running")
    _scripted_sleeps(monkeypatch, lambda: _metrics(run, {"step": 2}), lambda: _status(run, "finished"))
    assert main(["watch", str(run), "--interval", "0"]) == 0  # pytest's stdout is not a terminal
    out = capsys.readouterr().out
    assert "\x1b" not in out and "step 1 of 5" in out and "step 2 of 5" in out
    views = []
    W.watch(run, once=False, out=views.append, terminal=True)
    assert views[0].startswith("\x1b[2J\x1b[H")


def test_a_directory_that_is_not_there_is_an_error(tmp_path, capsys):
    assert main(["watch", str(tmp_path / "nothing")]) == 2
    assert "not a run directory" in capsys.readouterr().err
