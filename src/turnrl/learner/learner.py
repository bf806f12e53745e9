"""The learner: TrainSamples -> micro-batched policy-gradient update.

:meth:`Learner.update` runs each micro-batch (:mod:`turnrl.learner.samples`) with the shared prompt prefix
computed once (:mod:`turnrl.models.prefix`), takes logits only at positions that predict a response token,
and accumulates gradients with the *global* loss normaliser, so the gradient does not depend on the
micro-batch split.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from turnrl.config import Config
from turnrl.learner import losses
from turnrl.learner.heap import heap_mmap_threshold_kb, limit_heap_retention, release_free_memory
from turnrl.learner.samples import Batch, build_samples, collate, micro_batches, shared_prefix_len
from turnrl.models.lora import adapter_disabled
from turnrl.models.prefix import BatchPrefix, PrefixCache, additive_mask, deferred, forward, prefix_cache
from turnrl.models.precision import use_bf16
from turnrl.models.recompute import is_checkpointed
from turnrl.types import Advantages, Termination, TrainSample, Trajectory


def response_logits(model, batch: Batch, prompt_grad: bool = True, shared: BatchPrefix | None = None) -> torch.Tensor:
    """Logits at the positions that predict a loss-masked target, packed in row-major order.

    Shape: (N, vocab), N = ``int(batch.mask.sum())``; :func:`unpack` puts per-token values back in
    ``batch.mask``'s (batch, keep - 1) layout. The shared prefix runs once and is broadcast
    (:mod:`turnrl.models.prefix`), and the LM head (a 49k x 576 matmul per position on the default model) runs
    only on these N positions: with ``context: full`` the kept span also holds observation / tool-output
    tokens between turns, and padding. Measured on full-context samples (bench/learner_memory.py): 1.08x
    faster update, 2% less peak memory; activations, not logits, set the memory.

    ``prompt_grad=False`` (``train.prompt_grad``) runs every position before the kept span without autograd
    (:func:`_context_cache`): the logits are the same, the gradient is an approximation. ``shared`` serves the part
    of the prefix the whole update shares (:class:`turnrl.models.prefix.BatchPrefix`).
    """
    parts = _decoder_and_head(model)
    if parts is None:  # a head that is more than a linear layer: take the model's own logits, then select
        out = _kept_forward(model, model, batch, prompt_grad, shared, logits_to_keep=batch.keep)
        return out.logits[:, :-1][batch.mask > 0]
    return parts[1](response_hidden(model, batch, prompt_grad, shared))


def response_hidden(model, batch: Batch, prompt_grad: bool = True, shared: BatchPrefix | None = None) -> torch.Tensor:
    """The decoder's last hidden state at :func:`response_logits`' positions, packed the same way. Shape: (N, hidden).

    The policy's linear LM head maps them to the logits; a value head reads them in the fused critic (``head`` mode).
    """
    parts = _decoder_and_head(model)
    if parts is None:
        raise ValueError(f"{type(model).__name__}'s logits are not a linear head on the decoder's hidden states: "
                         "set algo.fused_value=false")
    out = _kept_forward(model, parts[0], batch, prompt_grad, shared)
    return out.last_hidden_state[:, -batch.keep : -1][batch.mask > 0]  # position t predicts token t+1


def _kept_forward(model, module, batch: Batch, prompt_grad: bool, shared: BatchPrefix | None = None, **kwargs):
    """``module``'s forward over ``batch`` (the shared prefix from ``model``'s cache), with autograd on the kept span.

    With ``prompt_grad`` the whole batch runs with autograd (the exact gradient). Without it, the prefix and every
    column before the kept span run under ``no_grad`` and only the last ``batch.keep`` columns are recorded: their
    queries attend to the context's keys and values as constants, so the gradient ignores the path through them.
    """
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32
    ids, positions, attention = batch.ids, batch.positions, batch.attention
    context = 0 if prompt_grad else ids.shape[1] - batch.keep
    with torch.set_grad_enabled(prompt_grad and torch.is_grad_enabled()):
        cache = (shared and shared.cache(model, batch.prefix)) if batch.prefix else None
        if batch.prefix and cache is None:
            cache = deferred(prefix_cache(model, batch.prefix), model.config)
        if context:
            cache = cache or PrefixCache(config=model.config)
            past = attention.shape[1] - ids.shape[1] + context
            _, cache = forward(module, cache, input_ids=ids[:, :context], position_ids=positions[:, :context],
                               attention_mask=additive_mask(attention[:, :past], context, dtype), use_cache=True,
                               **({"logits_to_keep": 1} if "logits_to_keep" in kwargs else {}))
    if cache is not None:
        cache.freeze()  # a recomputed layer (activation checkpointing) must see the same keys: turnrl.models.recompute
    out, _ = forward(module, cache, input_ids=ids[:, context:], position_ids=positions[:, context:],
                     attention_mask=additive_mask(attention, ids.shape[1] - context, dtype),
                     use_cache=cache is not None, **kwargs)
    return out


def _decoder_and_head(model):
    """``(decoder, lm_head)`` when the causal LM's logits are exactly ``lm_head(decoder(...).last_hidden_state)``."""
    config = getattr(model, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None) not in (None, 1.0):
        return None
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, ValueError, NotImplementedError):
        return None
    if decoder is None or decoder is model or not isinstance(head, torch.nn.Linear):
        return None
    return decoder, head


