"""Generation backends behind one protocol (see :mod:`turnrl.engines.base`)."""

from turnrl.engines.base import Completion, Engine, SamplingParams
from turnrl.engines.hf import HFEngine
from turnrl.engines.openai_compat import OpenAICompatEngine
from turnrl.engines.vllm_engine import VLLMEngine  # imports vllm only when constructed

__all__ = ["Completion", "Engine", "HFEngine", "OpenAICompatEngine", "SamplingParams", "VLLMEngine"]
