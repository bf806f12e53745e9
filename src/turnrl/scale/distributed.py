"""A data-parallel learner over torch.distributed ranks (gloo on CPU), exact to the single-process gradient.

:class:`~turnrl.learner.Learner` already normalises every micro-batch's loss by the whole batch's token and sequence
counts, so the batch gradient is the *sum* of the micro-batch gradients. Here rank ``r`` of ``N`` runs the ``r``-th
contiguous block of the same split's micro-batches, and one all-reduce (SUM) of the flattened gradient gives rank 0
the single-process gradient: it does not depend on ``N`` (up to float summation order; contiguous blocks keep the
single process's order of accumulation within each rank). This is DDP's gradient
all-reduce, done explicitly rather than through ``DistributedDataParallel``: DDP averages (it would need the loss
scaled by ``N``) and needs the same number of backward passes on every rank, while a batch's micro-batches rarely
divide evenly.

Rank 0 is the training process and the only one that steps the optimizer (clip, AdamW, schedule), so checkpoints,
resume and rollback stay as they are; before each update (and after each PPO epoch but the last) it broadcasts the
trainable weights, so the other ranks always compute with the current ones. The other ranks are either processes
spawned here (``torch.multiprocessing``, spawn start method) on one machine, or, when a launcher started every rank
(``torchrun``: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` set, on one node or many), the launched ``turnrl train``
processes of rank > 0, which only join the group and serve (:func:`serve_launched`); either way each gets its own
copy of rank 0's model (pickled to it: a spawned rank as its argument, a launched one by a broadcast). Every
collective on rank 0 is bounded by ``scale.sync_timeout_s`` (the process group's timeout): a stuck or dead rank
stops the run with a :class:`~turnrl.scale.ScaleError` instead of hanging.

Not supported yet (refused with a clear error): a learned critic (``algo.critic``), whose value loss every rank would
add again.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import pickle
import socket
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from turnrl.config import ConfigError
from turnrl.learner import Learner, LearnerParams
from turnrl.learner.samples import micro_batches
from turnrl.scale import ScaleError
from turnrl.types import TrainSample

WAIT_FOR_WORK = datetime.timedelta(days=7)  # how long a helper rank waits for the next batch (rollouts come between)
STARTUP = datetime.timedelta(minutes=10)  # how long rank 0 waits for the helper ranks to start and join
STOP, WORK = 0, 1  # what rank 0 tells the helper ranks before each update and at the end


class DataParallelLearner(Learner):
    """A :class:`~turnrl.learner.Learner` that is rank ``rank`` of ``world`` and shares each update's micro-batches.

    Build the training process's one with :meth:`spawn`; :func:`_serve` runs the others.
    """

    shares_batch_prefix = False  # its ranks synchronise in the last micro-batch's backward (models.prefix.BatchPrefix)

    def __init__(self, model, params: LearnerParams, pad_id: int, ref_model=None, *, rank: int, world: int,
                 groups: Groups, timeout_s: float) -> None:
        super().__init__(model, params, pad_id, ref_model=ref_model)
        self.rank, self.world = rank, world
        self.groups = groups
        self.timeout_s = timeout_s
        self._helpers: list[Any] = []
        self._micro_batch = 0  # index of the next micro-batch in this update's split
        self._mine = range(0)  # the indices of this rank's share: one contiguous block
        self._epoch = 0
        self._broken = False  # a collective failed: the group is unusable, close() only stops the helpers

    @classmethod
    def spawn(cls, ranks: int, timeout_s: float, model, params: LearnerParams, pad_id: int, ref_model=None,
              critic=None) -> "DataParallelLearner":
        """Start ``ranks - 1`` helper processes, join them in a gloo group, and return rank 0 (this process)."""
        if critic is not None:
            raise ConfigError("scale.learner_ranks > 1 does not support a learned critic (algo.critic) yet: every rank "
                              "would add the value loss; set scale.learner_ranks=1 or algo.critic=none")
        if ranks < 2:
            raise ValueError(f"a data-parallel learner needs at least 2 ranks, got {ranks}")
        blob = pickle.dumps((model, params, pad_id, ref_model))  # a copy each: a rank never shares our storages
        if launched() is not None:
            return cls._join_launched(ranks, timeout_s, blob, model, params, pad_id, ref_model)
        address = f"tcp://127.0.0.1:{_free_port()}"
        ctx = mp.get_context("spawn")
        helpers = [ctx.Process(target=_serve, args=(cls, r, ranks, address, timeout_s, blob), daemon=True)
                   for r in range(1, ranks)]
        for p in helpers:
            p.start()
        try:
            groups = _join(0, ranks, address, timeout_s)
        except (RuntimeError, dist.DistError) as e:
            for p in helpers:
                p.kill()
            raise ScaleError(f"the {ranks - 1} learner rank(s) did not start within {STARTUP.total_seconds():g} s "
                             f"({type(e).__name__}); check memory and that the model pickles") from None
        learner = cls(model, params, pad_id, ref_model, rank=0, world=ranks, groups=groups, timeout_s=timeout_s)
        learner._helpers = helpers
        atexit.register(learner.close)
        return learner

    @classmethod
    def _join_launched(cls, ranks: int, timeout_s: float, blob: bytes, model, params: LearnerParams, pad_id: int,
                       ref_model) -> "DataParallelLearner":
        """Rank 0 of ranks a launcher started: join them (``env://``), send each this learner's kind and model."""
        rank, world = launched()  # type: ignore[misc]
        if rank != 0:  # api.train sends a launched rank > 0 to serve_launched before it builds anything
            raise RuntimeError(f"only rank 0 builds the learner; rank {rank} should serve (serve_launched)")
        if world != ranks:  # build checks it first; a direct caller gets the same error
            raise ConfigError(f"the launcher started {world} ranks (WORLD_SIZE={world}) but scale.learner_ranks={ranks}: "
                              f"set scale.learner_ranks={world}, or launch {ranks} rank(s)")
        try:
            groups = _join(0, world, "env://", timeout_s)
            dist.broadcast_object_list([(cls, blob)], src=0, group=groups.bounded)
        except (RuntimeError, dist.DistError) as e:
            raise ScaleError(f"the launched learner ranks did not join and take the model ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}); check MASTER_ADDR/MASTER_PORT and that every "
                             "rank runs the same turnrl train command") from None
        learner = cls(model, params, pad_id, ref_model, rank=0, world=world, groups=groups, timeout_s=timeout_s)
        atexit.register(learner.close)
        return learner

    def update(self, samples: Sequence[TrainSample], value_batch=None, demos: Sequence[TrainSample] = ()) -> dict[str, float]:
        """One update across all ranks (rank 0: sends the batch first); the same metrics as the single process.

        ``demos`` (``algo.demo_coef``) are rank 0's alone: their NLL gradient enters the SUM all-reduce once, so the
        step equals the single process's (not split across ranks: demonstration batches are small)."""
        if self.rank == 0:
            with self._bounded("sending the batch to the learner ranks"):
                _signal(self.groups.commands, WORK)
                dist.broadcast_object_list([list(samples)], src=0, group=self.groups.bounded)
        with self._bounded("broadcasting the weights to the learner ranks"):
            self._broadcast_weights()
        count = len(micro_batches(samples, self.params.micro_batch_tokens, self.params.group_by_prompt))  # the split Learner.update makes
        self._mine = range(self.rank * count // self.world, (self.rank + 1) * count // self.world)
        self._micro_batch, self._epoch = 0, 0
        return super().update(samples, value_batch, demos)

    def serve(self, command: int) -> None:
        """A helper rank's side of rank 0's ``command`` (here only :data:`WORK`: receive the batch, run the update)."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.groups.bounded)
        self.update(box[0])

    def _policy_backward(self, batch, num_tokens: float, num_seqs: float, stats, values=None) -> None:
        if self._micro_batch in self._mine:
            super()._policy_backward(batch, num_tokens, num_seqs, stats, values)
        self._micro_batch += 1

    def _step(self, stats) -> float:
        """Sum the gradients and statistics over the ranks; rank 0 steps, then sends the weights for the next epoch."""
        with self._bounded("the gradient all-reduce"):
            _all_reduce_grads(self._trainable(), self.groups.bounded)
            _merge_stats(stats, self.world, self.groups.bounded)
        self._epoch += 1
        self._micro_batch = 0
        norm = super()._step(stats) if self.rank == 0 else 0.0
        if self._epoch < self.params.ppo_epochs:
            with self._bounded("broadcasting the weights to the learner ranks"):
                self._broadcast_weights()
        return norm

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _broadcast_weights(self) -> None:
        params = self._trainable()
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1).float() for p in params])
            dist.broadcast(flat, src=0, group=self.groups.bounded)
            if self.rank != 0:
                _unflatten_into(flat, params, grads=False)

    @contextlib.contextmanager
    def _bounded(self, what: str) -> Iterator[None]:
        """Turn a collective's timeout or a dead peer into a :class:`ScaleError` naming ``scale.sync_timeout_s``."""
        try:
            yield
        except (RuntimeError, dist.DistError) as e:
            self._broken = True
            raise ScaleError(f"{what} did not complete within scale.sync_timeout_s={self.timeout_s:g} s or a rank died "
                             f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}): a learner rank is stuck or "
                             "gone; raise scale.sync_timeout_s if updates are that slow, else restart the run (--resume)") from None

    def close(self) -> None:
        """Stop the helper ranks and leave the process group (rank 0). Safe to call twice."""
        if self.rank != 0 or not dist.is_initialized():
            return
        if not self._broken:
            with contextlib.suppress(RuntimeError, dist.DistError):
                _signal(self.groups.commands, STOP)
        for p in self._helpers:
            p.join(timeout=0 if self._broken else 10)
            if p.is_alive():
                p.kill()
                p.join()
        with contextlib.suppress(RuntimeError, dist.DistError):
            dist.destroy_process_group()