@functools.cache
def _fused_adamw_supported() -> bool:
    """Whether this torch has a fused AdamW for CPU tensors (torch >= 2.4)."""
    p = torch.zeros(1, requires_grad=True)
    p.grad = torch.zeros(1)
    try:
        torch.optim.AdamW([p], fused=True).step()
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


def _is_distributed(p: torch.Tensor) -> bool:
    """A DTensor (an FSDP shard, :mod:`turnrl.scale.sharded`): its optimizer keeps the default implementation."""
    return hasattr(p, "to_local")


def unpack(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Packed per-loss-token ``values`` (N,) -> ``mask``'s shape, 0 where ``mask`` is 0 (differentiable)."""
    return torch.zeros(mask.shape, dtype=values.dtype).masked_scatter(mask > 0, values)


def packed_logprobs(logits: torch.Tensor, batch: Batch, temperature: float) -> torch.Tensor:
    """log pi(target) at every loss token, from :func:`response_logits`'s packed logits. Shape: (batch, keep - 1)."""
    targets = batch.targets[batch.mask > 0]
    return unpack(losses.token_logprobs(logits[None], targets[None], temperature)[0], batch.mask)


def packed_entropy(logits: torch.Tensor, batch: Batch, temperature: float) -> torch.Tensor:
    """Entropy of the sampling distribution at every loss token. Shape: (batch, keep - 1)."""
    scaled = logits if temperature == 1.0 else logits / temperature
    return unpack(losses.entropy_from_logits(scaled[None])[0], batch.mask)


@dataclass(frozen=True)
class LearnerParams:
    """What :class:`Learner` needs: the optimizer, the policy loss and the micro-batch budget.

    Each field is the config key of the same name (``turnrl train --help-config`` documents them):
    :meth:`from_config` is the one mapping.
    """

    lr: float
    betas: tuple[float, float]
    weight_decay: float
    warmup_steps: int
    grad_clip: float
    micro_batch_tokens: int
    autocast_bf16: bool
    temperature: float  # the sampling temperature: the learner's logprobs are of softmax(logits / temperature)
    ppo_epochs: int
    clip_low: float
    clip_high: float
    dual_clip: float | None
    ratio_level: str
    entropy_coef: float
    kl_coef: float
    kl_type: str
    kl_clamp: float  # k3 / k3+ value clamp to [-c, c] (0 = off), as verl's low_var_kl
    loss_agg: str
    norm_len: float  # seq-mean-token-sum-norm's constant, an episode's budget: env.max_turns * rollout.max_new_tokens
    vf_coef: float
    demo_coef: float = 0.0  # weight of the auxiliary NLL on demonstration samples (losses.demo_nll)
    is_correction: str = "none"  # "none": PPO against the behaviour logprobs; else decoupled PPO (losses.behaviour_weights)
    is_level: str = "token"
    is_cap: float = 2.0
    prompt_grad: bool = True  # False: the context before each micro-batch's kept span runs without autograd
    fused_value: bool = True  # a ``head`` critic's value loss reads the policy pass's hidden states (one pass, not two)
    heap_mmap_threshold_kb: int | str = 0  # train.heap_mmap_threshold_kb (heap_mmap_threshold_kb() resolves "auto")
    group_by_prompt: bool = True  # micro-batches packed per prompt group (samples.prefix_groups)
    prefix_once: bool = True  # the prefix the whole batch shares runs once per update (models.prefix.BatchPrefix)

    @classmethod
    def from_config(cls, cfg: Config) -> "LearnerParams":
        t, a = cfg.train, cfg.algo
        return cls(
            lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay, warmup_steps=t.warmup_steps, grad_clip=t.grad_clip,
            micro_batch_tokens=t.micro_batch_tokens, autocast_bf16=use_bf16(cfg.model.autocast_bf16),
            temperature=cfg.rollout.temperature, ppo_epochs=a.ppo_epochs, clip_low=a.clip_low, clip_high=a.clip_high,
            dual_clip=a.dual_clip, ratio_level=a.ratio_level, entropy_coef=a.entropy_coef, kl_coef=a.kl_coef,
            kl_type=a.kl_type, kl_clamp=a.kl_clamp, loss_agg=a.loss_agg,
            norm_len=float(cfg.env.max_turns * cfg.rollout.max_new_tokens), vf_coef=a.vf_coef, demo_coef=a.demo_coef,
            is_correction=a.is_correction, is_level=a.is_level, is_cap=a.is_cap, prompt_grad=t.prompt_grad,
            fused_value=a.fused_value, heap_mmap_threshold_kb=t.heap_mmap_threshold_kb, group_by_prompt=t.group_by_prompt,
            prefix_once=t.prefix_once,
        )


@dataclass
class _Sums:
    """One epoch's statistics: token-weighted sums (divided by the token count at the end) and extremes (``maxima``:
    the maximum over micro-batches, or the minimum for a key ending in ``_min``)."""

    sums: dict[str, float] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)

    def add(self, k: str, v: float) -> None:
        self.sums[k] = self.sums.get(k, 0.0) + v

    def extreme(self, k: str, v: float) -> None:
        """Fold ``v`` into ``k``'s extreme: a minimum for ``*_min`` keys, else a maximum."""
        if k.endswith("_min"):
            self.maxima[k] = min(self.maxima.get(k, float("inf")), v)
        else:
            self.maxima[k] = max(self.maxima.get(k, float("-inf")), v)


