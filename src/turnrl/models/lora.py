"""LoRA adapters on a causal LM, through peft, at the level of the model (RL and supervised training alike).

LoRA (Hu et al. 2021, arXiv:2106.09685) freezes each targeted linear layer's weight ``W`` and trains a low-rank
update: the layer computes ``W x + s * B (A dropout(x))`` with ``A`` (r x in) random, ``B`` (out x r) zero at the
start, and ``s = alpha / r`` (``alpha / sqrt(r)`` with rank-stabilised LoRA). Only ``A`` and ``B`` train; at
initialisation the model is exactly the base model.

The adapters are injected in place (peft's ``inject_adapter_in_model``): the model keeps its own class, so every
part that runs a causal LM (the engines, the learner's shared-prefix forward, the critic) runs it unchanged. What this
module adds around peft:

- :func:`add_lora` / :func:`load_lora`: fresh adapters, or those of an adapter directory, with a check that every
  target names a linear layer of the model (:class:`LoraError` listing the ones it has); each adapted layer then runs
  :func:`_fused_forward` (fewer passes over the output than peft's, the frozen weight cast to bf16 once);
- :func:`adapter_disabled`: the base model, for the KL reference, without a second copy (what peft's
  ``PeftModel.disable_adapter()`` does, for a model without that wrapper);
- :func:`merged_view`: the model as the native engine reads its weights, each adapted layer reading as one matrix
  ``W + s B A``, computed when read, so no second full copy of the weights exists at any time;
- :func:`save_adapter` / :func:`load_adapter_weights`: the adapter alone, in peft's own directory layout
  (``adapter_config.json``, ``adapter_model.safetensors``), so ``PeftModel.from_pretrained(base, directory)`` loads it.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: The prefix PeftModel.save_pretrained gives tensor names; this model has no PeftModel wrapper, so it is added on save
#: and taken off on load, and the files stay interchangeable with peft's.
PEFT_PREFIX = "base_model.model."


class LoraError(ValueError):
    """Adapters that cannot be built or loaded; the message names the cause and the fix."""


def is_lora(model) -> bool:
    """Whether ``model`` carries LoRA adapters (peft records its config on the model when it injects them)."""
    return bool(getattr(model, "peft_config", None))


def add_lora(model, *, rank: int, alpha: float, target_modules: Sequence[str], dropout: float = 0.0,
             use_rslora: bool = False, base: str | None = None):
    """Inject fresh adapters into ``model`` in place (its base weights frozen) and return it.

    The arguments are the ``lora`` config section's (:class:`turnrl.config.lora.LoraConfig` documents them);
    ``base`` is the model path the adapter directory will name as its base (``base_model_name_or_path``).
    Raises :class:`LoraError` when a target is not a linear layer of the model.
    """
    from peft import LoraConfig as PeftLoraConfig

    peft_cfg = PeftLoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(target_modules),
                              use_rslora=use_rslora, bias="none", base_model_name_or_path=base)
    return _inject(model, peft_cfg)


def load_lora(model, directory: str | Path):
    """Inject the adapters of an adapter ``directory`` (their config and weights) into ``model`` and return it.

    The adapters stay trainable. Raises :class:`LoraError` when the directory is not a LoRA adapter or does not fit
    the model.
    """
    from peft import PeftConfig

    directory = Path(directory)
    peft_cfg = PeftConfig.from_pretrained(directory)
    if peft_cfg.peft_type != "LORA":
        raise LoraError(f"{directory} holds a {peft_cfg.peft_type} adapter; turnrl trains and loads LoRA adapters only")
    _inject(model, peft_cfg)
    try:
        missing, unexpected = load_adapter_weights(model, directory / ADAPTER_WEIGHTS)
    except (OSError, RuntimeError) as e:  # a missing, damaged or wrongly shaped file
        raise LoraError(f"{directory / ADAPTER_WEIGHTS}: cannot be loaded ({str(e).strip().splitlines()[0][:200]})") from None
    if missing or unexpected:
        raise LoraError(f"{directory / ADAPTER_WEIGHTS}: {len(missing)} adapter tensors missing and {len(unexpected)} "
                        "unexpected: it is not an adapter of this model")
    return model


def _inject(model, peft_cfg):
    from peft import inject_adapter_in_model
    from peft.tuners.lora import Linear

    if not isinstance(peft_cfg.target_modules, str):  # a regex (peft's adapter files allow one) is peft's to match
        _check_targets(model, sorted(peft_cfg.target_modules))
    inject_adapter_in_model(peft_cfg, model)
    for module in model.modules():
        if type(module) is Linear:
            module.__class__ = _fused_linear_class()
    return model


@functools.cache
def _fused_linear_class() -> type:
    """peft's LoRA ``Linear`` with :func:`_fused_forward` as its forward (built on first use: peft is optional)."""
    from peft.tuners.lora import Linear

    return type("FusedLoraLinear", (Linear,), {"forward": _fused_forward, "peft_forward": Linear.forward,
                                               "__module__": __name__})