def _serve(cls: type[DataParallelLearner], rank: int, world: int, address: str, timeout_s: float, blob: bytes) -> None:
    """A spawned helper rank's life: join the group, build its ``cls`` learner, then serve rank 0's commands until STOP."""
    torch.set_num_threads(1)
    groups = _join(rank, world, address, timeout_s)
    _serve_until_stop(cls, rank, world, groups, timeout_s, blob)


def launched() -> tuple[int, int] | None:
    """``(rank, world)`` when a launcher (``torchrun``) started this process as one of several ranks, else None."""
    env = os.environ
    if "RANK" not in env or "MASTER_ADDR" not in env or int(env.get("WORLD_SIZE", "1")) < 2:
        return None
    return int(env["RANK"]), int(env["WORLD_SIZE"])


def serve_launched(timeout_s: float = STARTUP.total_seconds()) -> None:
    """A launched rank > 0's life (``torchrun ... turnrl train``): join rank 0, take its learner's kind and model,
    serve its updates until it stops. Needs no config: rank 0 checks ``scale.learner_ranks`` against the launch, and
    ``timeout_s`` bounds only this rank's own waits inside an update (rank 0's are ``scale.sync_timeout_s``)."""
    rank, world = launched()  # type: ignore[misc]
    groups = _join(rank, world, "env://", timeout_s)
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0, group=groups.bounded)
    cls, blob = box[0]
    _serve_until_stop(cls, rank, world, groups, timeout_s, blob)


