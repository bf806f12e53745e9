"""`turnrl report RUN`: one self-contained HTML file with a run's curves, config, alerts and trajectories.

The page needs no network: the data is embedded as JSON and drawn by the inline script below (SVG charts
written here, no chart library). Everything that comes from the run (observations, responses, tokens,
config values, alert messages) is untrusted text: the JSON is embedded with ``<``, ``>`` and ``&``
escaped so it cannot close its ``<script>`` element, and the page puts it into the DOM only through
``textContent`` / attributes, never as HTML.

What the page shows:

- curves of the main metrics (success, reward and its components, held-out evaluation, loss, KL,
  entropy, grad norm, validity and lengths, throughput and timings), with a red marker at each alert's step;
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
from pathlib import Path
from typing import Any, Iterator

import yaml

#: Chart panels: (title, metric names or name prefixes ending in "/"). Panels with no data are left out.
PANELS: list[tuple[str, list[str]]] = [
    ("Success rate", ["rollout/success_rate", "eval/success_rate", "eval/success_ci_low", "eval/success_ci_high"]),
    ("Episode reward", ["rollout/reward", "eval/reward"]),
    ("Reward components (rollout)", ["rollout/reward/"]),
    ("Valid actions", ["rollout/valid_action_rate", "eval/valid_action_rate"]),
    ("Train loss", ["train/loss"]),
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


def load_report_data(run_dir: Path, max_trajectories: int = 200, max_text_chars: int = 20_000) -> ReportData:
    """Read a run directory (``metrics.jsonl``, ``alerts.jsonl``, ``config.yaml``, ``trajectories.jsonl``)."""
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


def render_html(data: ReportData) -> str:
    """The whole page as one string."""
    payload = {
        "run": data.run, "metrics": data.metrics, "alerts": data.alerts, "config": data.config,
        "trajectories": data.trajectories, "total_trajectories": data.total_trajectories, "notes": data.notes,
        "panels": [[title, names] for title, names in PANELS],
    }
    title = "turnrl report: " + data.run
    title = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    # Only the page's own script may run (by its hash): defence in depth should markup ever reach the DOM.
    script_hash = "sha256-" + base64.b64encode(hashlib.sha256(_JS.encode("utf-8")).digest()).decode("ascii")
    parts = {"TITLE": title, "SCRIPT_HASH": script_hash, "CSS": _CSS, "JS": _JS, "DATA": _embed_json(payload)}
    return re.sub(r"__(TITLE|SCRIPT_HASH|CSS|JS|DATA)__", lambda m: parts[m.group(1)], _PAGE)  # one pass


def write_report(run_dir: Path, out: Path | None = None, max_trajectories: int = 200, max_text_chars: int = 20_000) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN/report.html``) and return its path."""
    run_dir = Path(run_dir)
    out = Path(out) if out else run_dir / "report.html"
    html = render_html(load_report_data(run_dir, max_trajectories, max_text_chars))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src '__SCRIPT_HASH__'; style-src 'unsafe-inline'; img-src data:">
