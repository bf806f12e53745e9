"""The learner: samples laid out from trajectories, the policy loss, the critic, one optimizer step per batch.

- :mod:`~turnrl.learner.samples`: exact-token training samples, micro-batching and the shared-prefix layout;
- :mod:`~turnrl.learner.losses`: PPO-clip, loss aggregation, KL estimators, entropy;
- :mod:`~turnrl.learner.learner`: :class:`Learner`, the micro-batched update;
- :mod:`~turnrl.learner.critic`: :class:`Critic`, a learned V(s) for the GAE estimators;
- :mod:`~turnrl.learner.heap`: what the C heap keeps of an update's freed memory, and when it is given back.
"""

from turnrl.learner.critic import Critic, CriticParams, ValueBatch
from turnrl.learner.learner import Learner, LearnerParams
from turnrl.learner.samples import build_samples, collate, micro_batches

__all__ = ["Critic", "CriticParams", "Learner", "LearnerParams", "ValueBatch", "build_samples", "collate", "micro_batches"]
