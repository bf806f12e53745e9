"""A learned critic V(s) for the GAE estimators (``algo.critic: head | separate``).

- ``head``: a linear layer on the policy's last hidden state. The policy's outputs are unchanged (the head
  only reads its hidden states); the value loss back-propagates into the shared trunk and the head is a
  parameter group of the policy's optimizer (lr ``algo.critic_lr``), so both are trained by the same step.
- ``separate``: a trainable copy of the base model with its own scalar head and its own AdamW
  (lr ``algo.critic_lr``); the policy never sees its gradients.

Where values are read. A sequence (one turn's prompt + response with ``per_step`` context, or the whole
conversation with ``full``) is run once; the hidden state at position p summarises tokens 0..p, so the
value at p is V of the state *just before token p + 1*. The value of response token k of a turn whose
response starts at index P is therefore read at position P + k - 1; the turn-level value is the one before
the turn's first response token (P - 1); the bootstrap value of a trajectory is read after its last
response token (the env's next observation is not recorded in the trajectory, so this post-action state
stands in for the next state: a deviation from textbook bootstrapping that only matters on truncation).

The value head starts at zero (weights and bias), so the first GAE step sees V = 0 everywhere.

Cost. A micro-batch runs the prompt prefix its sequences share (system prompt, few-shot exchanges) once and
broadcasts its keys/values (:mod:`turnrl.models.prefix`), as the learner does. With separate passes (a no-grad
prediction for GAE, then a forward/backward for the value loss) turn-level PPO's update cost about 2.2x GRPO's on
FrozenLake (36 s vs 17 s per step, bench/credit.py, 2026-12-04). In ``head`` mode the value loss now rides on the
policy's own forward and backward by default (``algo.fused_value``; ``_FusedValues`` in :mod:`turnrl.learner.learner`:
the value of a response token is read where the policy reads that token's logits), so only the no-grad prediction
remains a pass of its own; :meth:`Critic.backward_value_loss` is the separate pass (``separate`` mode, or
``algo.fused_value=false``).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from turnrl.config import Config
from turnrl.learner import losses
from turnrl.credit.base import ValueInputs
from turnrl.learner.samples import pack_by_length
from turnrl.models.prefix import additive_mask, bucket_rows, common_prefix_len, forward, left_padded, positions_from_mask, prefix_cache
from turnrl.models.precision import use_bf16
from turnrl.types import Termination, Trajectory


@dataclass
class ValueBatch:
    """What the value loss trains on, one entry per trajectory / turn / response token.

    ``returns`` and ``mask`` come from the estimator's ``value_targets`` (mask 1 = this position has a
    target); ``old_values`` are the predictions GAE used (the centre of the value clip).
    """

    trajectories: list[Trajectory]
    returns: list[list[list[float]]]
    mask: list[list[list[int]]]
    old_values: list[list[list[float]]]


@dataclass
class _Seq:
    ids: list[int]
    positions: list[list[int]]  # per turn covered: the positions whose value is V before each response token
    turns: list[int]  # which turns of the trajectory those are
    traj: int
    last: int  # position after the trajectory's last response token (-1 if this sequence does not hold it)


def _layout(trajectories: Sequence[Trajectory]) -> list[_Seq]:
    seqs: list[_Seq] = []
    for i, traj in enumerate(trajectories):
        if traj.context == "full":
            ids: list[int] = []
            pos: list[list[int]] = []
            for turn in traj.turns:
                ids += turn.prompt_ids
                start = len(ids)
                pos.append([max(start + k - 1, 0) for k in range(len(turn.response_ids))])
                ids += turn.response_ids
            if ids:
                seqs.append(_Seq(ids, pos, list(range(len(traj.turns))), i, len(ids) - 1))
            continue
        for j, turn in enumerate(traj.turns):
            ids = turn.prompt_ids + turn.response_ids
            if not ids:
                continue
            p = len(turn.prompt_ids)
            last = len(ids) - 1 if j == len(traj.turns) - 1 else -1
            seqs.append(_Seq(ids, [[max(p + k - 1, 0) for k in range(len(turn.response_ids))]], [j], i, last))
    return seqs


def _chunks(seqs: list[_Seq], token_budget: int) -> list[list[_Seq]]:
    return pack_by_length(seqs, lambda s: len(s.ids), token_budget)


@dataclass(frozen=True)
class CriticParams:
    """What :class:`Critic` needs. ``mode``, ``lr`` and ``value_clip`` are ``algo.critic``, ``algo.critic_lr`` and
    ``algo.value_clip``; the rest mirror the learner's keys (:meth:`from_config` is the one mapping)."""

    mode: str  # "head" | "separate"
    lr: float
    value_clip: float
    grad_clip: float
    micro_batch_tokens: int = 2048
    autocast_bf16: bool = False
    min_shared_prefix: int = 16  # shorter shared prefixes are not worth a separate pass

    @classmethod
    def from_config(cls, cfg: Config) -> "CriticParams":
        a = cfg.algo
        return cls(mode=a.critic, lr=a.critic_lr, value_clip=a.value_clip, grad_clip=cfg.train.grad_clip,
                   micro_batch_tokens=cfg.train.micro_batch_tokens, autocast_bf16=use_bf16(cfg.model.autocast_bf16))


