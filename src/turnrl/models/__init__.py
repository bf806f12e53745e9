"""Causal LMs as turnrl runs them: loading (the embedded default, local HF directories, tiny test models) and
the shared-prefix forward pass that both the engines and the learner use (:mod:`turnrl.models.prefix`)."""

from turnrl.models.loading import (
    DEFAULT_MODEL,
    ModelNotFoundError,
    TinyModelSpec,
    cache_dir,
    default_model_dir,
    default_tokenizer_dir,
    frozen_copy,
    load_model,
    load_tokenizer,
    resolve_model_path,
    tiny_model,
)
from turnrl.models.precision import precision_note, use_bf16

__all__ = [
    "DEFAULT_MODEL",
    "ModelNotFoundError",
    "TinyModelSpec",
    "cache_dir",
    "default_model_dir",
    "default_tokenizer_dir",
    "frozen_copy",
    "load_model",
    "load_tokenizer",
    "precision_note",
    "resolve_model_path",
    "tiny_model",
    "use_bf16",
]
