"""The run's monitor: one object that records every step and decides what an alert does.

It owns the metric sinks (``metrics.jsonl``, TensorBoard, W&B, MLflow), the trajectory records
(``trajectories.jsonl``), the pathology detectors and their actions (``alerts.jsonl``), the progress bar and
the final report. The training loop calls :meth:`Monitor.after_step` once per step and acts on its answer:

- ``"go"``: carry on;
- ``"stop"``: checkpoint and stop (``monitor.on_alert: stop``, or a rollback with nothing left to roll back to);
- ``"rollback"``: restore :attr:`Monitor.rollback_target` (the last checkpoint saved before any alert fired),
  then call :meth:`Monitor.rolled_back`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

from turnrl.config import Config
from turnrl.monitor.detectors import Alert, Detector, default_detectors
from turnrl.monitor.records import write_trajectories
from turnrl.monitor.sinks import JsonlSink, MetricLogger, MlflowSink, TensorBoardSink, WandbSink
from turnrl.types import Advantages, TrainSample, TrajectoryGroup

Action = Literal["go", "stop", "rollback"]


class Monitor:
    """Sinks, trajectory records, detectors and their actions for the run in ``run_dir`` (see the module docstring)."""

    def __init__(self, run_dir: Path, cfg: Config, start: int, tokenizer) -> None:
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.tokenizer = tokenizer  # trajectory records show each response token as the tokenizer's piece
        self.logger = MetricLogger(_sinks(self.run_dir, cfg))
        self.detectors = self._new_detectors()
        self.progress = Progress(cfg.log.progress, cfg.train.steps, start)
        self.rollbacks = 0
        self.alerted = False  # an alert fired since the last rollback: later checkpoints are no rollback targets
        self.rollback_target: Path | None = None
        self._alerts: list[Alert] = []  # the last step's

    @property
    def may_roll_back(self) -> bool:
        """Whether any alert is configured to roll back (then the run needs a checkpoint from before the first alert)."""
        m = self.cfg.monitor
        return "rollback" in (m.on_alert, *m.actions.values())

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.logger.log(step, metrics)

    def after_step(self, step: int, metrics: dict[str, float], groups: list[TrajectoryGroup], advantages: Advantages,
                   samples: list[TrainSample]) -> Action:
        """Log the step's metrics, record its trajectories, run the detectors; returns what the loop must do."""
        metrics["monitor/rollbacks"] = float(self.rollbacks)
        self.logger.log(step, metrics)
        write_trajectories(self.run_dir, step, groups, advantages, self.tokenizer, self.cfg.log.sample_trajectories,
                           samples, self.cfg.algo)
        alerts = self._alerts = [a for d in self.detectors if (a := d.update(step, metrics))]
        for a in alerts:
            self._append_alert({"step": a.step, "name": a.name, "message": a.message, "evidence": a.evidence})
            self.progress.write(f"ALERT [{a.name}] step {a.step}: {a.message}")
        action = self._action(alerts)
        if action == "rollback" and (self.rollback_target is None or not self.rollback_target.exists()):
            self.progress.write("no checkpoint from before the alert is left to roll back to (raise log.keep_checkpoints); stopping")
            action = "stop"
        if action != "rollback":
            self.alerted = self.alerted or bool(alerts)
            self.progress.update(metrics)
        return action

    def rolled_back(self, step: int, to_step: int, metrics: dict[str, float]) -> None:
        """Record a rollback at ``step`` to the step-``to_step`` checkpoint; the detectors start afresh."""
        self.rollbacks += 1
        names = [a.name for a in self._alerts]
        self._append_alert({"step": step, "name": "rollback", "message": f"rolled back to step {to_step} after {', '.join(names)}",
                            "evidence": {"to_step": to_step, "alerts": names}})
        self.progress.write(f"ROLLBACK step {step}: restored the step-{to_step} checkpoint (after {', '.join(names)})")
        self.detectors = self._new_detectors()  # their windows held the bad steps
        self.alerted = False
        self.progress.update(metrics)

    def saved(self, checkpoint: Path | None) -> None:
        """A checkpoint was written: it is the rollback target while no alert has fired."""
        if not self.alerted:
            self.rollback_target = checkpoint

    def close(self) -> None:
        """Close the bar and the sinks; write ``report.html`` when ``log.report`` (a failure there is only reported)."""
        self.progress.close()
        if self.cfg.log.report:
            from turnrl.monitor.report import write_report

            try:
                write_report(self.run_dir)
            except Exception as e:  # noqa: BLE001 - the checkpoint and metrics are already on disk
                self.progress.write(f"could not write {self.run_dir / 'report.html'} ({type(e).__name__}: {e}); "
                                    f"try `turnrl report {self.run_dir}`")
        self.logger.close()

    # ------------------------------------------------------------------ internals

    def _new_detectors(self) -> list[Detector]:
        return default_detectors() if self.cfg.monitor.detectors else []

    def _action(self, alerts: list[Alert]) -> Action:
        """The strongest action the alerts call for (stop > rollback > warn), by ``monitor.actions`` or ``on_alert``."""
        m = self.cfg.monitor
        actions = {m.actions.get(a.name, m.on_alert) for a in alerts}
        if "stop" in actions:
            return "stop"
        if "rollback" in actions:
            return "rollback" if self.rollbacks < m.max_rollbacks else "stop"
        return "go"

    def _append_alert(self, row: dict) -> None:
        with (self.run_dir / "alerts.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")


def _sinks(run_dir: Path, cfg: Config) -> list:
    log = cfg.log
    sinks: list = [JsonlSink(run_dir / "metrics.jsonl")]
    if log.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tb"))
    if log.wandb:
        sinks.append(WandbSink(run_dir, log.wandb_project, cfg.model_dump(mode="json")))
    if log.mlflow:
        sinks.append(MlflowSink(run_dir, log.mlflow_tracking_uri, log.mlflow_experiment, cfg.model_dump(mode="json")))
    return sinks


class Progress:
    """A tqdm bar showing step, success rate, reward and the held-out score (messages go to stderr when off)."""

    def __init__(self, enabled: bool, total: int, start: int) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)

    def update(self, m: dict[str, float]) -> None:
        if self.bar is None:
            return
        post = {"succ": f"{m.get('rollout/success_rate', 0):.2f}", "rew": f"{m.get('rollout/reward', 0):.2f}",
                "valid": f"{m.get('rollout/valid_action_rate', 0):.2f}"}
        if "eval/success_rate" in m:
            post["eval"] = f"{m['eval/success_rate']:.2f}"
        self.bar.set_postfix(post)
        self.bar.update(1)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