class Critic:
    """V(s) at token positions; see the module docstring for the two modes and the position convention."""

    def __init__(self, policy, params: CriticParams, pad_id: int) -> None:
        if params.mode not in ("head", "separate"):
            raise ValueError(f"critic mode must be 'head' or 'separate' (got {params.mode!r}); algo.critic=none means no critic")
        self.params = params
        self.mode = params.mode
        self.pad_id = pad_id
        if self.mode == "head":
            self.trunk = policy
        else:
            self.trunk = copy.deepcopy(policy)
            self.trunk.train()
            for p in self.trunk.parameters():
                p.requires_grad_(True)
        self.head = torch.nn.Linear(policy.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.optimizer = (
            torch.optim.AdamW(list(self.trunk.parameters()) + list(self.head.parameters()), lr=params.lr)
            if self.mode == "separate" else None
        )

    def joint_param_groups(self) -> list[dict]:
        """Optimizer parameter groups the policy's optimizer must own (the head, in ``head`` mode)."""
        return [{"params": list(self.head.parameters()), "lr": self.params.lr}] if self.mode == "head" else []

    # ------------------------------------------------------------------ forward

    def _autocast(self):
        return torch.autocast("cpu", dtype=torch.bfloat16) if self.params.autocast_bf16 else contextlib.nullcontext()

    def _values(self, chunk: list[_Seq]) -> tuple[torch.Tensor, list[int]]:
        """Values over the chunk's suffixes and, per row, the offset that maps a position to a column.

        The value at position ``p`` of ``chunk[b]`` is ``v[b, p - offsets[b]]`` (fp32). The prefix every
        sequence shares, up to the earliest position read, runs once; suffixes are left-padded and shapes
        are bucketed as in the learner (extra rows repeat row 0 and are never read).
        """
        needed = min(min([p for pos in s.positions for p in pos] + [s.last if s.last >= 0 else len(s.ids) - 1]) for s in chunk)
        P = common_prefix_len([s.ids for s in chunk], limit=needed) if len(chunk) > 1 else 0
        if P < self.params.min_shared_prefix:
            P = 0
        B = bucket_rows(len(chunk))
        ids, att = left_padded([chunk[b if b < len(chunk) else 0].ids for b in range(B)], P, self.pad_id)
        S = ids.shape[1]
        with self._autocast():
            cache = prefix_cache(self.trunk, chunk[0].ids[:P]) if P else None
            dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32
            out, _ = forward(
                self.trunk, cache, input_ids=ids, attention_mask=additive_mask(att, S, dtype),
                position_ids=positions_from_mask(att)[:, P:], use_cache=cache is not None,
                output_hidden_states=True, logits_to_keep=1,
            )
        values = self.head(out.hidden_states[-1].float()).squeeze(-1)
        return values, [len(s.ids) - S for s in chunk]

    @torch.no_grad()
    def predict(self, trajectories: Sequence[Trajectory]) -> ValueInputs:
        """Token values of every response token and each trajectory's bootstrap value (no gradient)."""
        token_values = [[[0.0] * len(turn.response_ids) for turn in t.turns] for t in trajectories]
        bootstrap = [0.0] * len(trajectories)
        for chunk in _chunks(_layout(trajectories), self.params.micro_batch_tokens):
            v, offsets = self._values(chunk)
            for b, (s, off) in enumerate(zip(chunk, offsets)):
                for j, pos in zip(s.turns, s.positions):
                    token_values[s.traj][j] = v[b, [p - off for p in pos]].tolist() if pos else []
                if s.last >= 0:
                    bootstrap[s.traj] = float(v[b, s.last - off])
        return ValueInputs(token_values=token_values, bootstrap=bootstrap)

    # ------------------------------------------------------------------ training

    def zero_grad(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.head.zero_grad(set_to_none=True)

    def backward_value_loss(self, batch: ValueBatch, coef: float) -> dict[str, float]:
        """Accumulate ``coef * mean clipped value loss`` gradients (mean over every target position of the batch).

        Trajectories that ended in an env error are skipped. Returns ``value_loss``, ``value_clip_frac``,
        ``value_error``, ``value_mean`` and ``return_mean`` (logged as ``train/<key>``).
        """
        keep = [t.termination != Termination.ENV_ERROR for t in batch.trajectories]
        total = sum(sum(sum(m) for m in turns) for k, turns in zip(keep, batch.mask) if k)
        sums = {"value_loss": 0.0, "value_clip_frac": 0.0, "value_error": 0.0, "value_mean": 0.0, "return_mean": 0.0}
        if total == 0:
            return sums
        seqs = [s for s in _layout(batch.trajectories) if keep[s.traj]]
        for chunk in _chunks(seqs, self.params.micro_batch_tokens):
            rows, cols, old, ret = [], [], [], []
            for b, s in enumerate(chunk):
                for j, pos in zip(s.turns, s.positions):
                    for k, p in enumerate(pos):
                        if batch.mask[s.traj][j][k]:
                            rows.append(b)
                            cols.append(p)
                            old.append(batch.old_values[s.traj][j][k])
                            ret.append(batch.returns[s.traj][j][k])
            if not rows:
                continue
            values, offsets = self._values(chunk)
            v = values[torch.tensor(rows), torch.tensor([c - offsets[r] for r, c in zip(rows, cols)])]
            old_t, ret_t = torch.tensor(old), torch.tensor(ret)
            per, stats = losses.clipped_value_loss(v, old_t, ret_t, torch.ones_like(v), self.params.value_clip)
            loss = per.sum() / total
            (coef * loss).backward()
            n = len(rows)
            sums["value_loss"] += float(loss.detach())
            sums["value_clip_frac"] += stats["value_clip_frac"] * n / total
            sums["value_error"] += stats["value_error"] * n / total
            sums["value_mean"] += float(v.detach().sum()) / total
            sums["return_mean"] += float(ret_t.sum()) / total
        return sums

    def step(self) -> float | None:
        """Separate model: clip and apply its own optimizer step; returns its grad norm. Head: nothing (the policy's step)."""
        if self.optimizer is None:
            return None
        params = list(self.trunk.parameters()) + list(self.head.parameters())
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.params.grad_clip))
        self.optimizer.step()
        return norm

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        state = {"mode": self.mode, "head": self.head.state_dict()}
        if self.optimizer is not None:
            state["trunk"] = self.trunk.state_dict()
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("mode") != self.mode:
            raise ValueError(f"checkpoint critic mode {state.get('mode')!r} differs from algo.critic={self.mode!r}")
        self.head.load_state_dict(state["head"])
        if self.optimizer is not None:
            self.trunk.load_state_dict(state["trunk"])
            self.optimizer.load_state_dict(state["optimizer"])
