"""Watching a run: metric sinks, trajectory records, pathology detectors and their actions, the run's status and
stop signals, what it prints (:class:`turnrl.monitor.monitor.Monitor`), ``turnrl watch`` and ``turnrl report``.

Kept light on purpose: ``turnrl watch`` and ``turnrl report`` import this package without torch.
"""

from turnrl.monitor.sinks import JsonlSink, MetricLogger, MlflowSink, TensorBoardSink, WandbSink

__all__ = ["JsonlSink", "MetricLogger", "MlflowSink", "TensorBoardSink", "WandbSink"]
