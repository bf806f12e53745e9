"""`turnrl report`: the trajectory records it reads, and the page itself driven in headless chromium.

The browser is Debian's ``chromium`` (``./dev test`` installs it when missing and run as root), driven over the
Chrome DevTools Protocol with ``websockets``: no page is ever fetched from the network, and every console error or
uncaught exception the page raises is collected and asserted empty.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from turnrl.cli import main
from turnrl.config import load_config
from turnrl.envs import Env, register, registered
from turnrl.monitor.report import display_token, load_report_data, write_report
from turnrl.build import build
from turnrl.loop import train

HOSTILE = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


class Hostile(Env):
    """Observations carry markup that would run if the report inserted them as HTML; pays 1 for even-length
    responses so a tiny random model gets varied rewards and non-zero advantages."""

    instructions = "Answer."

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return f"{HOSTILE} task {seed}", {}

    def step(self, action_text):
        self.t += 1
        r = float(len(action_text) % 2 == 0)
        done = self.t >= 2
        return f"{HOSTILE} turn {self.t} of task", r, done, False, {"actions": [action_text], "valid": r > 0,
                                                                   "success": done and r > 0, "reward_components": {"outcome": r}}

    def anchor(self):
        return str(self.t)


if "hostile-v0" not in registered():
    register("hostile-v0", Hostile, description="test env with markup in its observations")

TINY = [
    "train.steps=2", "rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4", "eval.num_tasks=2",
    "eval.every=1", "log.progress=false", "log.tensorboard=false", "train.lr=1e-3", "train.micro_batch_tokens=256",
    "model.autocast_bf16=false", "env.id=hostile-v0", "env.progress_reward=0", "log.sample_trajectories=4",
    "log.checkpoint_every=0",
]


def _run(root: Path, tokenizer, name: str, overrides: list[str]) -> Path:
    from turnrl.models import tiny_model

    cfg = load_config(None, TINY + [f"log.run_dir={root}", f"log.name={name}"] + overrides)
    return train(cfg, components=build(cfg, model=tiny_model(tokenizer, seed=0), tokenizer=tokenizer))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer) -> Path:
    """A real two-step run of the tiny model, plus one alert (whose message is markup too)."""
    run = _run(tmp_path_factory.mktemp("runs"), tokenizer, "hostile", [])
    with (run / "alerts.jsonl").open("a") as f:
        f.write(json.dumps({"step": 1, "name": "grad_spike", "message": "<b>spike</b> " + HOSTILE,
                            "evidence": {"train/grad_norm": 99.0}}) + "\n")
    return run


def _trajectories(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]


# ---- what train.write_trajectories records ------------------------------------------------------------------

def test_each_turn_records_token_advantages_and_a_loss_mask_consistent_with_its_reason(run_dir):
    rows = _trajectories(run_dir)
    assert {r["step"] for r in rows} == {1, 2} and all(len([r for r in rows if r["step"] == s]) == 4 for s in (1, 2))
    trained = 0
    for r in rows:
        for t in r["turns"]:
            n = len(t["response_ids"])
            assert len(t["response_tokens"]) == len(t["logprobs"]) == len(t["token_advantages"]) == len(t["loss_mask"]) == n
            assert t["token_advantages"] == [t["advantage"]] * n
            assert t["loss_mask"] == [int(t["masked_by"] is None)] * n
            assert "entropies" not in t  # no built-in engine records per-token entropies yet
            if t["advantage"] != 0.0:  # default config: every turn with a signal is trained
                assert t["masked_by"] is None
                trained += 1
            else:
                assert t["masked_by"] == "zero_advantage"  # skipped by algo.skip_zero_advantage
    assert trained > 0


def test_overlong_turns_are_recorded_as_masked(tmp_path, tokenizer):
    run = _run(tmp_path, tokenizer, "overlong", ["algo.mask_overlong=true", "rollout.max_new_tokens=2", "train.steps=1",
                                                 "eval.every=0", "eval.num_tasks=1"])
    turns = [t for r in _trajectories(run) for t in r["turns"]]
    cut = [t for t in turns if t["finish_reason"] == "length"]
    assert cut and all(t["masked_by"] == "overlong" and set(t["loss_mask"]) == {0} for t in cut)


# ---- report data ----------------------------------------------------------------------------------------------

def test_the_report_states_how_many_distinct_held_out_tasks_it_measured(run_dir):
    assert any("held-out success is measured on 2 distinct tasks" in note for note in load_report_data(run_dir).notes)


def test_big_runs_are_capped_to_evenly_spaced_steps_and_the_page_says_so(tmp_path):
    (tmp_path / "config.yaml").write_text("train:\n  steps: 10\n")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "train/loss": "nan" if s == 3 else s}) + "\n"
                                                    for s in range(1, 11)))
    turn = {"observation": "x" * 50, "response": "ab", "response_tokens": ["\u0120a", "b\u010a"], "response_ids": [1, 2],
            "logprobs": [-0.5, -2.0], "advantage": 1.0, "entropies": [0.1, 0.9], "actions": [], "valid": True,
            "reward": 0.0, "reward_components": {}}
    with (tmp_path / "trajectories.jsonl").open("w") as f:
        for s in range(1, 11):
            for i in range(4):
                f.write(json.dumps({"step": s, "index": i, "seed": i, "turns": [turn]}) + "\n")
    data = load_report_data(tmp_path, max_trajectories=12, max_text_chars=20)
    steps = sorted({t["step"] for t in data.trajectories})
    assert len(data.trajectories) == 12 and steps[0] == 1 and steps[-1] == 10 and len(steps) == 3
    assert data.total_trajectories == 40 and any("showing 12 of 40" in n for n in data.notes)
    assert data.metrics["train/loss"][2] == [3, None]  # a non-finite value is a gap, not a crash
    t = data.trajectories[0]["turns"][0]
    assert t["tokens"] == [" a", "b\n"] and t["entropy"] == [0.1, 0.9] and t["advantage"] == [1.0, 1.0]
    assert t["observation"].startswith("x" * 20) and "30 more characters not shown" in t["observation"]
    assert display_token("\u0120hello\u010a") == " hello\n"


def test_cli_writes_the_report_and_rejects_a_directory_that_is_not_a_run(run_dir, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    html = out.read_text()
    assert "<script>window.__pwned" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "not a run directory" in capsys.readouterr().err


# ---- the page in a real browser -------------------------------------------------------------------------------

class Browser:
    """Headless chromium with one page, driven over the DevTools protocol."""

    def __init__(self, profile: Path) -> None:
        from websockets.sync.client import connect

        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if exe is None:
            raise RuntimeError("chromium is not installed: `sudo apt-get install -y chromium` (`./dev test` does this when run as root)")
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not start its DevTools server within 30 s")
            time.sleep(0.05)
        port = int(port_file.read_text().splitlines()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.stack = contextlib.ExitStack()
        self.ws = self.stack.enter_context(connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10))
        self.next_id = 0
        self.events: list[dict] = []
        for domain in ("Runtime", "Log", "Page"):
            self.send(f"{domain}.enable")

    def send(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            self.events.append(msg)

    def open(self, path: Path) -> None:
        self.events.clear()
        self.send("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + 20
        while self.eval("document.body && document.body.getAttribute('data-ready')") != "1":
            if time.monotonic() > deadline:
                raise AssertionError(f"page never became ready; errors: {self.errors()}")
            time.sleep(0.05)

    def eval(self, expression: str):
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def select(self, selector: str, value) -> None:
        self.eval(f"(() => {{ const s = document.querySelector({json.dumps(selector)}); s.value = {json.dumps(str(value))};"
                  f" s.dispatchEvent(new Event('change')); }})()")

    def errors(self) -> list[str]:
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(json.dumps(p["exceptionDetails"])[:500])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(json.dumps(p.get("args"))[:500])
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(p["entry"].get("text", ""))
        return out

    def close(self) -> None:
        if getattr(self, "stack", None) is not None:
            self.stack.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def page(run_dir, tmp_path_factory):
    out = write_report(run_dir, tmp_path_factory.mktemp("report") / "report.html")
    browser = Browser(tmp_path_factory.mktemp("chromium-profile"))
    try:
        browser.open(out)
        yield browser
    finally:
        browser.close()


def _shown(page) -> dict:
    return page.eval("""(() => ({
        traj: document.getElementById('traj-select').value,
        obs: [...document.querySelectorAll('.turn .obs')].map(e => e.textContent),
        tokens: [...document.querySelectorAll('.turn')].map(t => [...t.querySelectorAll('.tok')].map(s => s.textContent)),
        colors: [...document.querySelectorAll('.tok')].map(s => s.style.backgroundColor),
        summary: document.getElementById('traj-summary').textContent,
    }))()""")


def test_page_loads_without_errors_and_draws_curves_alerts_and_config(page):
    assert page.errors() == []
    metrics = page.eval("[...document.querySelectorAll('path.series')].map(p => p.getAttribute('data-metric'))")
    for name in ("rollout/success_rate", "eval/success_rate", "train/loss", "train/grad_norm", "train/entropy"):
        assert name in metrics
    assert page.eval("document.querySelector('path.series').getAttribute('d').length") > 5
    assert page.eval("document.querySelectorAll('.alert-marker[data-step=\"1\"]').length") >= len(metrics) // 2
    assert page.eval("document.querySelectorAll('.alert-row').length") == 1
    assert "<b>spike</b>" in page.eval("document.querySelector('.alert-row').textContent")
    assert "estimator: grpo_turn" in page.eval("document.getElementById('config-text').textContent")


def test_a_trajectory_renders_its_turns_and_tokens(page, run_dir):
    shown = _shown(page)
    rows = [r for r in _trajectories(run_dir) if r["step"] == 2]  # the viewer opens at the last step
    row = rows[int(shown["traj"]) - 4]  # the last step's trajectories follow the first step's four
    assert shown["obs"] == [t["observation"] for t in row["turns"]]
    assert shown["tokens"] == [[display_token(x) or "\u2205" for x in t["response_tokens"]] for t in row["turns"]]
    assert f"seed {row['seed']}" in shown["summary"]
    assert page.eval("document.querySelectorAll('#traj-select option').length") == 4
    assert page.eval("document.querySelectorAll('#step-select option').length") == 2


def test_switching_trajectory_and_step_changes_the_content(page):
    before = _shown(page)
    options = page.eval("[...document.querySelectorAll('#traj-select option')].map(o => o.value)")
    other = next(v for v in options if v != before["traj"])
    page.select("#traj-select", other)
    after = _shown(page)
    assert after["traj"] == other and after["summary"] != before["summary"]
    page.select("#step-select", 1)
    assert page.eval("[...document.querySelectorAll('#traj-select option')].map(o => +o.value)") == [0, 1, 2, 3]
    assert "step 1 " in _shown(page)["summary"]
    assert page.errors() == []


def test_switching_the_colouring_recolours_the_tokens(page):
    page.select("#color-select", "advantage")
    by_adv = _shown(page)["colors"]
    page.select("#color-select", "logprob")
    by_lp = _shown(page)["colors"]
    page.select("#color-select", "mask")
    by_mask = _shown(page)["colors"]
    assert by_adv and len(by_adv) == len(by_lp) == len(by_mask)
    assert by_adv != by_lp and by_lp != by_mask
    assert set(by_mask) <= {"rgb(134, 239, 172)", "rgb(203, 213, 225)"}  # trained green / untrained grey
    assert "trained" in page.eval("document.getElementById('legend').textContent")
    assert page.eval("document.querySelector('#color-select option[value=entropy]').disabled") is True


def test_markup_in_observations_is_shown_as_text_never_run(page):
    assert page.eval("typeof window.__pwned") == "undefined"
    assert page.eval("document.querySelectorAll('img').length") == 0
    assert page.eval("document.querySelectorAll('script').length") == 2  # the data island and the page's own script
    obs = _shown(page)["obs"]
    assert obs and all(HOSTILE in o for o in obs)
    assert page.errors() == []


def test_run_name_markup_and_placeholders_stay_text():
    from turnrl.monitor.report import ReportData, render_html

    html = render_html(ReportData(run="__JS__</title><script>x()</script>"))
    assert html.count("<script>x()") == 0 and "<title>turnrl report: __JS__&lt;/title&gt;" in html
    assert html.count('"use strict"') == 1  # the page script is inserted once, not into the title
