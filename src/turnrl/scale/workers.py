"""Rollout workers as Ray actors, and :class:`RayCollector`, the collector that fans a collection out across them.

Each :class:`RolloutWorker` holds what the single process builds for rollouts: the run's engine over its own copy
of the model, and the training and evaluation collectors with their env factories. The function that builds them
is passed in (``turnrl.build.rollout_parts``: build sits above scale, so scale never imports it), so a worker
builds exactly what the single process builds. Worker ``i``'s engine is seeded ``train.seed + i``.

``collect(seeds, ...)`` splits the seeds into one contiguous chunk per worker, runs the chunks concurrently and
returns the groups in seed order, with the same exact-token trajectories, behaviour logprobs and policy versions a
:class:`~turnrl.rollout.Collector` records (under greedy decoding, the same trajectories). Before a collection whose
weights are stale, the learner's weights go to every worker once (``ray.put`` of the state dict, each worker loads
it and stamps the driver engine's version), bounded by ``scale.sync_timeout_s``.

Faults: a worker that dies (``ray.kill``, ``kill -9``, an out-of-memory kill) is replaced by a fresh actor with the
current weights, and its chunk runs again there; a chunk that fails :data:`MAX_ATTEMPTS` times stops the run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from turnrl.config import Config
from turnrl.engines import Engine, SamplingParams
from turnrl.models import use_bf16
from turnrl.rollout import Collector, RolloutStats
from turnrl.scale import ScaleError
from turnrl.types import TrajectoryGroup

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("scale.workers > 0 needs Ray: pip install 'turnrl[scale]'") from e

#: ``(cfg, model, tokenizer) -> (training collector, evaluation collector or None)``: what a worker holds.
RolloutParts = Callable[[Config, Any, Any], tuple[Collector, Collector | None]]
MAX_ATTEMPTS = 3  # runs of one chunk (the first and two re-runs on replacement workers) before the run stops
TRAIN, EVAL = 0, 1  # which of a worker's collectors a collection uses


class RolloutWorker:
    """A Ray actor's state: an engine over ``model`` and the run's collectors, built by ``make_parts``."""

    def __init__(self, cfg: Config, model, tokenizer, make_parts: RolloutParts) -> None:
        self.model = model
        self.collectors = make_parts(cfg, model, tokenizer)
        self.engine: Engine = self.collectors[TRAIN].engine

    def load_weights(self, state_dict: dict[str, Any], version: int) -> int:
        """Load the learner's weights, let the engine re-read them, and take the learner's ``version``."""
        self.model.load_state_dict(state_dict)
        self.engine.sync_weights()
        self.engine.version = version
        return version

    def collect(self, which: int, seeds: list[int], group_size: int, sampling: SamplingParams,
                env_id: str) -> tuple[list[TrajectoryGroup], RolloutStats]:
        """One chunk: the groups of ``seeds`` (in order) from collector ``which``, and that collection's counters."""
        collector = self.collectors[which]
        if collector is None:
            raise ValueError("this run has no separate evaluation collector (eval.env_id is empty)")
        collector.take_stats()
        groups = collector.collect(seeds, group_size, sampling, env_id)
        return groups, collector.take_stats()


def actor_options(cfg: Config) -> dict[str, Any]:
    """Ray's resource request for one rollout worker: ``scale.worker_gpus`` GPUs (none on CPU machines)."""
    return {"num_gpus": cfg.scale.worker_gpus} if cfg.scale.worker_gpus else {}


