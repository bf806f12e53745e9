
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
function contextNote(c) {  // a budgeted turn's context (docs/memory.md); turn numbers from 1
  const parts = [], from = c.summary === null ? 0 : c.summary + 1;
  if (c.summary !== null) parts.push(`turn ${c.summary + 1}'s summary stands for turns 1-${c.summary + 1}`);
  if (c.first > from) parts.push(c.first === from + 1 ? `turn ${c.first} dropped` : `turns ${from + 1}-${c.first} dropped`);
  parts.push(`${c.budget_left} tokens of budget left`);
  return "context: " + parts.join(" · ");
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
    div.appendChild(el("h4", {}, `Turn ${j + 1}` + (u.memory ? ` · memory turn: ${u.memory}` : "")));
    if (u.context) div.appendChild(el("div", {class: "meta"}, contextNote(u.context)));
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

// ---- transfer matrices (RUN/suite-*.json) ---------------------------------------------------------------
function interval(lo, hi) { return `[${lo.toFixed(2)}-${hi.toFixed(2)}]`; }
function suiteTable(s) {
  const box = el("div", {class: "suite", "data-file": s.file});
  box.appendChild(el("h3", {}, `${s.suite} (${s.file})`));
  const known = s.excluded_keys === null || s.excluded_keys === undefined ? "no trained task keys known"
    : `${s.excluded_keys} trained task keys excluded`;
  box.appendChild(el("p", {class: "meta"}, "Rows: the evaluated models (a checkpoint, or base = the untrained model.path). " +
    "Columns: each env at its difficulty. Cell: greedy success [95% Wilson interval over distinct tasks]" +
    (s.pass_k ? `, pass@${s.pass_k} [interval]` : "") + `, valid-action rate, n distinct held-out tasks ` +
    `(seeds from ${fmt(s.seed_start)}; ${known}). Shade: success.`));
  const tbl = el("table", {class: "matrix"});
  const head = el("tr", {});
  head.appendChild(el("th", {}, "model"));
  for (const c of s.columns) {
    const th = el("th", {}, c.name);
    th.appendChild(el("small", {}, [c.env, ...Object.entries(c.kwargs).map(([k, v]) => `${k}=${v}`)].join(", ")));
    head.appendChild(th);
  }
  tbl.appendChild(head);
  for (const r of s.rows) {
    const tr = el("tr", {class: "matrix-row"});
    tr.appendChild(el("th", {}, r.model));
    for (const c of r.cells) {
      const td = el("td", {class: "cell", style: `background:${mix(WHITE, GREEN, c.success)}`},
        `${c.success.toFixed(3)} ${interval(c.ci_low, c.ci_high)}`);
      if (c.pass_at_k !== null) td.appendChild(el("small", {}, `pass@${s.pass_k} ${c.pass_at_k.toFixed(3)}` +
        (c.pass_ci ? " " + interval(c.pass_ci[0], c.pass_ci[1]) : "")));
      td.appendChild(el("small", {}, `valid ${c.valid_action_rate.toFixed(2)} · n=${c.distinct_tasks}`));
      tr.appendChild(td);
    }
    tbl.appendChild(tr);
  }
  box.appendChild(tbl);
  return box;
}
if (D.suites.length) {
  for (const id of ["suites", "suites-link"]) document.getElementById(id).hidden = false;
  for (const s of D.suites) document.getElementById("suite-list").appendChild(suiteTable(s));
}

document.body.setAttribute("data-ready", "1");
