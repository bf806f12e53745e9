"""Async off-policy collection (``scale.async_mode``): the next steps' batches are generated in a background thread
of the training process while the learner updates on the current one (docs/scale.md, "Async mode").

    main thread:      update(batch t) ─ sync ─ update(batch t+1) ─ sync ─ ...
    producer thread:  collect(batch t+1) ........ collect(batch t+2) ........
                      turns sampled before a sync carry version v, after it v + 1 (partial rollouts)

- The producer runs the loop's own step collection (``loop.collect_step``) for steps ``start, start + 1, ...`` on a
  private copy of the training collector and hands each batch to the loop through a queue.
- The engine is shared by both threads, so every call to it goes through a :class:`LockedEngine`: one lock around
  ``generate``, ``sync_weights`` and the checkpoint state, so a weight sync lands between two generation calls, never
  inside one. A ``LockedEngine`` is not a :class:`~turnrl.engines.base.SessionEngine`: collectors drive it in lock step
  (one batched ``generate`` per turn of all live episodes), so an episode in flight across a sync has turns of both
  versions, each stamped with its own (``Turn.version``). The price: no KV cache kept across an episode's turns.
- Gate (AReaL's staleness control, Fu et al. 2025): the producer starts step ``s``'s batch only once the learner has
  synced at least ``s - start - max_staleness`` updates since the producer started, so it runs at most
  ``max_staleness`` steps ahead and ``max_staleness = 0`` is synchronous collection.
- Bound: when the loop takes a batch at learner version ``V``, a group holding a turn sampled before
  ``V - max_staleness`` is dropped whole (its episodes are compared with each other) and its episodes are counted in
  ``rollout/stale_dropped``. With the gate this drops nothing in a plain run; it is the guarantee the learner gets
  whatever moved the version (a restored checkpoint restarts the producer, :meth:`AsyncCollection.restart`).

Engines: the engine must hold its own copy of the weights (``native``, ``vllm``, a remote server). The ``hf`` engine
samples from the learner's module itself, which the optimizer changes in place mid-generation, so it is refused, as
are Ray rollout workers (``scale.workers > 0``), whose weight sync reads that module from the producer thread.

Resume: an async run's checkpoint holds the weights, optimizer, step and engine version, as a sync run's does; the
batches in flight are not saved. ``--resume`` restarts the producer at the checkpoint's step, on the same tasks
(a pure function of the step), from the checkpoint's weights; which turns see which weight version depends on
thread timing, so the samples, unlike a sync run's, are not bit-identical to an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from turnrl.config import ConfigError
from turnrl.engines import Completion, Engine, SamplingParams
from turnrl.engines.hf import HFEngine
from turnrl.rollout import RolloutStats
from turnrl.types import TrainSample, TrajectoryGroup

StepBatch = tuple[list[TrajectoryGroup], list[TrajectoryGroup], list[Any], RolloutStats]
"""What the loop's ``collect_step`` returns: (training groups, all collected groups, their tasks, the counters)."""

Collect = Callable[[Any, int], StepBatch]
"""``collect(components, step)``: one step's batch, collected with ``components``' collector and tasks."""

JOIN_TIMEOUT_S = 120.0
"""How long closing waits for the producer to finish the engine call or env step it is in."""


class _Stopped(Exception):
    """Raised into the producer's collection when it is told to stop."""


class LockedEngine:
    """The plain :class:`~turnrl.engines.base.Engine` protocol over ``engine``, every call under ``lock``.

    ``sync_weights`` and ``load_state_dict`` wake whoever waits on ``lock`` (the producer's gate). With ``stop`` set,
    ``generate`` raises instead of generating: a producer that is told to stop leaves at its next turn.
    """

    def __init__(self, engine: Engine, lock: threading.Condition, stop: threading.Event | None = None) -> None:
        self.engine, self.lock, self.stop = engine, lock, stop

    @property
    def version(self) -> int:
        return self.engine.version

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        with self.lock:
            if self.stop is not None and self.stop.is_set():
                raise _Stopped()
            return self.engine.generate(prompts, params)

    def sync_weights(self) -> None:
        with self.lock:
            self.engine.sync_weights()
            self.lock.notify_all()

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return self.engine.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self.lock:
            self.engine.load_state_dict(state)
            self.lock.notify_all()


class StepCollection:
    """The loop's source of batches: ``collection(step)``. This one collects on the spot (sync mode); nothing is in
    flight, so :meth:`restart` and :meth:`close` have nothing to do and no metrics are added."""

    def __init__(self, c: Any, collect: Collect) -> None:
        self.c, self.collect = c, collect
        self.last_metrics: dict[str, float] = {}

    def __call__(self, step: int) -> StepBatch:
        return self.collect(self.c, step)

    def restart(self) -> None:
        """Forget batches collected ahead (after a checkpoint was restored)."""

    def close(self) -> None:
        """Stop collecting."""


