"""A sharded data-parallel learner: FSDP2 (``fully_shard``) over torch.distributed ranks, exact to the single process.

``scale.learner_sharding=fsdp`` with ``scale.learner_ranks=N``: every decoder layer is an FSDP2 unit
(``fully_shard``), so each rank holds 1/N of every layer's parameters, of their gradients and of AdamW's two moments
between updates, where :mod:`turnrl.scale.distributed`'s replicated learner keeps a whole copy of all of it on rank 0.
The same code runs on gloo here (a CPU device mesh over the learner's process group) and on NCCL with GPUs.

Two choices follow from how turnrl's learner runs the model, and both are deliberate:

- The layers are the units, not the whole model: the learner calls the decoder and the LM head separately (the head
  runs only at loss positions, :func:`turnrl.learner.learner.response_logits`), which a root unit's hooks would not
  see, and the head's weight is tied to the embedding. So the embedding, the final norm and the head (21% of
  SmolLM2-135M's parameters) stay replicated on every rank, their gradient summed by one all-reduce, their AdamW
  state stepped identically everywhere.
- ``reshard_after_forward=False``: a layer's parameters are gathered at a micro-batch's first forward and freed after
  its backward (ZeRO-2 within a micro-batch). A micro-batch may run extra forwards (the ``train.prompt_grad=false``
  context, activation checkpointing's recomputation) that another rank's does not; with the parameters still
  gathered they issue no collective, so every rank issues the same collectives.
- The shared prefix of a micro-batch is written into every row (:func:`_unrolled`) instead of run once: run once,
  it is a second forward with autograd through every layer, and FSDP2 reshards a layer after the first of its two
  backward passes while the other still needs its parameters. The same logits in exact arithmetic, but more work and
  activation memory per row, and under bf16 autocast a different rounding (tests/test_fsdp.py checks the sharded
  update against one process on the same layout; bench/sharded_learner.py measures the cost).

What each update computes is the single-process update:

- the batch is split into the same micro-batches as :class:`~turnrl.learner.Learner`'s, rank ``r`` taking the
  ``r``-th contiguous block, every micro-batch's loss normalised by the whole batch's token and sequence counts;
- FSDP's forward and backward are collectives (a layer's parameters are all-gathered, its gradient reduce-scattered),
  so every rank runs the same number of passes: a rank with one micro-batch fewer runs one pass whose loss is
  multiplied by 0 (its gradient is exactly 0);
- the reduce-scatter averages over the ranks (gloo has no pre-scaled sum), so the gradient is multiplied by N after
  the last backward: the sum of the micro-batch gradients, as one process accumulates it (up to summation order);
- every rank clips by the global norm (computed over the shards and the replicated rest, as
  ``clip_grad_norm_`` would over the whole gradient) and steps AdamW on its part.

Rank 0 is the training process. Its ``published`` model (``Components.model``: what the engine samples from and
checkpoints save) stays a plain, unsharded model; a sharded copy (``model``) trains, and after every update its
parameters are all-gathered into the plain one (the weight sync). Checkpoints hold the whole optimizer state
(gathered from every rank, keyed by parameter name, so it does not depend on the number of ranks) and resume a
sharded learner exactly (tests/test_fsdp.py); an unsharded learner's checkpoint is refused with the fix. Every
collective on rank 0 is bounded by ``scale.sync_timeout_s``: a stuck or dead rank stops the run with a
:class:`~turnrl.scale.ScaleError` naming it.

Not supported yet (refused with a clear error): a learned critic (as in the replicated learner) and demonstrations
in the RL loss (``algo.demo_coef``: rank 0 alone would run their passes, and FSDP's passes are collectives).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from turnrl.config import ConfigError
from turnrl.learner import Learner, LearnerParams
from turnrl.learner.learner import response_logits
from turnrl.learner.samples import Batch, micro_batches
from turnrl.models.freeze import decoder_layers
from turnrl.models.prefix import positions_from_mask
from turnrl.scale.distributed import WORK, DataParallelLearner, Groups, _all_reduce_grads, _merge_stats, _signal
from turnrl.types import TrainSample

STATE, LOAD = 2, 3  # rank 0's commands beside WORK and STOP: gather the optimizer state, load a checkpoint's
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # rank 0 gets the whole state, the others nothing
FROM_RANK0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


class ShardedLearner(DataParallelLearner):
    """Rank ``rank`` of ``world`` with FSDP2-sharded parameters, gradients and optimizer state (module docstring).

    Build the training process's one with :meth:`spawn` (``scale.learner_sharding=fsdp``); the other ranks run
    :func:`turnrl.scale.distributed._serve`. ``model`` stays the unsharded model on rank 0 (``published``).
    """

    def __init__(self, model, params: LearnerParams, pad_id: int, ref_model=None, *, rank: int, world: int,
                 groups: Groups, timeout_s: float) -> None:
        self.published = model if rank == 0 else None
        sharded = copy.deepcopy(model) if rank == 0 else model
        mesh = DeviceMesh.from_group(groups.bounded, "cpu")
        for layer in decoder_layers(sharded, "scale.learner_sharding", "none"):
            fully_shard(layer, mesh=mesh, reshard_after_forward=False)
        super().__init__(sharded, params, pad_id, ref_model, rank=rank, world=world, groups=groups, timeout_s=timeout_s)
        self._count = self._rounds = self._passes = 0

    @classmethod
    def spawn(cls, ranks: int, timeout_s: float, model, params: LearnerParams, pad_id: int, ref_model=None,
              critic=None) -> "ShardedLearner":
        """Start ``ranks - 1`` helper processes, join them, shard the model on every rank; returns rank 0."""
        if params.demo_coef > 0:
            raise ConfigError("scale.learner_sharding=fsdp does not support demonstrations in the RL loss yet "
                              "(algo.demo_coef > 0): set algo.demo_coef=0 or scale.learner_sharding=none")
        return super().spawn(ranks, timeout_s, model, params, pad_id, ref_model, critic)  # type: ignore[return-value]

    def update(self, samples: Sequence[TrainSample], value_batch=None, demos: Sequence[TrainSample] = ()) -> dict[str, float]:
        """One update across all ranks (rank 0: sends the batch first, then gathers the new weights into ``model``)."""
        if self.rank == 0:
            with self._bounded("sending the batch to the learner ranks"):
                _signal(self.groups.commands, WORK)
                dist.broadcast_object_list([list(samples)], src=0, group=self.groups.bounded)
        self._count = len(micro_batches(samples, self.params.micro_batch_tokens, self.params.group_by_prompt))  # the split Learner.update makes
        self._mine = range(self.rank * self._count // self.world, (self.rank + 1) * self._count // self.world)
        self._rounds = -(-self._count // self.world)  # passes every rank runs: its block's, padded to the largest
        self._micro_batch = self._passes = self._epoch = 0
        with self._bounded("the sharded update (a collective in a forward or backward pass)"):
            metrics = Learner.update(self, samples, value_batch, demos)
        with self._bounded("gathering the updated weights"):
            self._publish()
        return metrics

    def _policy_backward(self, batch, num_tokens: float, num_seqs: float, stats, values=None) -> None:
        batch = _unrolled(batch)
        if self._micro_batch in self._mine:
            Learner._policy_backward(self, batch, num_tokens, num_seqs, stats, values)
            self._passes += 1
        self._micro_batch += 1
        while self._micro_batch == self._count and self._passes < self._rounds:  # this epoch's split ends here
            with self._autocast():
                logits = response_logits(self.model, batch, self.params.prompt_grad)
            (logits.float().sum() * 0.0).backward()  # the other ranks' collectives, with a gradient of exactly 0
            self._passes += 1

    def _step(self, stats) -> float:
        """Sum the gradients (the layers' shards: FSDP averaged them; the rest: one all-reduce), clip by the global
        norm and step every rank's part (its shards, and the replicated rest identically on every rank)."""
        sharded = [p for p in self._trainable() if _is_shard(p)]
        replicated = [p for p in self._trainable() if not _is_shard(p)]
        with self._bounded("the gradient all-reduce"):
            _merge_stats(stats, self.world, self.groups.bounded)
            _all_reduce_grads(replicated, self.groups.bounded)
            with torch.no_grad():
                for p in sharded:
                    if p.grad is not None:
                        p.grad.mul_(self.world)
                local = [p.grad.to_local().float() for p in sharded if p.grad is not None]
                squares = torch.stack([g.pow(2).sum() for g in local]).sum() if local else torch.zeros(())
                dist.all_reduce(squares, group=self.groups.bounded)
        self._micro_batch = self._passes = 0
        self._epoch += 1
        with torch.no_grad():
            squares += sum(float(p.grad.float().pow(2).sum()) for p in replicated if p.grad is not None)
            grad_norm = float(squares.sqrt())
            if not math.isfinite(grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                raise FloatingPointError(f"gradient norm is {grad_norm}; the update was skipped (weights unchanged)")
            scale = self.params.grad_clip / (grad_norm + 1e-6)  # torch.nn.utils.clip_grad_norm_'s rule
            if scale < 1.0:
                for p in self._trainable():
                    if p.grad is not None:
                        p.grad.mul_(scale)
        self.optimizer.step()
        self.scheduler.step()
        return grad_norm

    @torch.no_grad()
    def _publish(self) -> None:
        """All-gather every parameter into rank 0's unsharded model (a collective: every rank calls it)."""
        published = dict(self.published.named_parameters()) if self.published is not None else {}
        for name, p in self.model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            if name in published:
                published[name].copy_(full)

    def serve(self, command: int) -> None:
        """A helper rank's side of rank 0's command (the update, the state gather, a checkpoint's load)."""
        if command == STATE:
            get_optimizer_state_dict(self.model, self.optimizer, options=FULL)
        elif command == LOAD:
            self._load(None)
        else:
            try:
                super().serve(command)
            except FloatingPointError:  # every rank saw the same non-finite norm and skipped the step; rank 0 reports it
                pass

    def state_dict(self) -> dict:
        """The whole optimizer state, keyed by parameter name (gathered from every rank), and the schedule."""
        with self._bounded("gathering the sharded optimizer state"):
            _signal(self.groups.commands, STATE)
            optimizer = get_optimizer_state_dict(self.model, self.optimizer, options=FULL)
        return {"optimizer_full": optimizer, "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Load a sharded learner's checkpoint state; the weights come from rank 0's ``model`` (loaded just before)."""
        if "optimizer_full" not in state:
            raise ValueError("the checkpoint's optimizer state is an unsharded learner's; resume it with "
                             "scale.learner_sharding=none, or start a sharded run from its weights (model.path)")
        with self._bounded("loading the checkpoint into the learner ranks"):
            _signal(self.groups.commands, LOAD)
            self._load(state)

    def _load(self, state: dict | None) -> None:
        box = [None if state is None else state["scheduler"]]
        dist.broadcast_object_list(box, src=0, group=self.groups.bounded)
        weights = self.published.state_dict() if self.published is not None else {}
        set_model_state_dict(self.model, weights, options=FROM_RANK0)
        set_optimizer_state_dict(self.model, self.optimizer, {} if state is None else state["optimizer_full"],
                                 options=FROM_RANK0)
        self.scheduler.load_state_dict(box[0])
        self._configured_lr()


def _is_shard(p: torch.Tensor) -> bool:
    return hasattr(p, "to_local")  # a DTensor: a sharded layer's parameter


def _unrolled(batch: Batch) -> Batch:
    """``batch`` with its shared prefix written into every row instead of run once (the same logits and gradient).

    The shared prefix is a second forward through every layer before the one that computes the logits, both with
    autograd; FSDP2 reshards a layer after its first backward hook, while the other forward's backward still needs its
    parameters. One forward per layer per pass keeps FSDP's bookkeeping simple, at the cost of running the prefix once
    per row.
    """
    if not batch.prefix:
        return batch
    prefix = torch.tensor(batch.prefix, dtype=batch.ids.dtype).expand(batch.ids.shape[0], -1)
    return dataclasses.replace(batch, prefix=[], ids=torch.cat([prefix, batch.ids], dim=1),
                               positions=positions_from_mask(batch.attention))
