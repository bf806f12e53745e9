"""Metric sinks. Metrics are flat dicts of namespaced floats: ``rollout/success_rate``, ``train/kl``, ..."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class JsonlSink:
    """Appends one JSON object per step to ``metrics.jsonl`` (flushed at once, so a crash loses nothing)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        row = {"step": step, **{k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def close(self) -> None:
        pass


class TensorBoardSink:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MetricLogger:
    def __init__(self, sinks: list[Any]) -> None:
        self.sinks = sinks

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        for s in self.sinks:
            s.write(step, clean)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
