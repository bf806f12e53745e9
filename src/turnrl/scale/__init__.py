"""Past one process (``docs/scale.md``): rollout workers as Ray actors (:mod:`~turnrl.scale.workers`), a
data-parallel learner over torch.distributed ranks (:mod:`~turnrl.scale.distributed`), envs in Ray actors
(:mod:`~turnrl.scale.envpool`), and a simulated slow tool for measuring them (:mod:`~turnrl.scale.latency`). Ray is
an optional extra (``pip install 'turnrl[scale]'``), imported only when ``scale.workers > 0`` or ``scale.env_actors > 0``.
"""


class ScaleError(RuntimeError):
    """A rollout worker or learner rank failed, or a weight sync / all-reduce timed out; the message names the knob."""


__all__ = ["ScaleError"]