def _serve_until_stop(cls: type[DataParallelLearner], rank: int, world: int, groups: Groups, timeout_s: float,
                      blob: bytes) -> None:
    model, params, pad_id, ref_model = pickle.loads(blob)
    learner = cls(model, params, pad_id, ref_model, rank=rank, world=world, groups=groups, timeout_s=timeout_s)
    while (command := _signal(groups.commands)) != STOP:
        learner.serve(command)
    dist.destroy_process_group()


def _signal(group, value: int = 0) -> int:
    """Broadcast one int from rank 0 over ``group`` (rank 0 sends ``value``); returns it."""
    flag = torch.tensor([value])
    dist.broadcast(flag, src=0, group=group)
    return int(flag)


class Groups(NamedTuple):
    """The gloo groups of all ranks: ``commands`` tells helper ranks to work or stop (they wait on it between
    updates, while rank 0 collects rollouts: a timeout is local to a process, so only theirs is long); ``bounded``
    carries the batch, weights, gradients and statistics. On rank 0 every collective times out after
    ``scale.sync_timeout_s``."""

    commands: Any
    bounded: Any


def _join(rank: int, world: int, address: str, timeout_s: float) -> Groups:
    """Join the ranks (waiting up to :data:`STARTUP` for all of them to start) and make their :class:`Groups`."""
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world, timeout=STARTUP)
    bounded = datetime.timedelta(seconds=timeout_s)
    return Groups(dist.new_group(backend="gloo", timeout=bounded if rank == 0 else WAIT_FOR_WORK),
                  dist.new_group(backend="gloo", timeout=bounded))


def _all_reduce_grads(params: list[torch.nn.Parameter], group) -> None:
    """Sum every parameter's gradient over the ranks (a rank without one contributes zeros), in one flat tensor."""
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    _unflatten_into(flat, params, grads=True)


def _unflatten_into(flat: torch.Tensor, params: list[torch.nn.Parameter], grads: bool) -> None:
    offset = 0
    for p in params:
        n = p.numel()
        part = flat[offset : offset + n].view_as(p).to(p.dtype)
        if grads:
            p.grad = part.clone()
        else:
            p.data.copy_(part)
        offset += n


def _merge_stats(stats, world: int, group) -> None:
    """Sum the ranks' token-weighted statistics and fold their extremes (``learner._Sums.extreme``: min for ``*_min``)."""
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (stats.sums, stats.maxima), group=group)
    stats.sums, stats.maxima = {}, {}
    for sums, maxima in gathered:
        for k, v in sums.items():
            stats.add(k, v)
        for k, v in maxima.items():
            stats.extreme(k, v)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
