"""RMSNorm and the SwiGLU MLP as autograd functions that keep less for the backward pass.

Autograd keeps whatever each small op needs for its own backward. Summed over one of SmolLM2-135M's decoder layers
in fp32 (tests/test_lean_layers.py counts it), that is about 11,200 floats per position:

- RMSNorm (``weight * (x * rsqrt(mean(x^2) + eps))``): the input for ``pow``, the normalised input for the weight's
  product, and the output, which the next projection keeps anyway: 3 x hidden, twice a layer;
- the MLP (``down(silu(gate(x)) * up(x))``): ``gate(x)`` for ``silu``, ``silu(gate(x))`` and ``up(x)`` for the
  product, and the product for ``down``'s weight gradient: 4 x intermediate.

:class:`LeanRMSNorm` keeps the input and one reciprocal norm per row and recomputes the normalised input in its
backward; :class:`LeanMLP` keeps ``gate(x)`` and ``up(x)`` and recomputes ``silu(gate(x)) * up(x)`` (elementwise,
cheap next to the three matmuls) where the backward needs it. A layer then keeps about 6,900 floats per position,
0.62x (the default recipe's activation memory, which grows with ``train.micro_batch_tokens``, falls by as much).

Exactness: the forward runs the same ops in the same order as transformers' modules, so outputs (and the logprobs the
learner compares with the engine's) are bit-for-bit the same; the backward computes the same formulas in a different
order, so gradients agree to rounding (4e-6 relative on the default model in fp32; tested to 1e-5). Under autocast,
with biases or with a LoRA-wrapped ``down_proj``, the MLP keeps the product for ``down_proj`` (and still not
``silu(gate(x))``).

The token embedding (:class:`LeanEmbedding`) keeps no dense gradient of its own: autograd's embedding backward
allocates a zero matrix of the embedding's size (49,152 x 576 floats, 113 MB on SmolLM2), adds the batch's rows into
it and, when the matrix is also the LM head (tied), adds it to the head's gradient into another fresh matrix before
``.grad`` gets it, once per micro-batch (12% of a full fine-tuning update of 48 default-recipe samples, measured with
torch's profiler). :class:`LeanEmbedding` adds the rows straight into the weight's ``.grad`` (``index_add_``, the
rows the batch used only). The gradient is the same sum in another order (to rounding); it lands in ``.grad`` before
the weight's own accumulation runs, so hooks on that (data-parallel reducers) see the whole of it. It is used where
the weight trains and the lookup is a plain one (no ``max_norm``, ``scale_grad_by_freq`` or ``sparse``); backward
passes that take gradients functionally (``torch.autograd.grad``) would miss it, and turnrl runs none through the
embedding.

Under bf16 autocast every trained ``nn.Linear`` (:class:`LeanLinear`, the same module with its class changed) keeps
its fp32 weight for the backward rather than the bf16 copy autocast made of it, and casts it again there
(:class:`_CastLinear`): a micro-batch then holds no copy of the weights, nor does the update's shared prefix, whose
graph lives until the update's end. Outputs are bit-for-bit autocast's, and so are the gradients, except that a
weight used several times under one autocast region gets its uses' gradients added in fp32 where autocast adds them
in bf16 (closer to the exact sum).

Only the modules whose forward is known to be exactly this are replaced (:data:`NORMS`, :data:`MLPS`: Llama,
Mistral, Qwen2, Qwen3); others (Gemma's ``1 + weight`` norm, a GELU MLP) keep transformers' own. The replacements
hold the same parameters under the same names, so state dicts, checkpoints and the engines' weight reads are
unchanged. Models turnrl loads (:func:`turnrl.models.load_model`, :func:`turnrl.models.tiny_model`) use them; call
:func:`use_lean_layers` on a model built elsewhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})
MLPS = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"})
SILU = frozenset({"SiLU", "SiLUActivation"})


class _RMSNorm(torch.autograd.Function):
    """``weight * (x * rsqrt(mean(x^2, -1) + eps))`` in fp32, cast back to ``x``'s dtype before the weight's product
    (transformers' order). Saves ``x`` and ``r = rsqrt(...)`` (one float per row)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.to(torch.float32)
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, r)
        return weight * (xf * r).to(x.dtype)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight, r = ctx.saved_tensors
        xhat = x.to(torch.float32) * r
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (dy * xhat.to(x.dtype)).reshape(-1, dy.shape[-1]).sum(0).to(weight.dtype)
        dx = None
        if ctx.needs_input_grad[0]:
            g = (dy * weight).to(torch.float32)  # d loss / d xhat
            dx = (r * (g - xhat * (g * xhat).mean(-1, keepdim=True))).to(x.dtype)
        return dx, dw, None


