"""Online detectors of training pathologies: each reads the per-step metrics and raises a named alert.

A detector sees the flat metric dict of every step (``rollout/*``, ``train/*``, ``eval/*``) and returns an
:class:`Alert` with the evidence when its condition holds. Thresholds are deliberately conservative: a
detector that cries wolf gets switched off. The trainer logs alerts to ``RUN/alerts.jsonl`` and, by
``monitor.on_alert`` (or ``monitor.actions`` per detector), warns, stops the run, or rolls it back to the
last checkpoint saved before any alert.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Alert:
    name: str
    step: int
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


class Detector:
    """Reads each step's metrics and returns an :class:`Alert` when its condition holds.

    Its windows and counters are its attributes; :meth:`state_dict` and :meth:`load_state_dict` save and
    restore all of them as plain data (deques, sets and dicts included), so a resumed run's detectors see the
    same history as an uninterrupted run's.
    """

    name = "detector"

    def update(self, step: int, metrics: dict[str, float]) -> Alert | None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        return {k: _plain(v) for k, v in vars(self).items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, _restored(v))


def _plain(value: Any) -> Any:
    """``value`` as lists, dicts and scalars; deques and sets are tagged so :func:`_restored` rebuilds them."""
    if isinstance(value, deque):
        return {"__deque__": [_plain(v) for v in value], "maxlen": value.maxlen}
    if isinstance(value, (set, frozenset)):
        return {"__set__": sorted(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _restored(value: Any) -> Any:
    if isinstance(value, dict) and "__deque__" in value:
        return deque((_restored(v) for v in value["__deque__"]), maxlen=value["maxlen"])
    if isinstance(value, dict) and "__set__" in value:
        return set(value["__set__"])
    if isinstance(value, dict):
        return {k: _restored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restored(v) for v in value]
    return value


class NonFinite(Detector):
    """Any metric that is NaN or infinite (loss, gradient norm, rewards...)."""

    name = "non_finite"

    def update(self, step, metrics):
        bad = {k: v for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
        if bad:
            return Alert(self.name, step, f"non-finite metrics: {', '.join(sorted(bad))}", {k: str(v) for k, v in bad.items()})
        return None


class EntropyCollapse(Detector):
    """Policy entropy (nats per response token) below ``floor`` for ``patience`` consecutive steps."""

    name = "entropy_collapse"

    def __init__(self, floor: float = 0.02, patience: int = 3) -> None:
        self.floor, self.patience, self.low = floor, patience, 0

    def update(self, step, metrics):
        ent = metrics.get("train/entropy")
        if ent is None:
            return None
        self.low = self.low + 1 if ent < self.floor else 0
        if self.low == self.patience:
            return Alert(self.name, step, f"entropy {ent:.4f} < {self.floor} for {self.patience} steps: the policy has "
                         "become deterministic and can no longer explore", {"train/entropy": ent})
        return None


class KLBlowup(Detector):
    """KL to the reference (``train/kl``) or to the behaviour policy (``train/approx_kl``) above a ceiling."""

    name = "kl_blowup"

    def __init__(self, max_kl: float = 1.0, max_behaviour_kl: float = 0.5) -> None:
        self.max_kl, self.max_behaviour_kl = max_kl, max_behaviour_kl

    def update(self, step, metrics):
        kl, bkl = metrics.get("train/kl"), metrics.get("train/approx_kl")
        if kl is not None and kl > self.max_kl:
            return Alert(self.name, step, f"KL to the reference {kl:.3f} > {self.max_kl}", {"train/kl": kl})
        if bkl is not None and abs(bkl) > self.max_behaviour_kl:
            return Alert(self.name, step, f"learner/engine KL {bkl:.3f} > {self.max_behaviour_kl}: updates are "
                         "too large or the engine samples from stale weights", {"train/approx_kl": bkl})
        return None


class GradSpike(Detector):
    """Gradient norm above ``factor`` x the median of the last ``window`` steps (after ``warmup`` steps)."""

    name = "grad_spike"

    def __init__(self, factor: float = 10.0, window: int = 10, warmup: int = 3) -> None:
        self.factor, self.warmup = factor, warmup
        self.history: deque[float] = deque(maxlen=window)

    def update(self, step, metrics):
        g = metrics.get("train/grad_norm")
        if g is None or not math.isfinite(g):
            return None
        alert = None
        if len(self.history) >= self.warmup:
            med = statistics.median(self.history)
            if med > 0 and g > self.factor * med:
                alert = Alert(self.name, step, f"gradient norm {g:.3g} is {g / med:.1f}x the recent median {med:.3g}",
                              {"train/grad_norm": g, "median": med})
        self.history.append(g)
        return alert


class LengthExplosion(Detector):
    """Mean response length above ``factor`` x its level over the first ``baseline_steps`` steps."""

    name = "length_explosion"

    def __init__(self, factor: float = 3.0, baseline_steps: int = 3, min_tokens: float = 8.0) -> None:
        self.factor, self.baseline_steps, self.min_tokens = factor, baseline_steps, min_tokens
        self.first: list[float] = []

    def update(self, step, metrics):
        n = metrics.get("rollout/response_tokens")
        if n is None:
            return None
        if len(self.first) < self.baseline_steps:
            self.first.append(n)
            return None
        base = sum(self.first) / len(self.first)
        if n > self.min_tokens and n > self.factor * base:
            return Alert(self.name, step, f"responses average {n:.1f} tokens, {n / base:.1f}x the first steps' {base:.1f}",
                         {"rollout/response_tokens": n, "baseline": base})
        return None


def _slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against 0..n-1."""
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    den = sum((x - mx) ** 2 for x in range(n))
    return sum((x - mx) * (y - my) for x, y in enumerate(ys)) / den