class AsyncCollection(StepCollection):
    """Batches from a producer thread running ``max_staleness`` steps ahead of the loop (the module docstring).

    While it runs, ``c.engine`` and the engines of ``c.collector`` and ``c.eval_collector`` are :class:`LockedEngine`
    views of the one engine (:meth:`close` puts the engine back). ``last_metrics`` holds the last batch's
    ``rollout/stale_dropped``.
    """

    def __init__(self, c: Any, collect: Collect, max_staleness: int) -> None:
        super().__init__(c, collect)
        check_async(c)
        self.max_staleness = max_staleness
        self.lock = threading.Condition()
        self._engine = c.engine
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._batches: queue.Queue[tuple[int, StepBatch] | BaseException] = queue.Queue()
        self._next = -1  # the step whose batch the producer hands over next

    def __call__(self, step: int) -> StepBatch:
        if self._thread is not None and step != self._next:  # the loop skipped or repeated a step
            self.restart()
        if self._thread is None:
            self._start(step)
        item = self._take()
        if isinstance(item, BaseException):
            raise item
        self._next = step + 1
        groups, collected, tasks, stats = item[1]
        kept, dropped = drop_stale(groups, self.c.engine.version - self.max_staleness)
        self.last_metrics = {"rollout/stale_dropped": float(dropped)}
        return kept, collected, tasks, stats

    def restart(self) -> None:
        """Stop the producer and drop what it collected ahead; the next call starts it again at its step."""
        self._halt()
        self._stop = threading.Event()
        self._batches = queue.Queue()

    def close(self) -> None:
        """Stop the producer and give the components their engine back."""
        self._halt()
        self._share(self._engine)

    def _start(self, step: int) -> None:
        self._share(LockedEngine(self._engine, self.lock))
        producer = copy.copy(self.c.collector)  # its own counters; the loop's collector stays free for evaluation
        producer.engine, producer.stats = LockedEngine(self._engine, self.lock, self._stop), RolloutStats()
        parts = dataclasses.replace(self.c, collector=producer, engine=producer.engine)
        self._next = step
        self._thread = threading.Thread(target=self._produce, args=(parts, step, self._engine.version, self._stop),
                                        name="turnrl-async-rollout", daemon=True)
        self._thread.start()

    def _produce(self, parts: Any, start: int, base_version: int, stop: threading.Event) -> None:
        """The producer thread: every step's batch from ``start`` to the end, each once the gate lets it start."""
        for step in range(start, self.c.cfg.train.steps):
            with self.lock:  # the gate: at most max_staleness updates ahead of the learner
                self.lock.wait_for(lambda: stop.is_set() or
                                   self._engine.version >= base_version + step - start - self.max_staleness)
            if stop.is_set():
                return
            try:
                batch = self.collect(parts, step)
            except _Stopped:
                return
            except BaseException as e:  # noqa: BLE001 - handed to the loop, which raises it
                self._batches.put(e)
                return
            self._batches.put((step, batch))

    def _take(self) -> tuple[int, StepBatch] | BaseException:
        """The producer's next batch (or what it raised); waits while it collects."""
        while True:
            try:
                return self._batches.get(timeout=1.0)
            except queue.Empty:
                if self._thread is None or not self._thread.is_alive():
                    return RuntimeError("the async rollout producer stopped without a batch; see the error above")

    def _halt(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        with self.lock:
            self.lock.notify_all()
        self._thread.join(JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            raise RuntimeError(f"the async rollout producer did not stop within {JOIN_TIMEOUT_S:g} s: an env step or "
                               "engine call hangs (env.step_timeout_s bounds env steps)")
        self._thread = None

    def _share(self, engine: Any) -> None:
        """Make ``engine`` the one the components and their collectors call."""
        self.c.engine = engine
        for collector in (self.c.collector, self.c.eval_collector):
            if collector is not None:
                collector.engine = engine


def check_async(c: Any) -> None:
    """Refuse what async mode cannot run safely, naming the fix (see the module docstring)."""
    if isinstance(c.engine, HFEngine):
        raise ConfigError("scale.async_mode needs an engine with its own copy of the weights: the hf engine samples from "
                          "the module the learner updates in place; use rollout.engine=native (Llama-family models) or vllm")
    if c.cfg.scale.workers > 0:
        raise ConfigError("scale.async_mode does not run with Ray rollout workers yet (their weight sync reads the "
                          "module the learner updates): set scale.workers=0 or scale.async_mode=false")


@contextlib.contextmanager
def collection(c: Any, collect: Collect) -> Iterator[StepCollection]:
    """The run's :class:`StepCollection`: :class:`AsyncCollection` with ``scale.async_mode``, closed on the way out."""
    scale = c.cfg.scale
    source = AsyncCollection(c, collect, scale.max_staleness) if scale.async_mode else StepCollection(c, collect)
    try:
        yield source
    finally:
        source.close()


def drop_stale(groups: Sequence[TrajectoryGroup], oldest: int) -> tuple[list[TrajectoryGroup], int]:
    """The groups all of whose turns were sampled at version >= ``oldest``, and how many episodes the others held."""
    kept = [g for g in groups if all(turn.version >= oldest for t in g.trajectories for turn in t.turns)]
    dropped = sum(len(g.trajectories) for g in groups) - sum(len(g.trajectories) for g in kept)
    return kept, dropped


def staleness_metrics(samples: Sequence[TrainSample], version: int) -> dict[str, float]:
    """``train/staleness_mean`` and ``train/staleness_max``: ``version`` (the learner's) minus the policy version of
    each loss token of ``samples``; none when no sample carries versions."""
    ages = [version - v for s in samples for v, m in zip(s.policy_versions, s.loss_mask) if m]
    if not ages:
        return {}
    return {"train/staleness_mean": sum(ages) / len(ages), "train/staleness_max": float(max(ages))}
