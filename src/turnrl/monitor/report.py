"""`turnrl report RUN`: one self-contained HTML file with a run's curves, config, alerts and trajectories.

The page needs no network: the data is embedded as JSON and drawn by an inline script (SVG charts, no chart
library). The page, its style and its script are package data, ``assets/report.{html,css,js}``, read with
``importlib.resources`` and inlined at render time, so a report stays one file. Everything that comes from the run
(observations, responses, tokens, config values, alert messages) is untrusted text: the JSON is embedded with
``<``, ``>`` and ``&`` escaped so it cannot close its ``<script>`` element, and the page puts it into the DOM only
through ``textContent`` / attributes, never as HTML.

What the page shows:

- curves of the main metrics (success, reward and its components, held-out evaluation, loss, KL,
  entropy, grad norm, validity and lengths, throughput and timings), with a red marker at each alert's step;
- the transfer matrices of ``RUN/suite-*.json`` (``turnrl eval --suite``, docs/eval_suite.md): models by env /
  difficulty, each cell's success with its 95% interval, pass@k, valid-action rate and distinct tasks; read as
  JSON here (the monitor layer sits below ``turnrl.evalsuite``), a malformed file named in a note and left out;
- the alerts from ``RUN/alerts.jsonl`` and the resolved ``RUN/config.yaml``;
- a trajectory viewer over ``RUN/trajectories.jsonl``: pick a step and a trajectory, read each turn
  (observation, response, parsed actions, validity, reward components, why it was not trained) and colour
  the response tokens by advantage, behaviour logprob, entropy (when recorded) or loss mask.

Big runs: at most ``max_trajectories`` trajectories are embedded, from evenly spaced steps (first and
last included); the page says how many were left out. Texts longer than ``max_text_chars`` are cut with a
visible note.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

import yaml

#: Chart panels: (title, metric names or name prefixes ending in "/"). Panels with no data are left out.
PANELS: list[tuple[str, list[str]]] = [
    ("Success rate", ["rollout/success_rate", "eval/success_rate", "eval/success_ci_low", "eval/success_ci_high"]),
    ("Success rate per role (multi-agent)", ["rollout/success_rate/", "eval/success_rate/"]),
    ("Return per role (multi-agent)", ["rollout/return/", "eval/return/"]),
    ("Episode reward", ["rollout/reward", "eval/reward"]),
    ("Reward components (rollout)", ["rollout/reward/"]),
    ("Valid actions", ["rollout/valid_action_rate", "eval/valid_action_rate"]),
    ("Train loss", ["train/loss"]),
    ("Train loss per role (per-role policies)", ["train/loss/"]),
    ("KL", ["train/kl", "train/approx_kl"]),
    ("Entropy (nats/token)", ["train/entropy"]),
    ("Grad norm", ["train/grad_norm"]),
    ("Clip fractions", ["train/clip_frac_low", "train/clip_frac_high", "train/clip_frac_dual"]),
    ("Advantages", ["train/advantage_mean", "train/advantage_std"]),
    ("Lengths", ["rollout/turns", "rollout/response_tokens", "rollout/response_truncated_rate"]),
    ("Throughput (tokens/s)", ["perf/generate_tokens_per_s", "perf/train_tokens_per_s"]),
    ("Phase time (s)", ["perf/rollout_s", "perf/train_s", "perf/eval_s"]),
]

# Byte-level BPE marks (GPT-2 family tokenizers, SmolLM2): show them as the characters they stand for.
_BPE_MARKS = {"\u0120": " ", "\u010a": "\n", "\u0109": "\t"}
_STEP_PREFIX = re.compile(r'^\{"step":\s*(-?\d+)')


@dataclass
class ReportData:
    """What the page embeds. ``metrics`` maps a name to ``[[step, value-or-None], ...]`` (None = non-finite)."""

    run: str
    metrics: dict[str, list[list[Any]]] = field(default_factory=dict)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    config: str = ""
    trajectories: list[dict[str, Any]] = field(default_factory=list)
    total_trajectories: int = 0
    steps_with_trajectories: int = 0
    notes: list[str] = field(default_factory=list)
    suites: list[dict[str, Any]] = field(default_factory=list)


def _finite(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None  # "nan", "inf" (as JsonlSink writes them) and anything else: a gap in the curve


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open() as f:
        for line in f:
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:  # a run killed mid-write leaves a partial last line
                    continue


def _cut(text: Any, limit: int) -> str:
    s = "" if text is None else str(text)
    return s if len(s) <= limit else s[:limit] + f"\n… [{len(s) - limit} more characters not shown]"


def display_token(tok: str) -> str:
    """A tokenizer piece as readable text: byte-level BPE's ``Ġ``/``Ċ``/``ĉ`` become space, newline, tab."""
    return "".join(_BPE_MARKS.get(ch, ch) for ch in tok)


