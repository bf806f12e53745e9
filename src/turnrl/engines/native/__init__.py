"""The native engine: multi-turn decoding with KV caches that persist across turns, and continuous batching.

Two modules, one concern each:

- :mod:`~turnrl.engines.native.engine`: :class:`NativeEngine`, the engine protocol and the session API
  (``open``/``agenerate``/``close``) over slots of a KV cache: admission, eviction, engine ticks (continuous
  batching), the prefix store, sampling.
- :mod:`~turnrl.engines.native.model`: the model compute it is built on (:class:`LlamaForward`): the Llama
  family's weights copied in (fused, optionally oneDNN-packed), RoPE tables, the KV cache and the batched
  forward pass (attention groups, layers, logits).
"""

from turnrl.engines.native.engine import NativeEngine
from turnrl.engines.native.model import SUPPORTED, LlamaForward, UnsupportedModelError

__all__ = ["SUPPORTED", "LlamaForward", "NativeEngine", "UnsupportedModelError"]