<title>__TITLE__</title>
<style>__CSS__</style>
</head>
<body>
<header><h1 id="title"></h1><div id="notes"></div></header>
<nav><a href="#curves">Curves</a> · <a href="#alerts">Alerts</a> · <a href="#viewer">Trajectories</a> · <a href="#config">Config</a></nav>
<section id="curves"><h2>Curves</h2><div id="charts"></div></section>
<section id="alerts"><h2>Alerts</h2><div id="alert-list"></div></section>
<section id="viewer"><h2>Trajectories</h2>
<div class="controls">
<label>Step <select id="step-select"></select></label>
<label>Trajectory <select id="traj-select"></select></label>
<label>Colour tokens by <select id="color-select">
<option value="advantage">advantage</option><option value="logprob">logprob</option>
<option value="entropy">entropy</option><option value="mask">loss mask</option></select></label>
<span id="legend"></span>
</div>
<div id="traj-summary"></div>
<div id="turns"></div>
</section>
<section id="config"><h2>Resolved config</h2><pre id="config-text"></pre></section>
<script type="application/json" id="report-data">__DATA__</script>
<script>__JS__</script>
</body>
</html>
"""

_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 auto; max-width: 1400px; padding: 0 16px 40px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 17px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
nav a { color: #2563eb; }
.note { background: #fff7d6; border: 1px solid #e8d48a; padding: 4px 8px; margin: 4px 0; }
#charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 12px; }
.chart { border: 1px solid #e2e2e2; border-radius: 4px; padding: 6px; }
.chart h3 { font-size: 13px; margin: 0 0 4px; }
.chart svg { width: 100%; height: auto; }
.legend-item { display: inline-block; margin-right: 10px; font-size: 12px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 3px; vertical-align: middle; }
table { border-collapse: collapse; } td, th { border: 1px solid #ddd; padding: 3px 6px; text-align: left; vertical-align: top; }
.controls { display: flex; flex-wrap: wrap; gap: 14px; align-items: center; margin-bottom: 8px; }
.turn { border: 1px solid #ddd; border-radius: 4px; margin: 8px 0; padding: 6px 10px; }
.turn h4 { margin: 0 0 4px; font-size: 13px; }
.obs, .resp { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12.5px; background: #f6f6f6;
  padding: 6px; margin: 4px 0; max-height: 320px; overflow: auto; }
.tokens { font-family: ui-monospace, monospace; font-size: 12.5px; line-height: 1.9; white-space: pre-wrap; }
.tok { border-radius: 2px; padding: 1px 0; border-right: 1px solid rgba(0,0,0,0.12); }
.meta { font-size: 12px; color: #444; }
.bad { color: #b91c1c; } .good { color: #15803d; }
pre#config-text { background: #f6f6f6; padding: 8px; overflow: auto; }
"""