class _FusedValues:
    """The ``head`` critic's value targets at each sample's loss tokens, for a value loss computed on the policy's pass.

    The value of response token k is read at the position that predicts it (:mod:`turnrl.learner.critic`), which is
    where the policy's logits are read, so the value loss can share the policy's forward and backward. The loss is the
    mean clipped value loss over every target position of the batch, as :meth:`Critic.backward_value_loss` computes
    it on a pass of its own; the statistics it logs are summed over one epoch's micro-batches.
    """

    STATS = ("value_loss", "value_clip_frac", "value_error", "value_mean", "return_mean")

    def __init__(self, targets: dict[int, tuple[list[float], list[float], list[float]]], total: int) -> None:
        self.targets = targets  # id(sample) -> (returns, old values, mask), one entry per loss token
        self.total = total
        self.sums = dict.fromkeys(self.STATS, 0.0)

    @classmethod
    def of(cls, samples: Sequence[TrainSample], vb) -> "_FusedValues | None":
        """Targets of ``samples`` from the :class:`~turnrl.learner.critic.ValueBatch` ``vb``; None when some target
        position has no sample (a filtered sample): the critic's own pass then trains on every target."""
        targets, total = {}, 0
        for s in samples:
            turns = range(len(vb.trajectories[s.traj_index].turns)) if s.turn_index < 0 else [s.turn_index]
            ret, old, mask = [], [], []
            for j in turns:
                ret += vb.returns[s.traj_index][j]
                old += vb.old_values[s.traj_index][j]
                mask += [float(m) for m in vb.mask[s.traj_index][j]]
            targets[id(s)] = (ret, old, mask)
            total += int(sum(mask))
        wanted = sum(sum(sum(m) for m in turns) for t, turns in zip(vb.trajectories, vb.mask)
                     if t.termination != Termination.ENV_ERROR)
        return cls(targets, total) if total == wanted else None

    def rows(self, mb: Sequence[TrainSample]) -> "_ValueRows | None":
        """One micro-batch's targets, packed in its loss tokens' row-major order (None when there are none)."""
        if not self.total:
            return None
        ret, old, mask = ([x for s in mb for x in self.targets[id(s)][k]] for k in range(3))
        return _ValueRows(self, torch.tensor(ret), torch.tensor(old), torch.tensor(mask))

    def means(self) -> dict[str, float]:
        """This epoch's statistics (batch means over the target positions), then reset for the next epoch."""
        out, self.sums = self.sums, dict.fromkeys(self.STATS, 0.0)
        return out


