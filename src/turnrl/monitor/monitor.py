"""The run's monitor: one object that records every step, decides what an alert does, and says how the run ended.

It owns the metric sinks (``metrics.jsonl``, TensorBoard, W&B, MLflow), the trajectory records
(``trajectories.jsonl``), the tasks seen (``task_keys.jsonl``), the pathology detectors and their actions
(``alerts.jsonl``), ``status.json``, the stop signals, the console (what the run is, a progress bar, a summary)
and the final report. The training loop enters it as a context manager and calls :meth:`Monitor.after_step` once
per step, acting on its answer:

- ``"go"``: carry on;
- ``"stop"``: checkpoint and stop (``monitor.on_alert: stop``, a rollback with nothing left to roll back to, or
  SIGTERM / SIGINT: the step in flight finishes first, a second signal aborts at once);
- ``"rollback"``: restore :attr:`Monitor.rollback_target` (the last checkpoint saved before any alert fired),
  then call :meth:`Monitor.rolled_back`.

A resumed run's monitor starts from the checkpoint's :meth:`state_dict` (detector windows, rollback counter) and
cuts the logs back to the checkpoint's step, so it continues exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from turnrl.config import Config
from turnrl.monitor.console import Progress, duration, header, held_out_line
from turnrl.monitor.detectors import Alert, Detector, default_detectors
from turnrl.monitor.files import append_jsonl, cut_logs, live_owner, read_jsonl, write_status
from turnrl.monitor.records import write_trajectories
from turnrl.monitor.signals import StopSignals
from turnrl.monitor.sinks import JsonlSink, MetricLogger, MlflowSink, TensorBoardSink, WandbSink
from turnrl.types import Advantages, TrainSample, TrajectoryGroup

Action = Literal["go", "stop", "rollback"]


class TrainingDiverged(RuntimeError):
    """An update produced a non-finite gradient or non-finite weights: the run stopped without checkpointing them."""


class Monitor:
    """Sinks, records, detectors and their actions, status and console of the run in ``run_dir`` (see the module docstring).

    ``resumed`` is the state of the checkpoint a resumed run starts from (its ``step`` and ``monitor`` entries);
    None is a fresh start, which clears what an earlier run without a checkpoint left in ``run_dir``.
    """

    def __init__(self, run_dir: Path, cfg: Config, tokenizer, resumed: dict[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir)
        if (pid := live_owner(self.run_dir)) is not None:
            raise FileExistsError(f"{self.run_dir} is being trained by process {pid} on this machine; wait for it, stop it "
                                  "(kill -TERM checkpoints it), or choose another log.name")
        self.cfg = cfg
        self.tokenizer = tokenizer  # trajectory records show each response token as the tokenizer's piece
        self.resumed_at: int | None = resumed["step"] if resumed else None
        self.step = self.resumed_at or 0
        cut_logs(self.run_dir, self.resumed_at)
        self.logger = MetricLogger(_sinks(self.run_dir, cfg, purge_step=self.step + 1 if resumed else None))
        self.detectors = self._new_detectors()
        self.rollbacks = 0
        self.alerted = False  # an alert fired since the last rollback: later checkpoints are no rollback targets
        self.rollback_target: Path | None = None
        self.last_checkpoint: Path | None = None
        self._alerts: list[Alert] = []  # the last step's
        self._stop_reason = ""
        evals = [r for r in read_jsonl(self.run_dir / "metrics.jsonl") if "eval/success_rate" in r]
        self.first_eval, self.last_eval = (evals[0], evals[-1]) if evals else (None, None)
        if resumed and "monitor" in resumed:
            self.load_state_dict(resumed["monitor"])
        self.signals = StopSignals()
        self.progress = Progress(cfg.log.progress, cfg.train.steps, self.step)
        self._t0 = time.perf_counter()

    # ------------------------------------------------------------------ the run's life

    def __enter__(self) -> Monitor:
        self.signals.__enter__()
        write_status(self.run_dir, "running", self.step, self.cfg.train.steps)
        return self

    def start(self, facts: dict[str, str], eval_tasks: list[tuple[int, str | None]]) -> None:
        """Say where the run is and what it is made of; a fresh run records its evaluation tasks."""
        self.progress.write(header(self.run_dir, facts, self.resumed_at))
        if self.resumed_at is None:
            self._append_tasks(0, "eval", eval_tasks)

    @property
    def evaluated_at_start(self) -> bool:
        """Whether the logs already hold the step-0 evaluation (a resumed run does not repeat it)."""
        return self.first_eval is not None and self.first_eval["step"] == 0

    @property
    def may_roll_back(self) -> bool:
        """Whether any alert is configured to roll back (then the run needs a checkpoint from before the first alert)."""
        m = self.cfg.monitor
        return "rollback" in (m.on_alert, *m.actions.values())

    @property
    def stop_requested(self) -> bool:
        """A SIGTERM / SIGINT asked the run to stop (the loop checkpoints and stops after the step in flight)."""
        return self.signals.requested is not None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Write how the run ended (``status.json``), the report (unless aborted) and the summary."""
        self.signals.__exit__(kind, exc, tb)
        self.progress.close()
        state, message = self._ending(kind, exc)
        write_status(self.run_dir, state, self.step, self.cfg.train.steps, message)
        lines = [f"{state}: {message}"] if message else [state]
        lines.append(held_out_line(self.first_eval, self.last_eval))
        lines.append(f"wall time {duration(time.perf_counter() - self._t0)}")
        if self.cfg.log.report and state != "aborted":
            lines.append(self._write_report())
        self.progress.write("\n".join(lines))
        self.logger.close()

    # ------------------------------------------------------------------ every step

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.logger.log(step, metrics)
        self._remember_eval(step, metrics)

    def record_tasks(self, step: int, tasks: list[tuple[int, str | None]]) -> None:
        """Append the step's training tasks (seed, task key) to ``task_keys.jsonl``."""
        self._append_tasks(step, "train", tasks)

    def after_step(self, step: int, metrics: dict[str, float], groups: list[TrajectoryGroup], advantages: Advantages,
                   samples: list[TrainSample]) -> Action:
        """Log the step's metrics, record its trajectories, run the detectors; returns what the loop must do."""
        self.step = step
        metrics["monitor/rollbacks"] = float(self.rollbacks)
        self.log(step, metrics)
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
        if action == "stop":
            self._stop_reason = f"alert {', '.join(a.name for a in alerts)} at step {step}"
        if self.stop_requested:
            action, self._stop_reason = "stop", f"{self.signals.requested} after step {step}"
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
        self.last_checkpoint = checkpoint
        if not self.alerted:
            self.rollback_target = checkpoint

    def diverged(self, step: int, metrics: dict[str, float], what: str) -> TrainingDiverged:
        """The step-``step`` update broke the model (``what``: a non-finite gradient or weights): log it, alert, and
        return the error that stops the run (no checkpoint is written after it)."""
        self.step = step
        self.log(step, metrics)
        kept = f"the last good checkpoint is {self.last_checkpoint}" if self.last_checkpoint else "no checkpoint was written"
        message = f"step {step} produced {what}; the run stopped and {kept}. Lower train.lr (or use model.dtype=float32)"
        self._append_alert({"step": step, "name": "non_finite_update", "message": message, "evidence": {"what": what}})
        return TrainingDiverged(message)

    # ------------------------------------------------------------------ checkpointed state

    def state_dict(self) -> dict[str, Any]:
        """Detector windows, rollback counter and target: what a resumed run needs to act as this one would."""
        return {"rollbacks": self.rollbacks, "alerted": self.alerted,
                "rollback_target": self.rollback_target.name if self.rollback_target else None,
                "detectors": {d.name: d.state_dict() for d in self.detectors}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rollbacks, self.alerted = state["rollbacks"], state["alerted"]
        target = state["rollback_target"]
        self.rollback_target = self.run_dir / "checkpoints" / target if target else None
        for d in self.detectors:
            if d.name in state["detectors"]:
                d.load_state_dict(state["detectors"][d.name])

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

    def _remember_eval(self, step: int, metrics: dict[str, float]) -> None:
        if "eval/success_rate" in metrics:
            row = {"step": step, **{k: v for k, v in metrics.items() if k.startswith("eval/")}}
            self.first_eval = self.first_eval or row
            self.last_eval = row

    def _ending(self, kind: type[BaseException] | None, exc: BaseException | None) -> tuple[str, str]:
        """``status.json``'s state and message for how the run is leaving."""
        resume = f"resume with `turnrl train --resume {self.run_dir}`"
        if kind is not None and issubclass(kind, KeyboardInterrupt):
            return "aborted", f"at step {self.step}; the last checkpoint is intact, {resume}"
        if kind is not None:
            return "failed", f"{exc}" if isinstance(exc, TrainingDiverged) else f"{kind.__name__}: {exc}"
        if self.step >= self.cfg.train.steps:
            return "finished", f"{self.step} step{'s' if self.step != 1 else ''}"
        bar, reached = self.cfg.eval.stop_at_success, (self.last_eval or {}).get("eval/success_rate", 0.0)
        if 0 < bar <= reached and self.last_eval["step"] == self.step:
            return "finished", f"{self.step} steps: held-out success {reached:.3f} reached eval.stop_at_success={bar:g}"
        reason = self._stop_reason or (f"{self.signals.requested} before step {self.step + 1}" if self.stop_requested
                                       else f"train.max_minutes at step {self.step}")
        return "stopped", f"{reason}; {resume}"

    def _write_report(self) -> str:
        from turnrl.monitor.report import write_report

        try:
            return f"report: {write_report(self.run_dir)}"
        except Exception as e:  # noqa: BLE001 - the checkpoint and metrics are already on disk
            return f"could not write {self.run_dir / 'report.html'} ({type(e).__name__}: {e}); try `turnrl report {self.run_dir}`"

    def _append_tasks(self, step: int, split: str, tasks: list[tuple[int, str | None]]) -> None:
        row = {"step": step, "split": split, "tasks": [{"seed": seed, "key": key} for seed, key in tasks]}
        append_jsonl(self.run_dir / "task_keys.jsonl", [row])

    def _append_alert(self, row: dict) -> None:
        append_jsonl(self.run_dir / "alerts.jsonl", [row])


def _sinks(run_dir: Path, cfg: Config, purge_step: int | None) -> list:
    """The configured sinks; ``purge_step``: TensorBoard hides the events of later steps a resumed run writes again."""
    log = cfg.log
    sinks: list = [JsonlSink(run_dir / "metrics.jsonl")]
    if log.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tb", purge_step))
    if log.wandb:
        sinks.append(WandbSink(run_dir, log.wandb_project, cfg.model_dump(mode="json")))
    if log.mlflow:
        sinks.append(MlflowSink(run_dir, log.mlflow_tracking_uri, log.mlflow_experiment, cfg.model_dump(mode="json")))
    return sinks