_JS = r"""
"use strict";
const D = JSON.parse(document.getElementById("report-data").textContent);
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"];

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}
function fmt(v) {
  if (v === null || v === undefined) return "n/a";
  if (typeof v !== "number") return String(v);
  const a = Math.abs(v);
  return (a !== 0 && (a < 1e-3 || a >= 1e5)) ? v.toExponential(2) : (+v.toFixed(4)).toString();
}

// ---- header ---------------------------------------------------------------------------------------------
document.getElementById("title").textContent = "turnrl report: " + D.run;
for (const n of D.notes) document.getElementById("notes").appendChild(el("div", {class: "note"}, n));

// ---- curves ---------------------------------------------------------------------------------------------
function seriesFor(names) {
  const out = [];
  for (const n of names) {
    if (n.endsWith("/")) {
      for (const k of Object.keys(D.metrics).sort()) if (k.startsWith(n) && !k.slice(n.length).includes("/")) out.push(k);
    } else if (D.metrics[n]) out.push(n);
  }
  return out.filter(k => D.metrics[k].some(p => p[1] !== null));
}
function niceTicks(lo, hi) {  // about five round values covering [lo, hi]
  const raw = (hi - lo) / 4, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw);
  const out = [];
  for (let v = Math.floor(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  if (out[out.length - 1] < hi) out.push(+(out[out.length - 1] + step).toPrecision(12));
  return out;
}
function drawChart(title, names) {
  const W = 440, H = 220, L = 52, R = 10, T = 10, B = 28;
  const pts = names.flatMap(n => D.metrics[n]);
  const xs = pts.map(p => p[0]), ys = pts.filter(p => p[1] !== null).map(p => p[1]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const sx = x => L + (x - x0) / (x1 - x0) * (W - L - R), sy = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const box = el("div", {class: "chart", "data-title": title});
  box.appendChild(el("h3", {}, title));
  const svg = svgEl("svg", {viewBox: `0 0 ${W} ${H}`, role: "img"});
  [y0, y1] = [Math.min(y0, niceTicks(y0, y1)[0]), Math.max(y1, niceTicks(y0, y1).slice(-1)[0])];
  for (const y of niceTicks(y0, y1)) {
    svg.appendChild(svgEl("line", {x1: L, x2: W - R, y1: sy(y), y2: sy(y), stroke: "#eee"}));
    const t = svgEl("text", {x: L - 4, y: sy(y) + 4, "text-anchor": "end", "font-size": 10, fill: "#666"});
    t.textContent = fmt(y); svg.appendChild(t);
  }
  for (const x of niceTicks(x0, x1).filter(x => x >= x0 && x <= x1 && Number.isInteger(x))) {
    const t = svgEl("text", {x: sx(x), y: H - 10, "text-anchor": "middle", "font-size": 10, fill: "#666"});
    t.textContent = fmt(x); svg.appendChild(t);
  }
  for (const a of D.alerts) {  // a red marker at each alert's step
    if (typeof a.step !== "number" || a.step < x0 || a.step > x1) continue;
    const m = svgEl("line", {x1: sx(a.step), x2: sx(a.step), y1: T, y2: H - B, stroke: "#dc2626",
                             "stroke-dasharray": "4 3", class: "alert-marker", "data-step": a.step});
    const tt = svgEl("title", {}); tt.textContent = `step ${a.step}: ${a.name}: ${a.message}`;
    m.appendChild(tt); svg.appendChild(m);
  }
  const legend = el("div", {});
  names.forEach((n, i) => {
    const c = COLORS[i % COLORS.length];
    const dashed = /_ci_(low|high)$/.test(n);
    let d = "", pen = false;
    for (const [x, y] of D.metrics[n]) {
      if (y === null) { pen = false; continue; }
      d += (pen ? "L" : "M") + sx(x).toFixed(1) + "," + sy(y).toFixed(1); pen = true;
    }
    const path = svgEl("path", {d, fill: "none", stroke: c, "stroke-width": 1.6, class: "series", "data-metric": n});
    if (dashed) path.setAttribute("stroke-dasharray", "3 3");
    svg.appendChild(path);
    const finite = D.metrics[n].filter(p => p[1] !== null);
    if (finite.length <= 40) for (const [x, y] of finite) {
      const dot = svgEl("circle", {cx: sx(x), cy: sy(y), r: 2.2, fill: c});
      const tt = svgEl("title", {}); tt.textContent = `${n} @ step ${x}: ${fmt(y)}`; dot.appendChild(tt);
      svg.appendChild(dot);
    }
    const item = el("span", {class: "legend-item"});
    item.appendChild(el("span", {class: "swatch", style: `background:${c}`}));
    const last = finite.length ? finite[finite.length - 1][1] : null;
    item.appendChild(document.createTextNode(`${n} (last ${fmt(last)})`));
    legend.appendChild(item);
  });
  box.appendChild(svg); box.appendChild(legend);
  return box;
}
const charts = document.getElementById("charts");
let drawn = 0;
for (const [title, names] of D.panels) {
  const s = seriesFor(names);
  if (s.length) { charts.appendChild(drawChart(title, s)); drawn++; }
}
if (!drawn) charts.appendChild(el("p", {}, "metrics.jsonl holds no finite values yet."));

// ---- alerts ---------------------------------------------------------------------------------------------
const alertBox = document.getElementById("alert-list");
if (!D.alerts.length) alertBox.appendChild(el("p", {}, "No alerts."));
else {
  const tbl = el("table", {id: "alert-table"});
  const head = el("tr", {}); for (const h of ["step", "detector", "message", "evidence"]) head.appendChild(el("th", {}, h));
  tbl.appendChild(head);
  for (const a of D.alerts) {
    const tr = el("tr", {class: "alert-row"});
    tr.appendChild(el("td", {}, a.step)); tr.appendChild(el("td", {}, a.name)); tr.appendChild(el("td", {}, a.message));
    tr.appendChild(el("td", {}, JSON.stringify(a.evidence)));
    tbl.appendChild(tr);
  }
  alertBox.appendChild(tbl);
}
document.getElementById("config-text").textContent = D.config || "(no config.yaml)";

// ---- trajectory viewer ----------------------------------------------------------------------------------
const stepSel = document.getElementById("step-select"), trajSel = document.getElementById("traj-select");
const colorSel = document.getElementById("color-select");
const byStep = new Map();
D.trajectories.forEach((t, i) => { if (!byStep.has(t.step)) byStep.set(t.step, []); byStep.get(t.step).push(i); });
for (const s of [...byStep.keys()].sort((a, b) => a - b)) stepSel.appendChild(el("option", {value: s}, `step ${s}`));
const hasEntropy = D.trajectories.some(t => t.turns.some(u => u.entropy));
const hasMask = D.trajectories.some(t => t.turns.some(u => u.mask));
for (const o of colorSel.options) {
  if ((o.value === "entropy" && !hasEntropy) || (o.value === "mask" && !hasMask)) {
    o.disabled = true; o.textContent += " (not recorded in this run)";
  }
}
function range(key) {  // 2nd-98th percentile of every embedded token: colours compare across trajectories
  const vals = [];  // and one outlier does not wash out the rest
  for (const t of D.trajectories) for (const u of t.turns) for (const v of (u[key] || [])) if (v !== null) vals.push(v);
  if (!vals.length) return [0, 0];
  vals.sort((a, b) => a - b);
  const q = f => vals[Math.min(vals.length - 1, Math.floor(f * (vals.length - 1) + 0.5))];
  return [q(0.02), q(0.98)];
}
const RANGES = {advantage: range("advantage"), logprob: range("logprob"), entropy: range("entropy")};
function mix(a, b, f) { return `rgb(${a.map((x, i) => Math.round(x + (b[i] - x) * f)).join(",")})`; }
const WHITE = [255, 255, 255], RED = [220, 38, 38], BLUE = [37, 99, 235], ORANGE = [234, 88, 12], GREEN = [134, 239, 172], GREY = [203, 213, 225];
function tokenColor(mode, v) {
  if (v === null || v === undefined) return "rgb(255,255,255)";
  if (mode === "advantage") { const m = Math.max(Math.abs(RANGES.advantage[0]), Math.abs(RANGES.advantage[1])) || 1;
    const f = Math.min(1, Math.abs(v) / m); return v >= 0 ? mix(WHITE, BLUE, f) : mix(WHITE, RED, f); }
  if (mode === "logprob") { const lo = Math.min(RANGES.logprob[0], -1e-6); return mix(WHITE, ORANGE, Math.min(1, v / lo)); }
  if (mode === "entropy") { const hi = Math.max(RANGES.entropy[1], 1e-6); return mix(WHITE, [147, 51, 234], Math.min(1, v / hi)); }
  return v >= 1 ? mix(WHITE, GREEN, 1) : mix(WHITE, GREY, 1);
}
const LEGENDS = {
  advantage: () => `blue = positive, red = negative advantage (full colour at |${fmt(Math.max(Math.abs(RANGES.advantage[0]), Math.abs(RANGES.advantage[1])))}|)`,
  logprob: () => `white = logprob 0 (certain), orange = unlikely (full colour at ${fmt(RANGES.logprob[0])})`,
  entropy: () => `white = 0 nats, purple = high entropy (full colour at ${fmt(RANGES.entropy[1])})`,
  mask: () => "green = trained (in the loss), grey = not trained",
};
function fillTrajectories() {
  trajSel.textContent = "";
  for (const i of byStep.get(+stepSel.value) || []) {
    const t = D.trajectories[i];
    trajSel.appendChild(el("option", {value: i},
      `#${t.index ?? i} seed ${t.seed} · reward ${fmt(t.reward)} · ${t.success ? "success" : "fail"} · ${t.turns.length} turns`));
  }
}
function colorTokens() {
  const mode = colorSel.value;
  const t = D.trajectories[+trajSel.value];
  document.getElementById("legend").textContent = LEGENDS[mode]();
  document.querySelectorAll(".turn").forEach((div, j) => {
    const u = t.turns[j];
    div.querySelectorAll(".tok").forEach((s, k) => { s.style.backgroundColor = tokenColor(mode, (u[mode] || [])[k]); });
  });
}
function renderTrajectory() {
  const box = document.getElementById("turns"), sum = document.getElementById("traj-summary");
  box.textContent = ""; sum.textContent = "";
  if (trajSel.value === "") { box.appendChild(el("p", {}, "No trajectories recorded.")); return; }
  const t = D.trajectories[+trajSel.value];
  sum.appendChild(el("p", {class: "meta"}, `#${t.index ?? "?"} · ${t.env} · seed ${t.seed} · group ${t.group ?? "?"} · step ${t.step} · ` +
    `termination ${t.termination} · reward ${fmt(t.reward)} · ${t.success ? "solved" : "not solved"}`));
  t.turns.forEach((u, j) => {
    const div = el("div", {class: "turn", "data-turn": j});
    div.appendChild(el("h4", {}, `Turn ${j + 1}`));
    div.appendChild(el("div", {class: "meta"}, "observation"));
    div.appendChild(el("div", {class: "obs"}, u.observation));
    div.appendChild(el("div", {class: "meta"}, `response (${u.tokens.length} tokens${u.finish_reason ? ", finish: " + u.finish_reason : ""})`));
    const toks = el("div", {class: "tokens"});
    u.tokens.forEach((tok, k) => {
      const s = el("span", {class: "tok"}, tok.length ? tok : "\u2205");
      const bits = [`id ${u.ids[k]}`];
      if (u.logprob) bits.push(`logprob ${fmt(u.logprob[k])}`);
      if (u.advantage) bits.push(`advantage ${fmt(u.advantage[k])}`);
      if (u.entropy) bits.push(`entropy ${fmt(u.entropy[k])}`);
      if (u.mask) bits.push(`loss mask ${u.mask[k]}`);
      s.title = JSON.stringify(tok) + "  " + bits.join(" · ");
      toks.appendChild(s);
    });
    div.appendChild(toks);
    const det = el("details", {});
    det.appendChild(el("summary", {class: "meta"}, "response text (as the env received it)"));
    det.appendChild(el("div", {class: "resp"}, u.response));
    div.appendChild(det);
    const actions = u.actions.length ? u.actions.join(", ") : "(none parsed)";
    const comps = Object.entries(u.reward_components).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
    const meta = el("div", {class: "meta"});
    meta.appendChild(el("span", {class: "actions"}, `actions: ${actions} · `));
    meta.appendChild(el("span", {class: u.valid ? "good" : "bad"}, u.valid ? "valid" : "invalid"));
    meta.appendChild(document.createTextNode(` · reward ${fmt(u.reward)}${comps ? " (" + comps + ")" : ""} · advantage ${fmt(u.turn_advantage)}` +
      (u.masked_by ? ` · not trained: ${u.masked_by}` : "")));
    div.appendChild(meta);
    box.appendChild(div);
  });
  colorTokens();
}
stepSel.addEventListener("change", () => { fillTrajectories(); renderTrajectory(); });
trajSel.addEventListener("change", renderTrajectory);
colorSel.addEventListener("change", colorTokens);
if (byStep.size) stepSel.value = String([...byStep.keys()].sort((a, b) => a - b).pop());
fillTrajectories();
renderTrajectory();
document.body.setAttribute("data-ready", "1");
"""