class RewardHacking(Detector):
    """The training reward rises while the trusted held-out success does not.

    Over the last ``window`` steps the training reward's trend (least-squares slope x window) must rise by
    more than ``min_rise`` while the last ``evals`` evaluations of ``eval/success_rate`` are flat or falling
    (no gain above ``tolerance``) *and* the latest held-out success trails the window's training success
    by more than ``min_gap``. The gap condition keeps a healthy run on a plateau (training success and
    held-out success both high, evaluations wobbling within noise) silent. Also flags a named reward component other than the outcome rising by
    ``min_rise`` while ``rollout/success_rate`` stays flat: the policy is earning a side reward (format,
    length, shaping) instead of solving the task.
    """

    name = "reward_hacking"

    def __init__(self, window: int = 8, min_rise: float = 0.3, evals: int = 3, tolerance: float = 0.02, min_gap: float = 0.3) -> None:
        self.window, self.min_rise, self.evals, self.tolerance, self.min_gap = window, min_rise, evals, tolerance, min_gap
        self.reward: deque[float] = deque(maxlen=window)
        self.success: deque[float] = deque(maxlen=window)
        self.components: dict[str, deque[float]] = {}
        self.eval_success: list[float] = []
        self.fired: set[str] = set()

    def update(self, step, metrics):
        if "rollout/reward" in metrics:
            self.reward.append(metrics["rollout/reward"])
            self.success.append(metrics.get("rollout/success_rate", 0.0))
        for k, v in metrics.items():
            if k.startswith("rollout/reward/") and k != "rollout/reward/outcome":
                self.components.setdefault(k, deque(maxlen=self.window)).append(v)
        if "eval/success_rate" in metrics:
            self.eval_success.append(metrics["eval/success_rate"])
        if len(self.reward) < self.window:
            return None
        rise = _slope(list(self.reward)) * (self.window - 1)
        recent = self.eval_success[-self.evals :]
        if "verifier" not in self.fired and rise > self.min_rise and len(recent) == self.evals:
            train_success = sum(self.success) / len(self.success)
            if max(recent[1:]) <= recent[0] + self.tolerance and train_success - recent[-1] > self.min_gap:
                self.fired.add("verifier")
                return Alert(self.name, step, f"training reward rose by {rise:.2f} over {self.window} steps and training "
                             f"success is {train_success:.2f}, while held-out success went "
                             f"{' -> '.join(f'{x:.2f}' for x in recent)}",
                             {"reward_trend": rise, "train_success": train_success, "eval_success": recent})
        success_rise = _slope(list(self.success)) * (self.window - 1)
        for k, values in self.components.items():
            if len(values) < self.window or k in self.fired:
                continue
            comp_rise = _slope(list(values)) * (self.window - 1)
            if comp_rise > self.min_rise and success_rise <= self.tolerance:
                self.fired.add(k)
                return Alert(self.name, step, f"reward component '{k.rsplit('/', 1)[-1]}' rose by {comp_rise:.2f} over "
                             f"{self.window} steps while the success rate did not ({success_rise:+.2f})",
                             {"component": k, "component_trend": comp_rise, "success_trend": success_rise})
        return None