def _fused_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``W x + s B (A x)`` as one base matmul, one rank-r matmul and one in-place ``addmm_``, in the input's dtype.

    peft's own forward computes the same sum in more passes over the output: under bf16 autocast it casts the
    input to fp32 and autocast casts it back for ``A``, then ``B``'s output is scaled and added as two more full-size
    tensors, and autocast casts the frozen ``W`` anew at every call (it caches only trainable leaves). Here ``W``'s
    bf16 copy is made once (:func:`_bf16_weight`) and the adapter's product is added into the base output by the
    matmul itself. The same sum up to rounding (the scale applied inside the product; tested against peft's forward).
    Anything else (dropout, several adapters, merged or disabled adapters, DoRA, peft's extra arguments) runs
    peft's forward.
    """
    names = self.active_adapters
    if (args or kwargs or self.disable_adapters or self.merged or len(names) != 1 or names[0] not in self.lora_A
            or names[0] in self.lora_variant or not isinstance(self.lora_dropout[names[0]], torch.nn.Identity)):
        return self.peft_forward(x, *args, **kwargs)
    name = names[0]
    base = self.base_layer
    weight = base.weight
    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
        x = x.to(torch.bfloat16)
        if not weight.requires_grad:
            weight = _bf16_weight(base)
    rows = x.reshape(-1, x.shape[-1])  # 2-D, so the in-place add below is on the matmul's own output, not a view
    y = F.linear(rows, weight, base.bias)
    xa = F.linear(rows, self.lora_A[name].weight)
    y.addmm_(xa, self.lora_B[name].weight.to(y.dtype).t(), alpha=self.scaling[name])
    return y.view(*x.shape[:-1], y.shape[-1])


def _bf16_weight(linear: torch.nn.Linear) -> torch.Tensor:
    """A frozen linear layer's weight in bf16, made once and kept on the layer (remade if the weight is replaced or
    changed in place, e.g. by loading a checkpoint). The rounding autocast would apply at each call, done once."""
    weight = linear.weight
    key = (weight.data_ptr(), weight._version, weight.dtype, weight.shape)
    cached = getattr(linear, "_turnrl_bf16", None)
    if cached is None or cached[0] != key:
        with torch.no_grad():
            cached = (key, weight.detach().to(torch.bfloat16))
        linear._turnrl_bf16 = cached
    return cached[1]


def _check_targets(model, targets: list[str]) -> None:
    """:class:`LoraError` unless every target is the last name part of a linear layer of ``model``."""
    linear = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    for target in targets:
        if target not in linear:
            close = difflib.get_close_matches(target, linear, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise LoraError(f"lora.target_modules: {target!r} is not a linear layer of this model "
                            f"({type(model).__name__}).{hint} Its linear layers: {', '.join(linear)}")


# ---------------------------------------------------------------------------------------------- adapter directories


def split_adapter_path(path: str) -> tuple[str, Path | None]:
    """``(base model path, adapter directory)`` for a ``model.path`` that names an adapter directory (a LoRA run's
    checkpoint ``model/``), else ``(path, None)``. Raises :class:`LoraError` for an adapter that does not name its
    base."""
    directory = Path(path).expanduser()
    config = directory / ADAPTER_CONFIG
    if not config.is_file():
        return path, None
    base = json.loads(config.read_text()).get("base_model_name_or_path")
    if not base:
        raise LoraError(f"{config} names no base model (base_model_name_or_path): set it to the base model's path "
                        "('default' for the embedded SmolLM2-135M-Instruct)")
    return base, directory


def save_adapter(model, directory: Path) -> None:
    """Write ``model``'s adapter (only its tensors and its config) to ``directory`` in peft's layout."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = get_peft_model_state_dict(model, save_embedding_layers=False)
    state = {PEFT_PREFIX + k: v.detach().contiguous() for k, v in tensors.items()}
    model.peft_config["default"].save_pretrained(directory)
    save_file(state, directory / ADAPTER_WEIGHTS, metadata={"format": "pt"})


def load_adapter_weights(model, path: Path) -> tuple[list[str], list[str]]:
    """Load an adapter file into ``model``'s adapters; returns ``(missing, unexpected)`` tensor names and loads nothing
    unless both are empty (as :func:`safetensors.torch.load_model` reports them). The tensors are copied into the
    existing parameters, so an optimizer holding them keeps them."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    state = {k.removeprefix(PEFT_PREFIX): v for k, v in load_file(path).items()}
    expected = set(get_peft_model_state_dict(model, save_embedding_layers=False))
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if not missing and not unexpected:
        set_peft_model_state_dict(model, state)
    return missing, unexpected


def trainable_parameters(model) -> int:
    """How many parameters the optimizer trains (the adapters' only, on a LoRA model)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# ---------------------------------------------------------------------------------------------- the base, merged weights


def _lora_layers(model) -> list[Any]:
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def adapter_disabled(model) -> Iterator[None]:
    """Inside the block ``model`` computes as its base model (every adapter off); a model without LoRA as it is.

    The reference policy for KL on a LoRA run: the base weights, with no second copy of the model.
    """
    layers = _lora_layers(model) if is_lora(model) else []
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def merged_view(model):
    """``model`` as an engine that copies weights reads it: on a LoRA model, a read-only view with the same
    attribute paths in which each adapted layer's ``weight`` is ``W + s B A`` (a fresh tensor, computed when read:
    one layer's at a time, never a second copy of the whole model) and ``bias`` the base layer's.

    The model itself is not touched: merging in place and unmerging after would not restore ``W`` bit for bit,
    and the base weights are the KL reference. ``named_parameters()`` of the view lists the parameters outside the
    adapted layers (an engine that checks it read every parameter checks those; the adapted layers' base weights and
    adapters are all read through the merged ``weight``). A model without LoRA is returned as it is.
    """
    return _View(model) if is_lora(model) else model


class _View:
    """A module seen through :func:`merged_view`: attributes as the module's, submodules as views of theirs."""

    def __init__(self, module: torch.nn.Module) -> None:
        self._module = module

    def __getattr__(self, name: str):
        return _view_of(getattr(self._module, name))

    def __iter__(self):
        return (_view_of(m) for m in self._module)

    def __getitem__(self, index):
        return _view_of(self._module[index])

    def __call__(self, *args, **kwargs):
        return self._module(*args, **kwargs)

    def get_output_embeddings(self):
        return _view_of(self._module.get_output_embeddings())

    def named_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        adapted = {id(p) for layer in _lora_layers(self._module) for p in layer.parameters()}
        return ((n, p) for n, p in self._module.named_parameters() if id(p) not in adapted)


class _MergedLinear:
    """An adapted linear layer seen through :func:`merged_view`: its effective weight and its bias."""

    def __init__(self, layer) -> None:
        self._layer = layer

    @property
    def weight(self) -> torch.Tensor:
        layer = self._layer
        base = layer.get_base_layer().weight
        if layer.merged or layer.disable_adapters:
            return base
        with torch.no_grad():
            return sum((layer.get_delta_weight(a) for a in layer.active_adapters if a in layer.lora_A), base)

    @property
    def bias(self) -> torch.Tensor | None:
        return self._layer.get_base_layer().bias


def _view_of(value):
    if not isinstance(value, torch.nn.Module):
        return value
    from peft.tuners.lora import LoraLayer

    return _MergedLinear(value) if isinstance(value, LoraLayer) else _View(value)
