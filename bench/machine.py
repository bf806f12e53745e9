"""Machine facts for every benchmark result: CPU model, cores, measured bf16 matmul peak and memory read bandwidth,
and the result-file header (command, date, commit, cpu) that ``bench/results/NAME.json`` files carry.

Machines of this kind differ (one measured 3,259 GFLOP/s bf16, another 432): compare numbers only within one run,
and keep these facts beside every number.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else what the platform says) and its widest matmul instructions in
    brackets: clouds report several generations under one name ("AMD EPYC" has been a Zen 3 with AVX2 only and a
    Zen 4 with AVX-512 bf16 here), and which one ran decides bf16 or fp32 and the speed of every result."""
    name, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip().lower() == "model name" and not name:
                name = value.strip()
            elif key.strip().lower() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    isa = next((f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags), "")
    name = name or platform.processor() or platform.machine()
    return f"{name} [{isa}]" if isa else name


def timed(fn, seconds: float = 1.0, most: int = 20) -> float:
    """Seconds per call of ``fn``: one warm-up call, then calls until ``seconds`` have passed (at least
    ``min(2, most)``, at most ``most``)."""
    fn()
    reps, t = 0, time.perf_counter()
    while reps < most and (reps < min(2, most) or time.perf_counter() - t < seconds):
        fn()
        reps += 1
    return (time.perf_counter() - t) / reps


def matmul_peak(dtype: torch.dtype = torch.bfloat16, seconds: float = 0.5) -> float:
    """Best GFLOP/s of ``dtype`` matmuls over a few large shapes (warm), each timed for about ``seconds``: on a CPU
    that emulates bf16 (AVX2 only) one bf16 2048^3 matmul takes seconds, so the repetitions stop at the time budget."""
    best = 0.0
    for m, k, n in ((2048, 2048, 2048), (1024, 576, 3072), (4096, 1024, 1024)):
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
        best = max(best, 2 * m * k * n / timed(lambda: torch.nn.functional.linear(a, b), seconds) / 1e9)
    return best


def read_bandwidth() -> float:
    """Best GB/s reading a 256 MB tensor (a reduction that touches every byte once), warm."""
    a = torch.ones(64 * 2**20)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter()
        a.sum()
        best = max(best, a.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return best


def facts(measure: bool = True) -> dict[str, Any]:
    """``{"cpu", "cores", "threads", "peak_gflops_bf16", "peak_gflops_fp32", "bandwidth_gbs", "torch"}``; the
    measurements take a few seconds. Both peaks, because CPUs without bf16 units run bf16 slower than fp32."""
    out: dict[str, Any] = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
                           "torch": torch.__version__}
    if measure:
        out |= {"peak_gflops_bf16": round(matmul_peak(), 1), "peak_gflops_fp32": round(matmul_peak(torch.float32), 1),
                "bandwidth_gbs": round(read_bandwidth(), 2)}
    return out


@functools.cache
def commit() -> str:
    """The checked-out commit, with ``+dirty`` when the tree has uncommitted changes, as it was when the benchmark
    started (taken when this module is imported): a run of hours records the code it ran, not a later HEAD."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


commit()  # the benchmark's start


def header(measure: bool = True) -> dict[str, Any]:
    """What every result file starts with: the command that produced it, date, commit and the machine facts."""
    return {"command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
            "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "commit": commit(), **facts(measure)}


def write_result(name: str, fields: dict[str, Any], measure: bool = True, head: dict[str, Any] | None = None) -> Path:
    """Write ``bench/results/NAME.json``: the header (``head`` when the caller already took it, so that the file and
    the RESULTS.md section carry the same machine facts), then ``fields``; returns the path."""
    path = ROOT / "bench" / "results" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**(head or header(measure)), **fields}, indent=2) + "\n")
    return path


def append_results(text: str) -> None:
    """Append a section to bench/RESULTS.md, a blank line before it."""
    with (ROOT / "bench" / "RESULTS.md").open("a") as f:
        f.write("\n" + text.strip("\n") + "\n")


def merge_result(name: str, fields: dict[str, Any], measure: bool = True, machine: dict[str, Any] | None = None) -> Path:
    """Update ``bench/results/NAME.json`` with ``fields``, keeping the fields other benchmarks wrote there (a file
    several benchmarks fill, such as perf.json). Each field's command, date, commit and the machine's measured peak and
    bandwidth go under ``"sources"``: ``machine`` when the benchmark measured them itself (the figures its ratios use),
    else measured now when ``measure``."""
    path = ROOT / "bench" / "results" / f"{name}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    head = header(measure and machine is None) | (machine or {})
    source = {k: head[k] for k in ("command", "date", "commit", "peak_gflops_bf16", "bandwidth_gbs") if k in head}
    sources = old.get("sources", {}) | {k: source for k in fields}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**old, **head, **fields, "sources": sources}, indent=2) + "\n")
    return path


if __name__ == "__main__":
    print(json.dumps(facts(), indent=2))


def run_jobs(fn, jobs: dict[str, tuple], processes: int = 1) -> dict[str, Any]:
    """``{name: fn(*args)}`` for every job: one after the other, or ``processes`` at a time in spawned processes
    (each a fresh interpreter: give each run ``train.threads`` so that they share the cores). ``fn`` must be a
    module-level function of an importable module (a bench script run as ``__main__`` is)."""
    if processes <= 1:
        return {name: fn(*args) for name, args in jobs.items()}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {name: pool.submit(fn, *args) for name, args in jobs.items()}
        return {name: f.result() for name, f in futures.items()}