class WorkerPool:
    """``workers`` Ray actors, each a :class:`RolloutWorker`; starts Ray locally unless it is already running
    (``ray.init()`` joins the cluster ``RAY_ADDRESS`` names).

    ``version`` is the policy version of the weights every live worker holds; :meth:`sync` moves it.
    ``restarts`` counts workers replaced after dying.
    """

    def __init__(self, cfg: Config, model, tokenizer, make_parts: RolloutParts, workers: int, sync_timeout_s: float,
                 version: int = 0) -> None:
        if workers < 1:
            raise ValueError(f"a worker pool needs at least one worker, got scale.workers={workers}")
        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        self.cfg, self.tokenizer, self.make_parts = cfg, tokenizer, make_parts
        self.sync_timeout_s = sync_timeout_s
        self.version = version
        self.restarts = 0
        self._actor = ray.remote(RolloutWorker).options(**actor_options(cfg))
        self._model = ray.put(model)  # the model as built; a replacement worker starts from it, then loads _weights
        self._weights: ray.ObjectRef | None = None
        # each worker's engine gets its share of the cluster's cores: torch threads past them spin against each other
        # (2 workers with 2 threads each on 2 cores collected at 0.24x one worker's rate, bench/RESULTS.md 2026-12-04)
        self.threads = cfg.train.threads or max(1, int(ray.cluster_resources().get("CPU", 1)) // workers)
        self.workers = [self._spawn(i) for i in range(workers)]

    def _spawn(self, index: int):
        train = {"seed": (self.cfg.train.seed + index) % 2**32, "threads": self.threads}
        # the driver's precision, not each worker's own probe: one run samples in one dtype on every worker
        model = {"autocast_bf16": use_bf16(self.cfg.model.autocast_bf16)}
        cfg = self.cfg.model_copy(update={"train": self.cfg.train.model_copy(update=train),
                                          "model": self.cfg.model.model_copy(update=model)})
        actor = self._actor.remote(cfg, self._model, self.tokenizer, self.make_parts)
        if self._weights is not None:  # actor calls run in order: its first chunk sees these weights
            actor.load_weights.remote(self._weights, self.version)
        return actor

    def _replace(self, index: int) -> None:
        ray.kill(self.workers[index], no_restart=True)  # it may be alive but failing; a dead actor ignores this
        self.workers[index] = self._spawn(index)
        self.restarts += 1

    def sync(self, model, version: int) -> None:
        """Send ``model``'s weights to every worker as ``version``: one ``ray.put``, then each worker loads it.

        Raises :class:`ScaleError` when a worker has not loaded them within ``scale.sync_timeout_s``. A worker that
        died meanwhile is replaced (and gets the weights as it starts).
        """
        self._weights = ray.put({k: v.detach() for k, v in model.state_dict().items()})
        self.version = version
        loads = {w.load_weights.remote(self._weights, version): i for i, w in enumerate(self.workers)}
        done, late = ray.wait(list(loads), num_returns=len(loads), timeout=self.sync_timeout_s)
        if late:
            self.version = -1  # some worker may hold other weights: the next collection syncs again
            raise ScaleError(f"weight sync to the rollout workers did not finish within scale.sync_timeout_s="
                             f"{self.sync_timeout_s:g} s ({len(late)} of {len(loads)} workers still busy or stuck): raise "
                             "scale.sync_timeout_s if a worker's episodes outlast it, or look for a stuck env step")
        for ref in done:
            try:
                ray.get(ref)
            except RayActorError:
                self._replace(loads[ref])

    def run(self, which: int, seeds: list[int], group_size: int, sampling: SamplingParams,
            env_id: str) -> tuple[list[TrajectoryGroup], list[RolloutStats]]:
        """Collect ``seeds`` across the workers; returns the groups in seed order and each chunk's counters."""
        chunks = split(seeds, len(self.workers))
        results: list[tuple[list[TrajectoryGroup], RolloutStats] | None] = [None] * len(chunks)
        pending: dict[Any, tuple[int, int]] = {}  # ref -> (chunk index, attempt)

        def submit(i: int, attempt: int) -> None:
            pending[self.workers[i].collect.remote(which, chunks[i], group_size, sampling, env_id)] = (i, attempt)

        for i in range(len(chunks)):
            submit(i, 1)
        while pending:
            [ref], _ = ray.wait(list(pending), num_returns=1)
            i, attempt = pending.pop(ref)
            try:
                results[i] = ray.get(ref)
            except RayActorError as e:
                if attempt >= MAX_ATTEMPTS:
                    raise ScaleError(f"rollout worker {i} died {attempt} times running seeds {chunks[i]} ({e}); "
                                     "the chunk is not retried again: check the workers' memory and logs") from None
                self._replace(i)
                submit(i, attempt + 1)
        groups: list[TrajectoryGroup] = []
        for chunk_groups, _ in results:
            for g in chunk_groups:  # a chunk numbered its groups from 0
                for t in g.trajectories:
                    t.group_index = len(groups)
                groups.append(g)
        return groups, [stats for _, stats in results]

    def close(self) -> None:
        """Stop every worker."""
        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []


def split(items: Sequence[int], n: int) -> list[list[int]]:
    """``items`` in at most ``n`` contiguous, non-empty chunks whose sizes differ by at most one."""
    n = min(n, len(items))
    size, extra = divmod(len(items), n) if n else (0, 0)
    chunks, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        chunks.append(list(items[start:end]))
        start = end
    return chunks


class RayCollector:
    """The :class:`~turnrl.rollout.Collector` interface (``collect``, ``take_stats``) over a :class:`WorkerPool`.

    ``engine`` is the driver's engine: its ``version`` counts the learner's updates (the loop's ``sync_weights``), and
    a collection first sends ``model``'s weights when the pool's version differs (after an update, a resume or a
    rollback). ``which`` picks the workers' training or evaluation collector. The counters are summed over chunks,
    so ``generate_s`` and ``env_s`` add the workers' times.
    """

    def __init__(self, pool: WorkerPool, which: int, engine: Engine, model) -> None:
        self.pool, self.which, self.engine, self.model = pool, which, engine, model
        self.stats = RolloutStats()

    def collect(self, seeds: Sequence[int], group_size: int, sampling: SamplingParams, env_id: str = "") -> list[TrajectoryGroup]:
        """Roll out ``group_size`` episodes for each seed on the workers; returns one group per seed, in seed order."""
        if not seeds:
            return []
        if self.pool.version != self.engine.version:
            self.pool.sync(self.model, self.engine.version)
        groups, chunk_stats = self.pool.run(self.which, list(seeds), group_size, sampling, env_id)
        for s in chunk_stats:
            self.stats.generate_s += s.generate_s
            self.stats.env_s += s.env_s
            self.stats.prompt_tokens += s.prompt_tokens
            self.stats.generated_tokens += s.generated_tokens
        return groups

    def take_stats(self) -> RolloutStats:
        """The counters of every ``collect`` since the last call; starts counting afresh."""
        stats, self.stats = self.stats, RolloutStats()
        return stats


def ray_collectors(cfg: Config, model, tokenizer, engine: Engine, make_parts: RolloutParts,
                   has_eval: bool) -> tuple[RayCollector, RayCollector | None]:
    """The run's training collector (and its evaluation collector when ``has_eval``) over ``scale.workers`` workers."""
    pool = WorkerPool(cfg, model, tokenizer, make_parts, cfg.scale.workers, cfg.scale.sync_timeout_s, engine.version)
    return RayCollector(pool, TRAIN, engine, model), RayCollector(pool, EVAL, engine, model) if has_eval else None