def _steps_to_keep(counts: dict[int, int], cap: int) -> set[int]:
    """Evenly spaced steps (first and last included) whose trajectories fit in ``cap``."""
    steps = sorted(counts)
    if sum(counts.values()) <= cap:
        return set(steps)
    per_step = max(1, round(sum(counts.values()) / len(steps)))
    k = max(1, min(len(steps), cap // per_step))
    if k == 1:
        return {steps[-1]}
    idx = {round(i * (len(steps) - 1) / (k - 1)) for i in range(k)}
    keep, used = set(), 0
    for i in sorted(idx, key=lambda i: (i not in (0, len(steps) - 1), i)):  # the ends first
        if used + counts[steps[i]] <= cap:
            keep.add(steps[i])
            used += counts[steps[i]]
    return keep or {steps[-1]}


def _trajectory_view(row: dict[str, Any], max_text_chars: int) -> dict[str, Any]:
    turns = []
    for t in row.get("turns", []):
        toks = [display_token(x) for x in t.get("response_tokens") or []]
        n = len(toks)

        def per_token(key: str) -> list[float | None] | None:
            vals = t.get(key)
            return [_finite(v) for v in vals] if isinstance(vals, list) and len(vals) == n else None

        adv = per_token("token_advantages")
        if adv is None and _finite(t.get("advantage")) is not None:
            adv = [_finite(t.get("advantage"))] * n  # older runs: the turn's advantage covers every token
        turns.append({
            "observation": _cut(t.get("observation"), max_text_chars),
            "response": _cut(t.get("response"), max_text_chars),
            "tokens": toks,
            "ids": t.get("response_ids") or [],
            "logprob": per_token("logprobs"),
            "advantage": adv,
            "entropy": per_token("entropies"),
            "mask": per_token("loss_mask"),
            "turn_advantage": _finite(t.get("advantage")),
            "actions": [str(a) for a in t.get("actions") or []],
            "valid": bool(t.get("valid", True)),
            "reward": _finite(t.get("reward")),
            "reward_components": {str(k): _finite(v) for k, v in (t.get("reward_components") or {}).items()},
            "finish_reason": t.get("finish_reason"),
            "masked_by": t.get("masked_by"),
            "memory": t.get("memory"),
            "context": t.get("context"),
        })
    return {
        "step": row.get("step"),
        "index": row.get("index"),
        "group": row.get("group_index"),
        "env": str(row.get("env_id", "")),
        "seed": row.get("seed"),
        "success": bool(row.get("success")),
        "termination": str(row.get("termination", "")),
        "reward": _finite(row.get("reward")),
        "turns": turns,
    }


def _number(v: Any, what: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        raise ValueError(f"{what} is {v!r}, not a number")
    return float(v)


def _pair(v: Any, what: str) -> list[float] | None:
    if v is None:
        return None
    if not isinstance(v, list) or len(v) != 2:
        raise ValueError(f"{what} is {v!r}, not a [low, high] pair")
    return [_number(x, what) for x in v]


def _suite_cell(c: Any, where: str) -> dict[str, Any]:
    if not isinstance(c, dict):
        raise ValueError(f"{where} is not an object")
    out: dict[str, Any] = {k: _number(c.get(k), f"{where}.{k}")
                           for k in ("success", "ci_low", "ci_high", "valid_action_rate")}
    out["distinct_tasks"] = int(_number(c.get("distinct_tasks"), f"{where}.distinct_tasks"))
    out["pass_at_k"] = None if c.get("pass_at_k") is None else _number(c["pass_at_k"], f"{where}.pass_at_k")
    out["pass_ci"] = _pair(c.get("pass_ci"), f"{where}.pass_ci")
    return out


def suite_view(raw: Any) -> dict[str, Any]:
    """A ``suite-NAME.json`` (``turnrl.evalsuite.SuiteResult.to_dict``) as the page draws it; ValueError naming the
    first field that is missing or of the wrong type."""
    if not isinstance(raw, dict) or not isinstance(raw.get("entries"), list) or not isinstance(raw.get("rows"), list):
        raise ValueError("not an object with 'entries' and 'rows' lists")
    columns = []
    for i, e in enumerate(raw["entries"]):
        env = e.get("env") if isinstance(e, dict) else None
        if not isinstance(env, dict) or not isinstance(e.get("name"), str) or not isinstance(env.get("id"), str):
            raise ValueError(f"entries[{i}] has no name and env.id")
        kwargs = {str(k): str(v) for k, v in (env.get("kwargs") or {}).items()}
        columns.append({"name": e["name"], "env": env["id"], "kwargs": kwargs})
    rows = []
    for i, r in enumerate(raw["rows"]):
        cells = r.get("cells") if isinstance(r, dict) else None
        if not isinstance(cells, list) or len(cells) != len(columns):
            raise ValueError(f"rows[{i}] has no list of {len(columns)} cells, one per entry")
        rows.append({"model": str(r.get("model", "")),
                     "cells": [_suite_cell(c, f"rows[{i}].cells[{j}]") for j, c in enumerate(cells)]})
    pass_k = raw.get("pass_k") or 0
    if not isinstance(pass_k, int):
        raise ValueError(f"pass_k is {pass_k!r}, not an integer")
    return {"suite": str(raw.get("suite", "")), "pass_k": pass_k, "seed_start": raw.get("seed_start"),
            "excluded_keys": raw.get("excluded_keys"), "columns": columns, "rows": rows}


def _load_suites(run_dir: Path, data: ReportData) -> None:
    """Every ``RUN/suite-*.json`` into ``data.suites``; a malformed one becomes a note naming it, the rest still show."""
    for path in sorted(run_dir.glob("suite-*.json")):
        try:
            view = suite_view(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
            data.notes.append(f"{path.name} is not a transfer matrix of `turnrl eval --suite` ({e}); it is left out: "
                              f"write it again with `turnrl eval --suite SUITE --out {run_dir}`")
            continue
        data.suites.append({"file": path.name, **view})


def load_report_data(run_dir: Path, max_trajectories: int = 200, max_text_chars: int = 20_000) -> ReportData:
    """Read a run directory (``metrics.jsonl``, ``alerts.jsonl``, ``config.yaml``, ``suite-*.json``,
    ``trajectories.jsonl``)."""
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").exists() and not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no metrics.jsonl or config.yaml); "
                                "pass the directory `turnrl train` printed")
    data = ReportData(run=run_dir.name)
    for row in _read_jsonl(run_dir / "metrics.jsonl"):
        step = row.get("step")
        if not isinstance(step, int):
            continue
        for k, v in row.items():
            if k != "step":
                data.metrics.setdefault(k, []).append([step, _finite(v)])
    distinct = [v for _, v in data.metrics.get("eval/distinct_tasks", []) if v is not None]
    if distinct:
        data.notes.append(f"held-out success is measured on {int(distinct[-1])} distinct tasks (told apart by task key), "
                          "none of which the run trained on")
    data.alerts = [{"step": a.get("step"), "name": str(a.get("name", "")), "message": str(a.get("message", "")),
                    "evidence": a.get("evidence", {})} for a in _read_jsonl(run_dir / "alerts.jsonl")]
    if (run_dir / "config.yaml").exists():
        cfg_text = (run_dir / "config.yaml").read_text()
        try:  # normalise (and prove it parses); show the file as written if it does not
            cfg_text = yaml.safe_dump(yaml.safe_load(cfg_text), sort_keys=False)
        except yaml.YAMLError:
            data.notes.append("config.yaml does not parse as YAML; shown as written")
        data.config = cfg_text
    else:
        data.notes.append("no config.yaml in the run directory")
    _load_suites(run_dir, data)

    traj_path = run_dir / "trajectories.jsonl"
    counts: dict[int, int] = {}
    if traj_path.exists():
        with traj_path.open() as f:  # first pass: count per step from the line prefix, without parsing
            for line in f:
                m = _STEP_PREFIX.match(line)
                if m:
                    counts[int(m.group(1))] = counts.get(int(m.group(1)), 0) + 1
    data.total_trajectories = sum(counts.values())
    data.steps_with_trajectories = len(counts)
    keep = _steps_to_keep(counts, max_trajectories) if counts else set()
    if traj_path.exists():
        with traj_path.open() as f:
            for line in f:
                m = _STEP_PREFIX.match(line)
                if not m or int(m.group(1)) not in keep:
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                data.trajectories.append(_trajectory_view(row, max_text_chars))
    if len(data.trajectories) < data.total_trajectories:
        data.notes.append(f"showing {len(data.trajectories)} of {data.total_trajectories} trajectories: those of "
                          f"{len(keep)} evenly spaced steps out of {len(counts)} (raise --max-trajectories to embed more)")
    if not counts:
        data.notes.append("no trajectories.jsonl (log.sample_trajectories=0?): the trajectory viewer is empty")
    return data


def _embed_json(obj: Any) -> str:
    """JSON that is safe inside ``<script type="application/json">``: no ``<``, ``>``, ``&`` or line separators."""
    s = json.dumps(obj, ensure_ascii=False, allow_nan=False)
    for ch, esc in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        s = s.replace(ch, esc)
    return s


def _asset(name: str) -> str:
    """A page asset shipped with the package (``turnrl/monitor/assets/NAME``), from a source tree or a wheel."""
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def render_html(data: ReportData) -> str:
    """The whole page as one string."""
    payload = {
        "run": data.run, "metrics": data.metrics, "alerts": data.alerts, "config": data.config,
        "trajectories": data.trajectories, "total_trajectories": data.total_trajectories, "notes": data.notes,
        "suites": data.suites,
        "panels": [[title, names] for title, names in PANELS],
    }
    title = "turnrl report: " + data.run
    title = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    page, css, js = _asset("report.html"), _asset("report.css"), _asset("report.js")
    # Only the page's own script may run (by its hash): defence in depth should markup ever reach the DOM.
    script_hash = "sha256-" + base64.b64encode(hashlib.sha256(js.encode("utf-8")).digest()).decode("ascii")
    parts = {"TITLE": title, "SCRIPT_HASH": script_hash, "CSS": css, "JS": js, "DATA": _embed_json(payload)}
    return re.sub(r"__(TITLE|SCRIPT_HASH|CSS|JS|DATA)__", lambda m: parts[m.group(1)], page)  # one pass


def write_report(run_dir: Path, out: Path | None = None, max_trajectories: int = 200, max_text_chars: int = 20_000) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN/report.html``) and return its path."""
    run_dir = Path(run_dir)
    out = Path(out) if out else run_dir / "report.html"
    html = render_html(load_report_data(run_dir, max_trajectories, max_text_chars))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out

