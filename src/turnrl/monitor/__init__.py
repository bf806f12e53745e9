from turnrl.monitor.sinks import JsonlSink, MetricLogger, TensorBoardSink

__all__ = ["JsonlSink", "MetricLogger", "TensorBoardSink"]