@dataclass
class _ValueRows:
    fused: _FusedValues
    returns: torch.Tensor
    old: torch.Tensor
    mask: torch.Tensor

    def loss(self, values: torch.Tensor, clip: float) -> torch.Tensor:
        """This micro-batch's share of the batch's mean clipped value loss (its statistics go to ``fused``)."""
        per, stats = losses.clipped_value_loss(values, self.old, self.returns, self.mask, clip)
        total, n = self.fused.total, float(self.mask.sum())
        loss = per.sum() / total
        sums = self.fused.sums
        sums["value_loss"] += float(loss.detach())
        sums["value_clip_frac"] += stats["value_clip_frac"] * n / total
        sums["value_error"] += stats["value_error"] * n / total
        sums["value_mean"] += float((values.detach() * self.mask).sum()) / total
        sums["return_mean"] += float((self.returns * self.mask).sum()) / total
        return loss


class Learner:
    """Owns the optimizer and turns TrainSamples into one optimizer step per call to :meth:`update`.

    The optimizer holds the parameters that require a gradient: on a LoRA model (:mod:`turnrl.models.lora`) only the
    adapters. ``ref_model`` is the KL reference: a frozen copy, or the policy itself when it carries LoRA adapters
    (the reference is then its base weights, computed with the adapters disabled), or None.
    """

    shares_batch_prefix = True  # False in data-parallel learners (BatchPrefix's backward comes after their sync)

    def __init__(self, model, params: LearnerParams, pad_id: int, ref_model=None, critic=None) -> None:
        self.model = model
        self.params = params
        self.pad_id = pad_id
        self.ref_model = ref_model
        self.critic = critic  # turnrl.learner.critic.Critic or None; a value head joins this optimizer
        groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
        groups += critic.joint_param_groups() if critic is not None else []
        # fused: one kernel per parameter, where the default foreach AdamW allocates temporaries the size of every
        # parameter during the step (0.5 GB on the default model); the same update (tests/test_lean_memory.py)
        self._fused = _fused_adamw_supported() and not any(_is_distributed(p) for g in groups for p in g["params"])
        self.heap_mmap_threshold_kb = heap_mmap_threshold_kb(params.heap_mmap_threshold_kb, is_checkpointed(model))
        limit_heap_retention(self.heap_mmap_threshold_kb)
        self.optimizer = torch.optim.AdamW(groups, lr=params.lr, betas=tuple(params.betas), weight_decay=params.weight_decay,
                                           fused=self._fused or None)
        warm = params.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
        self._proximal: list[torch.Tensor] = []  # this update's proximal logprobs, one per micro-batch, in order
        self._proximal_read = 0  # micro-batches of the current epoch that have read theirs
        self._shared: BatchPrefix | None = None  # the current epoch's batch-wide prefix (_batch_prefix)

    def _autocast(self):
        if self.params.autocast_bf16:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def update(self, samples: Sequence[TrainSample], value_batch=None, demos: Sequence[TrainSample] = ()) -> dict[str, float]:
        """One optimizer step (per PPO epoch) over ``samples``; returns train/* metrics.

        Every micro-batch's loss is normalised by the whole batch's token and sequence counts, so the summed
        gradient does not depend on the split. With a critic, ``value_batch`` (a
        :class:`turnrl.learner.critic.ValueBatch`) adds ``vf_coef`` times the clipped value loss to the same
        step (``head``) or steps the separate value model alongside. With ``params.demo_coef > 0``, ``demos``
        (demonstration samples) add ``demo_coef`` times their token-mean NLL (:func:`losses.demo_nll`) to the same
        step, logged as ``train/demo_nll``.
        """
        demos = demos if self.params.demo_coef > 0 else ()
        if not samples and value_batch is None and not demos:
            return {"train/num_samples": 0.0}
        num_tokens = float(sum(sum(s.loss_mask) for s in samples))
        num_seqs = float(len(samples))
        # Dr.GRPO's constant normaliser counts episodes, so per_step and full layouts give one loss (losses.aggregate)
        episodes = float(len({s.traj_index for s in samples}))
        loss_seqs = episodes if self.params.loss_agg == "seq-mean-token-sum-norm" else num_seqs
        batches = micro_batches(samples, self.params.micro_batch_tokens, self.params.group_by_prompt)
        fused = self._fused_value_targets(samples, value_batch)
        self.model.train()
        self._proximal = []
        for _ in range(self.params.ppo_epochs):
            self._proximal_read = 0
            self.optimizer.zero_grad(set_to_none=True)
            if self.critic is not None:
                self.critic.zero_grad()
            release_free_memory()  # the last gradient, and what collecting the batch left free in the heap
            stats = _Sums()
            self._shared = self._batch_prefix(samples, len(batches))
            for mb in batches:
                self._policy_backward(collate(mb, self.pad_id), num_tokens, loss_seqs, stats, fused and fused.rows(mb))
                release_free_memory()  # the micro-batch's freed activations, before the next one allocates its own
            if self._shared is not None:  # the prefix every micro-batch shared: its gradient, summed over them
                self._shared = self._shared.backward()
            if demos:
                stats.maxima["demo_nll"] = self._demo_backward(demos, self.params.demo_coef)
            if fused:
                stats.maxima.update(fused.means())
            elif self.critic is not None and value_batch is not None:
                with self._autocast():
                    # already batch means; the last epoch's values are logged
                    stats.maxima.update(self.critic.backward_value_loss(value_batch, self.params.vf_coef))
            grad_norm = self._step(stats)
        release_free_memory()
        metrics = {"train/loss": stats.sums.pop("loss", 0.0)}  # 0 when only the critic had something to train on
        metrics.update({f"train/{k}": v / max(num_tokens, 1.0) for k, v in stats.sums.items()})
        metrics.update({f"train/{k}": v for k, v in stats.maxima.items()})
        metrics.update({
            "train/grad_norm": grad_norm,
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/num_samples": num_seqs,
            "train/num_tokens": num_tokens,
            "train/micro_batches": float(len(batches)),
        })
        return metrics

    def _batch_prefix(self, samples: Sequence[TrainSample], num_batches: int) -> BatchPrefix | None:
        """The prefix all ``samples`` share, run once for the update (``train.prefix_once``) if it saves runs of it."""
        n = shared_prefix_len(samples)
        if not (self.params.prefix_once and self.shares_batch_prefix and num_batches > 1 and n >= 16):
            return None
        with self._autocast(), torch.set_grad_enabled(self.params.prompt_grad):
            return BatchPrefix(self.model, samples[0].input_ids[:n])

    def _policy_backward(self, batch: Batch, num_tokens: float, num_seqs: float, stats: _Sums,
                         values: "_ValueRows | None" = None) -> None:
        """Accumulate one micro-batch's policy-loss gradient (PPO-clip, entropy bonus, KL to the reference), plus the
        fused critic's value loss at the same positions when ``values`` holds its targets."""
        p = self.params
        with self._autocast():
            if values:
                hidden = response_hidden(self.model, batch, p.prompt_grad, self._shared)
                logits = self.model.get_output_embeddings()(hidden)
            else:
                logits = response_logits(self.model, batch, p.prompt_grad, self._shared)
            ref_logits = None
            if self.ref_model is not None and p.kl_coef > 0:
                ref_logits = self._reference_logits(batch)
        logp = packed_logprobs(logits, batch, p.temperature)
        old, weights = batch.old_logprobs, None
        if p.is_correction != "none":  # decoupled PPO: clip against the proximal policy, weight against the behaviour
            old = self._proximal_logprobs(logp)
            weights, is_stats = losses.behaviour_weights(old, batch.old_logprobs, batch.mask, mode=p.is_correction,
                                                         level=p.is_level, cap=p.is_cap)
        per_tok, clip_stats = losses.ppo_clip_loss(
            logp, old, batch.advantages, batch.mask, clip_low=p.clip_low, clip_high=p.clip_high,
            dual_clip=p.dual_clip, ratio_level=p.ratio_level,
        )
        if weights is not None:
            per_tok = per_tok * weights
            clip_stats.update(is_stats)
        if p.entropy_coef > 0:  # bonus: minimise -H (the metric below is computed without grad)
            per_tok = per_tok - p.entropy_coef * packed_entropy(logits, batch, p.temperature)
        if ref_logits is not None:
            kl = losses.kl_penalty(logp, packed_logprobs(ref_logits, batch, p.temperature), p.kl_type, p.kl_clamp)
            per_tok = per_tok + p.kl_coef * kl
            stats.add("kl", float((kl.detach() * batch.mask).sum()))
        loss = losses.aggregate(per_tok, batch.mask, p.loss_agg, num_tokens=num_tokens, num_seqs=num_seqs, norm_len=p.norm_len)
        if values:
            value_loss = values.loss(self.critic.head(hidden.float()).squeeze(-1), self.critic.params.value_clip)
            (loss + p.vf_coef * value_loss).backward()
        else:
            loss.backward()
        n = float(batch.mask.sum())
        with torch.no_grad():
            ent = packed_entropy(logits.detach(), batch, p.temperature)
            stats.add("entropy", float((ent * batch.mask).sum()))
            stats.add("logprob", float((logp.detach() * batch.mask).sum()))
            stats.add("behaviour_logprob_diff", float(((logp.detach() - batch.old_logprobs).abs() * batch.mask).sum()))
        stats.add("loss", float(loss.detach()))
        for k, v in clip_stats.items():
            if k.endswith(("_max", "_min")):  # an extreme over micro-batches, not a token-weighted mean
                stats.extreme(k, float(v))
            else:
                stats.add(k, float(v) * n)

    def _fused_value_targets(self, samples: Sequence[TrainSample], value_batch) -> "_FusedValues | None":
        """The value targets of ``samples``' loss tokens when the ``head`` critic's loss rides on the policy's pass
        (``fused_value``; the model's logits must be a linear head on its hidden states), else None."""
        c = self.critic
        if c is None or value_batch is None or c.mode != "head" or not self.params.fused_value:
            return None
        if _decoder_and_head(self.model) is None:
            return None
        return _FusedValues.of(samples, value_batch)

    def _proximal_logprobs(self, logp: torch.Tensor) -> torch.Tensor:
        """pi_prox of the decoupled objective: the policy before this update, i.e. the first epoch's own logprobs
        (detached; no extra forward pass), kept per micro-batch for the later epochs, which see the micro-batches
        in the same order."""
        if self._proximal_read == len(self._proximal):
            self._proximal.append(logp.detach())
        self._proximal_read += 1
        return self._proximal[self._proximal_read - 1]

    def sft_update(self, samples: Sequence[TrainSample]) -> dict[str, float]:
        """One supervised optimizer step: the token-mean NLL of ``samples``' loss-masked tokens (``turnrl sft``).

        Returns ``train/demo_nll`` (the loss before the step), ``train/grad_norm``, ``train/lr``, ``train/num_tokens``.
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        nll = self._demo_backward(samples, 1.0)
        grad_norm = self._step(_Sums())
        release_free_memory()
        return {"train/demo_nll": nll, "train/grad_norm": grad_norm, "train/lr": self.scheduler.get_last_lr()[0],
                "train/num_tokens": float(sum(sum(s.loss_mask) for s in samples))}

    def _demo_backward(self, samples: Sequence[TrainSample], coef: float) -> float:
        """Accumulate ``coef`` times the token-mean NLL of ``samples`` (micro-batched, one global normaliser); returns
        the NLL."""
        num_tokens = float(sum(sum(s.loss_mask) for s in samples))
        total = 0.0
        for mb in micro_batches(samples, self.params.micro_batch_tokens, self.params.group_by_prompt):
            batch = collate(mb, self.pad_id)
            with self._autocast():
                logits = response_logits(self.model, batch, self.params.prompt_grad)
            per_tok = losses.demo_nll(packed_logprobs(logits, batch, 1.0), batch.mask)
            nll = losses.aggregate(per_tok, batch.mask, "token-mean", num_tokens=num_tokens)
            (coef * nll).backward()
            total += float(nll.detach())
        return total

    def _step(self, stats: _Sums) -> float:
        """Clip the global gradient norm and step (the separate critic too); a non-finite norm skips the step."""
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.params.grad_clip))
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"gradient norm is {grad_norm}; the update was skipped (weights unchanged)")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)  # collection and evaluation need no gradient: free its memory now
        if self.critic is not None and (critic_norm := self.critic.step()) is not None:
            stats.maxima["critic_grad_norm"] = critic_norm
        return grad_norm

    @torch.no_grad()
    def reference_turn_kl(self, trajectories: Sequence[Trajectory]) -> list[list[float]]:
        """Per turn, sum over its response tokens of ``behaviour_logprob - ref_logprob`` (k1 estimate of KL(pi || ref)).

        Runs the frozen reference model over the same samples the learner trains on. Env-error
        trajectories and empty responses get 0.
        """
        if self.ref_model is None:
            raise ValueError("KL in the reward needs a reference model: set model.reference=true")
        out = [[0.0] * len(t.turns) for t in trajectories]
        samples = build_samples(trajectories, Advantages.zeros(trajectories))
        temperature = self.params.temperature
        for mb in micro_batches(samples, self.params.micro_batch_tokens, self.params.group_by_prompt):
            batch = collate(mb, self.pad_id)
            with self._autocast():
                ref_logits = self._reference_logits(batch)
            ref = packed_logprobs(ref_logits, batch, temperature)
            for b, s in enumerate(mb):
                m = batch.mask[b].bool()
                kl = (batch.old_logprobs[b][m] - ref[b][m]).tolist()  # loss tokens in order
                turns = range(len(trajectories[s.traj_index].turns)) if s.turn_index < 0 else [s.turn_index]
                k = 0
                for j in turns:
                    n = len(trajectories[s.traj_index].turns[j].response_ids)
                    out[s.traj_index][j] = float(sum(kl[k : k + n]))
                    k += n
        return out

    @torch.no_grad()
    def _reference_logits(self, batch: Batch) -> torch.Tensor:
        """The reference policy's :func:`response_logits` (without gradient)."""
        with adapter_disabled(self.ref_model):
            return response_logits(self.ref_model, batch)

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def _configured_lr(self) -> None:
        """After loading a schedule: the configured rate wins over the checkpoint's (a resumed run may change train.lr;
        an unchanged rate sets the same values, so resume stays exact); the critic's group keeps its own rate."""
        group = self.optimizer.param_groups[0]
        self.scheduler.base_lrs[0] = group["initial_lr"] = self.params.lr
        group["lr"] = self.params.lr * self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self._fused:  # a checkpoint's groups carry the implementation they were saved with (foreach before fused)
            for group in self.optimizer.param_groups:
                group.update(fused=True, foreach=None)
        self.scheduler.load_state_dict(state["scheduler"])
        self._configured_lr()
        if self.critic is not None:
            if "critic" not in state:
                raise ValueError("the checkpoint has no critic state but algo.critic is set; resume with the run's own config")
            self.critic.load_state_dict(state["critic"])
