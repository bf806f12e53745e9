from turnrl.monitor.sinks import JsonlSink, MetricLogger, MlflowSink, TensorBoardSink, WandbSink

__all__ = ["JsonlSink", "MetricLogger", "MlflowSink", "TensorBoardSink", "WandbSink"]
