"""Metric sinks. Metrics are flat dicts of namespaced floats: ``rollout/success_rate``, ``train/kl``, ..."""

from __future__ import annotations

import json
import math
import secrets
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from turnrl.monitor.files import read_jsonl


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
    """Scalars under ``log_dir``; ``purge_step`` hides events from that step on (a resumed run writes them again)."""

    def __init__(self, log_dir: Path, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _missing(package: str, extra: str) -> ImportError:
    return ImportError(f"{package} is not installed; install it with `pip install 'turnrl[{extra}]'` "
                       f"or turn the sink off (log.{extra}=false)")


def _remembered_id(path: Path) -> str | None:
    """The tracker run id a previous session of this run directory stored in ``path`` (so resume appends)."""
    if not path.exists():
        return None
    return path.read_text().strip() or None


class WandbSink:
    """Logs every step's scalars to a Weights & Biases run named after the run directory.

    The W&B run id is kept in ``RUN/wandb_run_id`` so ``turnrl train --resume`` continues the same W&B run.
    ``WANDB_MODE=offline`` writes the run under ``RUN/wandb/`` without a network (sync later with
    ``wandb sync``). Non-finite values are logged as they are (W&B shows them as NaN/inf).
    """

    def __init__(self, run_dir: Path, project: str, config: dict[str, Any] | None = None) -> None:
        try:
            import wandb
        except ImportError:
            raise _missing("wandb", "wandb") from None
        run_dir = Path(run_dir)
        id_file = run_dir / "wandb_run_id"
        run_id = _remembered_id(id_file) or secrets.token_hex(6)
        self.run = wandb.init(project=project, name=run_dir.name, id=run_id, resume="allow", dir=str(run_dir),
                              config=config or {})
        id_file.write_text(run_id)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    """Logs every step's scalars to an MLflow run (experiment ``experiment``, run named after the run directory).

    ``tracking_uri`` empty means MLflow's own default (``MLFLOW_TRACKING_URI`` when set). The MLflow run id is
    kept in ``RUN/mlflow_run_id`` so ``turnrl train --resume`` appends to the same MLflow run. MLflow rejects
    NaN/inf metric values on some backends, so non-finite values are skipped (``metrics.jsonl`` keeps them).
    Metric names keep their ``/`` namespaces, except on MLflow's local file store (``file:`` URIs, in
    maintenance mode since MLflow 3), which maps names to paths and so cannot hold both ``eval/reward`` and
    ``eval/reward/outcome``: there ``/`` becomes ``.`` (``eval.reward.outcome``).
    """

    def __init__(self, run_dir: Path, tracking_uri: str, experiment: str, config: dict[str, Any] | None = None) -> None:
        try:
            import mlflow
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise _missing("mlflow", "mlflow") from None
        run_dir = Path(run_dir)
        self.client = MlflowClient(tracking_uri or None)
        resolved = tracking_uri or mlflow.get_tracking_uri()
        self._sep = "." if urlparse(resolved).scheme in ("", "file") else "/"
        id_file = run_dir / "mlflow_run_id"
        run_id = _remembered_id(id_file)
        if run_id is None:
            exp = self.client.get_experiment_by_name(experiment)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
            run = self.client.create_run(exp_id, run_name=run_dir.name, tags={"turnrl.run_dir": str(run_dir.resolve())})
            run_id = run.info.run_id
            for k, v in _flatten(config or {}).items():
                self.client.log_param(run_id, k, str(v)[:6000])
            id_file.write_text(run_id)
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self._metric = mlflow.entities.Metric

    def write(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(k.replace("/", self._sep), float(v), now, step) for k, v in metrics.items() if math.isfinite(v)]
        for i in range(0, len(batch), 1000):  # MLflow's per-request limit
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


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
    """The rows of ``metrics.jsonl`` (a torn last line, as a crash or a reader racing the writer sees, is left out)."""
    return read_jsonl(path)