class InvalidActionExploit(Detector):
    """Reward rising while the valid-action rate falls: the policy profits from invalid actions."""

    name = "invalid_action_exploit"

    def __init__(self, window: int = 6, min_drop: float = 0.2) -> None:
        self.window, self.min_drop = window, min_drop
        self.valid: deque[float] = deque(maxlen=window)
        self.reward: deque[float] = deque(maxlen=window)
        self.fired = False

    def update(self, step, metrics):
        if "rollout/valid_action_rate" not in metrics:
            return None
        self.valid.append(metrics["rollout/valid_action_rate"])
        self.reward.append(metrics.get("rollout/reward", 0.0))
        if self.fired or len(self.valid) < self.window:
            return None
        drop = -_slope(list(self.valid)) * (self.window - 1)
        rise = _slope(list(self.reward)) * (self.window - 1)
        if drop > self.min_drop and rise > 0:
            self.fired = True
            return Alert(self.name, step, f"valid-action rate fell by {drop:.2f} while reward rose by {rise:.2f}",
                         {"valid_trend": -drop, "reward_trend": rise})
        return None


class TemplateCollapse(Detector):
    """Echo trap (RAGEN): responses to *different* inputs become near-identical.

    Reads ``rollout/cross_input_similarity`` (mean token-set Jaccard similarity of first-turn responses to
    different tasks). Tasks with a small action vocabulary are similar from the start, so the detector
    compares with the run's own first ``window`` steps: it fires when the mean of the last ``window`` steps is
    at least ``level`` and above that baseline by ``min_rise``.
    """

    name = "template_collapse"

    def __init__(self, window: int = 5, level: float = 0.9, min_rise: float = 0.3) -> None:
        self.window, self.level, self.min_rise = window, level, min_rise
        self.values: list[float] = []
        self.fired = False

    def update(self, step, metrics):
        v = metrics.get("rollout/cross_input_similarity")
        if v is None or self.fired:
            return None
        self.values.append(v)
        if len(self.values) < 2 * self.window:
            return None
        base = sum(self.values[: self.window]) / self.window
        recent = sum(self.values[-self.window :]) / self.window
        if recent >= self.level and recent - base >= self.min_rise:
            self.fired = True
            return Alert(self.name, step, f"responses to different tasks have become near-identical: similarity "
                         f"{recent:.2f} over the last {self.window} steps, {base:.2f} at the start",
                         {"recent_similarity": recent, "baseline_similarity": base})
        return None


class EnvFailures(Detector):
    """Episodes ending in an env error (``rollout/termination/env_error``, or ``eval/...`` in an evaluation) at a rate
    of at least ``max_rate``: the env or its server is failing, and the step trains on little or nothing.

    Fires when the failures begin, and again only after a step below the rate.
    """

    name = "env_failures"

    def __init__(self, max_rate: float = 0.5) -> None:
        self.max_rate = max_rate
        self.failing = False

    def update(self, step, metrics):
        rates = {k: v for k in ("rollout/termination/env_error", "eval/termination/env_error") if (v := metrics.get(k)) is not None}
        if not rates:
            return None
        bad = {k: v for k, v in rates.items() if v >= self.max_rate}
        began = bool(bad) and not self.failing
        self.failing = bool(bad)
        if not began:
            return None
        where = ", ".join(f"{k} = {v:.2f}" for k, v in bad.items())
        return Alert(self.name, step, f"env errors ended most episodes ({where}): the env or its server is failing, so "
                     "the step trains on little or nothing; the errors are in trajectories.jsonl", bad)


def default_detectors() -> list[Detector]:
    return [NonFinite(), EntropyCollapse(), TemplateCollapse(), KLBlowup(), GradSpike(), LengthExplosion(), RewardHacking(),
            InvalidActionExploit(), EnvFailures()]
