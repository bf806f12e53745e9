"""Generation backends behind one protocol (see :mod:`turnrl.engines.base`), built by :func:`make_engine`."""

from turnrl.engines.base import Completion, Engine, SamplingParams, SessionEngine
from turnrl.engines.factory import make_engine
from turnrl.engines.hf import HFEngine
from turnrl.engines.openai_compat import OpenAICompatEngine
from turnrl.engines.vllm_engine import VLLMEngine  # imports vllm only when constructed

__all__ = ["Completion", "Engine", "HFEngine", "OpenAICompatEngine", "SamplingParams", "SessionEngine", "VLLMEngine",
           "make_engine"]
