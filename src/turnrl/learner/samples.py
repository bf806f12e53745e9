"""Training samples and their batch layout: exact token ids, a loss mask on the model's own tokens.

- :func:`build_samples` lays out one sample per turn (``per_step``) or per trajectory (``full``);
- :func:`micro_batches` packs samples by prompt and length under a token budget, so padding stays small;
- :func:`collate` lays a micro-batch out as one shared prompt prefix plus left-padded suffixes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from turnrl.models.prefix import bucket_rows, common_prefix_len, left_padded, positions_from_mask, round_up
from turnrl.types import Advantages, Termination, TrainSample, Trajectory

T = TypeVar("T")


def build_samples(trajectories: Sequence[Trajectory], advantages: Advantages) -> list[TrainSample]:
    """One sample per turn (``per_step`` trajectories) or per trajectory (``full``).

    Each response token gets its advantage from ``advantages`` (:meth:`Advantages.token_values`: the turn's
    value on every token, or the token-level estimators' own per-token values) and the policy version of its turn
    (``Turn.version``) and its trajectory's role (``agent``: per-role policies route on it). Trajectories that ended
    in an env error are not trained on.
    """
    if len(advantages) != len(trajectories):
        raise ValueError(f"{len(trajectories)} trajectories but advantages for {len(advantages)}")
    samples: list[TrainSample] = []
    for i, traj in enumerate(trajectories):
        if traj.termination == Termination.ENV_ERROR:
            continue
        if len(advantages.turns[i]) != len(traj.turns):
            raise ValueError(f"trajectory {i} has {len(traj.turns)} turns but {len(advantages.turns[i])} advantages")
        if traj.context == "full":
            ids, mask, lps, advs, versions = [], [], [], [], []
            for j, turn in enumerate(traj.turns):
                n = len(turn.response_ids)
                ids += turn.prompt_ids + turn.response_ids
                mask += [0] * len(turn.prompt_ids) + [1] * n
                lps += [0.0] * len(turn.prompt_ids) + list(turn.logprobs)
                advs += [0.0] * len(turn.prompt_ids) + advantages.token_values(i, j, n)
                versions += [0] * len(turn.prompt_ids) + [turn.version] * n
            if any(mask):
                samples.append(TrainSample(ids, mask, lps, advs, traj_index=i, turn_index=-1, policy_versions=versions,
                                           agent=traj.agent))
            continue
        for j, turn in enumerate(traj.turns):
            n, p = len(turn.response_ids), len(turn.prompt_ids)
            if n == 0:
                continue
            samples.append(
                TrainSample(
                    input_ids=turn.prompt_ids + turn.response_ids,
                    loss_mask=[0] * p + [1] * n,
                    behaviour_logprobs=[0.0] * p + list(turn.logprobs),
                    advantages=[0.0] * p + advantages.token_values(i, j, n),
                    traj_index=i,
                    turn_index=j,
                    policy_versions=[0] * p + [turn.version] * n,
                    agent=traj.agent,
                )
            )
    return samples


def micro_batches(samples: Sequence[TrainSample], token_budget: int, by_prompt: bool = True) -> list[list[TrainSample]]:
    """Group samples of similar length so each micro-batch's padded shape after the shared prefix fits ``token_budget``
    (:func:`pack_by_length`).

    The prompt prefix a micro-batch's samples share is computed once (see :func:`collate`), so only the rest of
    each row counts against the budget. Samples are first split by prompt where that runs fewer positions
    (:func:`prefix_groups`: the roles of a multi-agent or hierarchical env, each with its own system prompt, or the
    samples of one map), and each group is packed on its own (``by_prompt=False``, ``train.group_by_prompt=false``:
    one group). A batch always holds at least one row.
    """
    groups = prefix_groups(samples, token_budget) if by_prompt else [list(samples)]
    return [mb for group in groups for mb in _packed(group, token_budget)]


def _packed(group: Sequence[TrainSample], token_budget: int) -> list[list[TrainSample]]:
    """``group``'s micro-batches: by length, the budget counting each row after the prefix the group shares."""
    shared = shared_prefix_len(group)
    return pack_by_length(group, lambda s: len(s) - shared, token_budget)


def prefix_groups(samples: Sequence[TrainSample], token_budget: int) -> list[list[TrainSample]]:
    """``samples`` split where their prompts part, wherever that saves positions to compute.

    Sorted by prompt (the tokens before each sample's first trained one), samples with a common prefix are
    neighbours. A group whose members all share ``P`` tokens is cut between every two neighbours sharing only ``P``;
    each part then shares more. The cut is kept when the parts, each packed by :func:`micro_batches`' rule, cost
    less than the group would: the positions they run (:func:`layout_positions`: each micro-batch's prefix once
    plus its padded rows) and :data:`MICRO_BATCH_COST` per micro-batch, so prompts that part only to save a few
    padding positions are not scattered over many small micro-batches. Parts are cut again by the same rule, and a
    cut is also kept where it pays only through the cuts inside its parts (:func:`_split`). (At
    2,048-token micro-batches the default recipe's step-0 batch split by map observation: 10 groups, 10,660 -> 6,543
    positions.) The gradient does not depend on the grouping (the learner's normalisers are over the whole update).
    """
    if len(samples) < 2:
        return [list(samples)]
    parts = _split(sorted(samples, key=lambda s: s.input_ids[: s.loss_mask.index(1)]), token_budget)
    if len(parts) == 1:
        return [list(samples)]
    part_of = {id(x): k for k, part in enumerate(parts) for x in part}
    groups: dict[int, list[TrainSample]] = {}
    for x in samples:  # groups in order of first appearance, each in the samples' own order (ties batch as before)
        groups.setdefault(part_of[id(x)], []).append(x)
    return list(groups.values())


def _split(ordered: list[TrainSample], token_budget: int) -> list[list[TrainSample]]:
    """:func:`prefix_groups`' parts of ``ordered`` (sorted by prompt), in that order: over the tree of cuts (a group's
    children are its :func:`_parts`), each group kept whole or replaced by its children's best, whichever costs less,
    so a cut that pays only through the cuts below it is still found. Children first, on a stack (a long prompt can
    split many times: no recursion)."""
    best: dict[int, tuple[int, list[list[TrainSample]]]] = {}  # id(group) -> (cost, its best parts)
    children: dict[int, list[list[TrainSample]]] = {}
    stack = [(ordered, False)]
    while stack:
        group, ready = stack.pop()
        if not ready:
            parts = _parts(group) if len(group) > 1 else [group]
            if len(parts) > 1:
                children[id(group)] = parts
                stack.append((group, True))
                stack.extend((part, False) for part in reversed(parts))
                continue
        whole = _packed_cost(group, token_budget)
        split = sum(best[id(part)][0] for part in children[id(group)]) if ready else whole
        best[id(group)] = (split, [g for part in children[id(group)] for g in best[id(part)][1]]) if split < whole \
            else (whole, [group])
    return best[id(ordered)][1]


MICRO_BATCH_COST = 128
"""What one more micro-batch costs beyond its positions, counted in positions: its prefix's own pass, one more call
of every kernel, smaller matrix products. On the hierarchy's oracle batch 24 fewer micro-batches with 5% fewer
positions made the update 1.23x faster (bench/RESULTS.md, 2026-12-06), about 1.9 s, or 200-odd positions, each."""


def _packed_cost(group: Sequence[TrainSample], token_budget: int) -> int:
    """Positions the learner runs for ``group`` packed into micro-batches as one group, plus
    :data:`MICRO_BATCH_COST` per micro-batch."""
    batches = _packed(group, token_budget)
    return sum(layout_positions(mb) for mb in batches) + MICRO_BATCH_COST * len(batches)


def _parts(group: list[TrainSample]) -> list[list[TrainSample]]:
    """``group`` (sorted by prompt) cut between every two neighbours that share no more than the whole group does."""
    shared = shared_prefix_len(group)
    parts, start = [], 0
    for i in range(1, len(group)):
        if shared_prefix_len(group[i - 1 : i + 1]) <= shared:
            parts.append(group[start:i])
            start = i
    parts.append(group[start:])
    return parts


def pack_by_length(items: Sequence[T], length: Callable[[T], int], token_budget: int) -> list[list[T]]:
    """Sort ``items`` by ``length`` (stable) and cut them into the batches that run the fewest positions, each within
    ``token_budget`` as laid out: ``bucket_rows(rows) * round_up(longest, 8)``, the rows and length :func:`collate`
    (and the critic's layout) round up to, plus :data:`MICRO_BATCH_COST` per batch.

    Counting the rounded shape, not ``rows * longest``, keeps a batch from spilling into padding rows that run forward
    and backward for nothing: 58 rows of 40 tokens fit ``rows * longest <= 2048`` but run as 64 (2,560 positions, 22%
    of them padding; a default-recipe batch after step 2). Cutting the sorted items where the total is least, not
    wherever the next one overflows, keeps a few long items from ending up in a batch of their own. A batch always
    holds at least one item.
    """
    order = sorted(items, key=length)
    lengths = [round_up(length(x), 8) for x in order]
    best, start = [0] + [None] * len(order), [0] * (len(order) + 1)  # best[j]: the least cost of order[:j]
    for j in range(1, len(order) + 1):
        for i in range(j - 1, -1, -1):  # the last batch is order[i:j]; its shape only grows as i falls
            shape = bucket_rows(j - i) * lengths[j - 1]
            if shape > token_budget and i < j - 1:
                break
            cost = best[i] + shape + MICRO_BATCH_COST
            if best[j] is None or cost < best[j]:
                best[j], start[j] = cost, i
    batches, j = [], len(order)
    while j > 0:
        batches.append(order[start[j] : j])
        j = start[j]
    return batches[::-1]


def shared_prefix_len(samples: Sequence[TrainSample]) -> int:
    """Prefix shared by every sample, ending one token before the earliest loss-masked token."""
    if len(samples) < 2:
        return 0
    first_loss = min(s.loss_mask.index(1) for s in samples)
    return common_prefix_len([s.input_ids for s in samples], limit=first_loss - 1)


@dataclass
class Batch:
    """A micro-batch laid out as shared prefix + left-padded suffixes. Shapes: (batch, suffix_len)."""

    prefix: list[int]
    ids: torch.Tensor
    attention: torch.Tensor  # (batch, prefix_len + suffix_len)
    positions: torch.Tensor
    keep: int  # logits are needed only for the last `keep` positions
    targets: torch.Tensor  # (batch, keep - 1): token predicted at each kept position but the last
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor


def layout_positions(samples: Sequence[TrainSample], min_shared_prefix: int = 16) -> int:
    """Positions :func:`collate` lays ``samples`` out in: the shared prefix once, plus the rows (rounded up to a row
    bucket) times the longest suffix (rounded up to 8)."""
    P = _layout_prefix(samples, min_shared_prefix)
    return P + bucket_rows(len(samples)) * round_up(max(len(s) for s in samples) - P, 8)


def _layout_prefix(samples: Sequence[TrainSample], min_shared_prefix: int) -> int:
    """The prefix :func:`collate` runs once: the shared one, if at least ``min_shared_prefix`` long. It stops one
    token before the first response token, so every predicting position is in the suffix."""
    P = shared_prefix_len(samples)
    return P if P >= min_shared_prefix else 0


def collate(samples: Sequence[TrainSample], pad_id: int, min_shared_prefix: int = 16) -> Batch:
    """Lay out ``samples`` as one shared prefix plus left-padded suffixes.

    Rows and suffix length are rounded up to a few bucket sizes (extra rows copy row 0 with an all-zero
    loss mask), because CPU kernels are specialised per shape and a new shape costs more than the padding.
    """
    first_loss = [s.loss_mask.index(1) for s in samples]
    P = _layout_prefix(samples, min_shared_prefix)
    n = len(samples)
    B = bucket_rows(n)
    ids, attention = left_padded([(samples[b] if b < n else samples[0]).input_ids for b in range(B)], P, pad_id)
    keep = max(len(s) - f for s, f in zip(samples, first_loss)) + 1
    targets = torch.full((B, keep - 1), pad_id, dtype=torch.long)
    mask = torch.zeros((B, keep - 1))
    old = torch.zeros((B, keep - 1))
    adv = torch.zeros((B, keep - 1))
    tail = keep - 1  # right-aligned: the last `keep-1` tokens of every row are the targets
    for b in range(B):
        s = samples[b] if b < n else samples[0]
        seq = s.input_ids[-tail:]
        off = tail - len(seq)
        targets[b, off:] = torch.tensor(seq)
        if b < n:
            mask[b, off:] = torch.tensor(s.loss_mask[-tail:], dtype=torch.float)
            old[b, off:] = torch.tensor(s.behaviour_logprobs[-tail:])
            adv[b, off:] = torch.tensor(s.advantages[-tail:])
    positions = positions_from_mask(attention)[:, P:]
    return Batch(list(samples[0].input_ids[:P]), ids, attention, positions, keep, targets, mask, old, adv)