def _swiglu_grads(dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor, sg: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The gradients of ``silu(g) * u`` with respect to ``g`` and ``u``, given that product's gradient ``dh`` and
    ``sg = silu(g)``."""
    return torch.ops.aten.silu_backward(dh * u, g), dh * sg


class _SwiGLUDown(torch.autograd.Function):
    """``silu(g) * u @ w.T``: saves ``g``, ``u`` and ``w`` (not the product, which the backward recomputes)."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(g, u, w)
        return F.linear(F.silu(g) * u, w)

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        g, u, w = ctx.saved_tensors
        sg = F.silu(g)
        dw = None
        if ctx.needs_input_grad[2]:
            dw = dout.reshape(-1, dout.shape[-1]).t() @ (sg * u).reshape(-1, g.shape[-1])
        return (*_swiglu_grads(dout @ w, g, u, sg), dw)


class _SwiGLU(torch.autograd.Function):
    """``silu(g) * u``: saves ``g`` and ``u``, not ``silu(g)``."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(g, u)
        return F.silu(g) * u

    @staticmethod
    def backward(ctx, dh: torch.Tensor):
        g, u = ctx.saved_tensors
        return _swiglu_grads(dh, g, u, F.silu(g))


class _CastLinear(torch.autograd.Function):
    """``F.linear`` in a lower precision (autocast's bf16 linear), keeping the parameter, not its low-precision copy.

    Autocast casts a trained weight for each forward and autograd keeps that copy until the layer's backward: a second
    copy of every weight per micro-batch in flight, and one more for the update's shared prefix, whose backward runs
    last. This saves the fp32 parameter itself (held anyway) and casts it again in the backward. The products are
    autocast's, in its order (``dx = dy W``, ``dW = dy^T x``, each in the low dtype, cast back), so the outputs are
    autocast's and so is the gradient of a weight used once under one autocast region, bit for bit. A weight used
    several times in one region (the learner's prompt groups within a micro-batch) differs: autocast casts it once,
    so autograd adds the uses' bf16 gradients in bf16 before the cast; here each use's gradient is cast, then added
    in fp32, which is closer to the exact sum (tested)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        low = x.to(dtype)
        ctx.save_for_backward(low, weight)
        ctx.x_dtype, ctx.has_bias = x.dtype, bias is not None
        return F.linear(low, weight.to(dtype), None if bias is None else bias.to(dtype))  # autocast has nothing to cast

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        low, weight = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = dy2.mm(weight.to(dy.dtype)).view(*dy.shape[:-1], weight.shape[1]).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            dw = dy2.t().mm(low.reshape(-1, low.shape[-1])).to(weight.dtype)  # in the weight's layout
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0).to(weight.dtype)
        return dx, dw, db, None


class LeanLinear(nn.Linear):
    """``nn.Linear`` whose trained weight, under autocast, goes through :class:`_CastLinear`; otherwise (fp32, no
    gradient, a frozen weight) its forward is ``F.linear``'s."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        if (torch.is_grad_enabled() and self.weight.requires_grad and device in ("cpu", "cuda")
                and torch.is_autocast_enabled(device)):
            return _CastLinear.apply(x, self.weight, self.bias, torch.get_autocast_dtype(device))
        return super().forward(x)


class _EmbeddingIntoGrad(torch.autograd.Function):
    """``weight[ids]`` whose backward adds the rows' gradients into ``weight.grad`` in place and returns none."""

    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor, padding_idx: int | None) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx = weight, padding_idx
        return F.embedding(ids, weight.detach(), padding_idx)

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        (ids,) = ctx.saved_tensors
        weight = ctx.weight
        rows, grads = ids.reshape(-1), dout.reshape(-1, dout.shape[-1])
        if ctx.padding_idx is not None:  # the padding row gets no gradient (F.embedding's rule)
            keep = rows != ctx.padding_idx
            rows, grads = rows[keep], grads[keep]
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        weight.grad.index_add_(0, rows, grads.to(weight.grad.dtype))
        return None, None, None


def _autocast() -> bool:
    return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")


class LeanRMSNorm(nn.Module):
    """transformers' Llama-family RMSNorm (the same ``weight`` and ``variance_epsilon``), through :class:`_RMSNorm`."""

    def __init__(self, weight: nn.Parameter, eps: float) -> None:
        super().__init__()
        self.weight = weight
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNorm.apply(x, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


class LeanMLP(nn.Module):
    """transformers' Llama-family MLP (the same ``gate_proj``, ``up_proj``, ``down_proj``), through
    :class:`_SwiGLUDown` when ``down_proj`` is a plain bias-free ``nn.Linear`` outside autocast, else
    :class:`_SwiGLU` and ``down_proj`` itself (a LoRA layer, a bias)."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.hidden_size, self.intermediate_size = mlp.hidden_size, mlp.intermediate_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_proj(x), self.up_proj(x)
        if not torch.is_grad_enabled():
            return self.down_proj(F.silu(g) * u)
        down = self.down_proj
        if type(down) in (nn.Linear, LeanLinear) and down.bias is None and not _autocast():
            return _SwiGLUDown.apply(g, u, down.weight)
        return down(_SwiGLU.apply(g, u))


class LeanEmbedding(nn.Embedding):
    """``nn.Embedding`` whose backward adds into ``weight.grad`` in place (:class:`_EmbeddingIntoGrad`) when the
    weight trains; its forward is ``F.embedding``'s."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            return _EmbeddingIntoGrad.apply(ids, self.weight, self.padding_idx)
        return super().forward(ids)


def use_lean_layers(model: nn.Module) -> nn.Module:
    """Replace ``model``'s Llama-family RMSNorms and SiLU MLPs with :class:`LeanRMSNorm` and :class:`LeanMLP`
    (same parameters, same names) and make its plain ``nn.Embedding`` lookups :class:`LeanEmbedding` and its plain
    ``nn.Linear`` layers :class:`LeanLinear` (the same modules, their class changed); returns ``model``. Other
    modules are left as they are."""
    for module in model.modules():
        if type(module) is nn.Embedding and module.max_norm is None and not module.scale_grad_by_freq and not module.sparse:
            module.__class__ = LeanEmbedding
        elif type(module) is nn.Linear:
            module.__class__ = LeanLinear
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            kind = type(child).__name__
            if kind in NORMS:
                setattr(parent, name, LeanRMSNorm(child.weight, child.variance_epsilon))
            elif kind in MLPS and type(getattr(child, "act_fn", None)).__name__ in SILU:
                setattr(parent, name, LeanMLP(child))
    return model
