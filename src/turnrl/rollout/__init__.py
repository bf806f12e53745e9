"""Rollout: the collector drives envs against an engine and builds Trajectories with exact token ids
(:mod:`~turnrl.rollout.collector`)."""

from turnrl.rollout.collector import Collector, EnvFault, RolloutStats

__all__ = ["Collector", "EnvFault", "RolloutStats"]
