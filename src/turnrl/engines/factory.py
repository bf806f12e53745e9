"""One place that builds a rollout engine by name: ``auto``, ``hf``, ``native``, ``vllm`` or ``openai``.

Callers turn their config into these arguments; this module knows nothing of configs (engines sit below the
layers that read them). The native and vLLM backends are imported only when asked for.
"""

from __future__ import annotations

import sys
from typing import Any

from turnrl.engines.base import Engine
from turnrl.engines.hf import HFEngine
from turnrl.engines.openai_compat import OpenAICompatEngine

KINDS = ("auto", "hf", "native", "vllm", "openai")


def make_engine(
    kind: str,
    model=None,
    tokenizer=None,
    *,
    bf16: bool = True,
    seed: int = 0,
    max_slots: int = 64,
    max_len: int = 2048,
    model_path: str | None = None,
    threads: int | None = None,
    **options: Any,
) -> Engine:
    """The ``kind`` engine, sampling from ``model`` (the learner's module; None for an eval-only remote engine).

    - ``auto``: the native engine where it runs the model (the Llama family, the default model among them: 2-5x
      the HF engine's tokens/s in bench/RESULTS.md), else the HF engine, saying so on stderr.
    - ``native``: :class:`~turnrl.engines.native.NativeEngine` (bf16 or fp32 weights and cache, ``max_slots``
      resident sequences of up to ``max_len`` tokens); raises
      :class:`~turnrl.engines.native.UnsupportedModelError` for other models.
    - ``hf``: :class:`~turnrl.engines.hf.HFEngine`, under bf16 autocast if ``bf16``.
    - ``vllm``: :class:`~turnrl.engines.vllm_engine.VLLMEngine` serving ``model_path``; with a ``model`` its
      weights are synced from it (training), without one it serves ``model_path`` as is (evaluation).
    - ``openai``: :class:`~turnrl.engines.openai_compat.OpenAICompatEngine`; ``options`` must hold ``base_url``
      and ``api_model`` (the id the server serves), the rest are its keyword arguments (``endpoint``,
      ``api_key``, ``vllm_extensions``, ``require_logprobs``, ...).

    ``threads`` caps the native engine's torch threads (``train.threads``; None: this machine's CPUs).
    ``seed`` seeds sampling in every backend. ``options`` are for ``openai`` only; an unknown ``kind`` or options
    given to another kind raise ``ValueError``.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown engine kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    if options and kind != "openai":
        raise ValueError(f"engine kind {kind!r} takes no options, got {sorted(options)}")
    if kind in ("auto", "native"):
        from turnrl.engines.native import NativeEngine, UnsupportedModelError

        try:
            return NativeEngine(model, tokenizer, dtype="bf16" if bf16 else "fp32", max_slots=max_slots,
                                max_len=max_len, seed=seed, threads=threads)
        except UnsupportedModelError as e:
            if kind == "native":
                raise
            print(f"rollout.engine=auto: {e}; generating with the HF engine", file=sys.stderr)
    if kind == "vllm":
        return _vllm_engine(model, model_path, seed)
    if kind == "openai":
        return _openai_engine(tokenizer, seed, options)
    return HFEngine(model, tokenizer, autocast_bf16=bf16, seed=seed)


def _vllm_engine(model, model_path: str | None, seed: int) -> Engine:
    """vLLM serving ``model_path``, synced from the learner's ``model`` when there is one."""
    from turnrl.engines.vllm_engine import VLLMEngine

    if model is None:
        return VLLMEngine(model_path, seed=seed)
    from turnrl.models import resolve_model_path

    return VLLMEngine(str(resolve_model_path(model_path)), learner_model=model, seed=seed)


def _openai_engine(tokenizer, seed: int, options: dict[str, Any]) -> Engine:
    """A remote OpenAI-compatible server: ``options`` holds ``base_url``, ``api_model`` and engine keywords."""
    rest = dict(options)
    try:
        base_url, api_model = rest.pop("base_url"), rest.pop("api_model")
    except KeyError as e:
        raise ValueError(f"engine kind 'openai' needs base_url= and api_model= options; missing {e}") from None
    return OpenAICompatEngine(base_url, api_model, tokenizer, seed=seed, **rest)
