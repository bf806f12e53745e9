"""Generation backends behind one protocol (see :mod:`turnrl.engines.base`)."""

from turnrl.engines.base import Completion, Engine, SamplingParams
from turnrl.engines.hf import HFEngine

__all__ = ["Completion", "Engine", "HFEngine", "SamplingParams"]
