"""``RUN/trajectories.jsonl``: a sample of each step's trajectories, token by token, for ``turnrl report``.

Format: docs/metrics.md, "trajectories.jsonl".
"""

from __future__ import annotations

import json
from pathlib import Path

from turnrl.config import AlgoConfig
from turnrl.credit.filters import keep_informative_groups
from turnrl.types import Advantages, Termination, TrainSample, TrajectoryGroup


def write_trajectories(run_dir: Path, step: int, groups: list[TrajectoryGroup], advantages: Advantages, tokenizer,
                       limit: int, samples: list[TrainSample] | None = None, algo: AlgoConfig | None = None) -> None:
    """Append the step's first ``limit`` trajectories to ``trajectories.jsonl``.

    Each turn carries its prompt ids (the whole prompt under ``per_step``; under ``full`` the ids new since the
    previous response, so a trajectory's conversation is its turns' prompt and response ids in order), its tokens, behaviour logprobs, the turn advantage, and per response token:
    ``token_advantages`` (what the learner gives each token) and ``loss_mask`` (1 when the token's
    policy-gradient term is trained: it is in a sample handed to the learner and no filter zeroed its
    advantage). ``masked_by`` names why a turn is not trained (``env_error``, ``group_filter``, ``overlong``,
    ``zero_advantage`` (skipped sample), ``not_trained``) or is null. ``entropies`` appears only when the engine
    recorded per-token entropies in ``Turn.info["token_entropies"]``. ``samples`` are the samples the learner
    received and ``algo`` the AlgoConfig; without them the mask is left out.
    """
    if limit <= 0:
        return
    flat = [t for g in groups for t in g.trajectories]
    group_kept = [True] * len(groups)
    if algo is not None and algo.group_keep_fraction < 1.0:
        group_kept = keep_informative_groups(groups, algo.group_keep_fraction)  # as the loop's credit step chose
    traj_kept = [k for g, k in zip(groups, group_kept) for _ in g.trajectories]
    trained = {(s.traj_index, s.turn_index) for s in samples} if samples is not None else None

    def masked_by(i: int, j: int, traj, turn) -> str | None:
        if traj.termination == Termination.ENV_ERROR:
            return "env_error"
        if not traj_kept[i]:
            return "group_filter"
        if algo is not None and algo.mask_overlong and turn.finish_reason == "length":
            return "overlong"
        if (i, j) not in trained and (i, -1) not in trained:
            return "zero_advantage" if algo is not None and algo.skip_zero_advantage else "not_trained"
        return None

    rows = []
    for i, traj in enumerate(flat[:limit]):
        turns = []
        for j, t in enumerate(traj.turns):
            n = len(t.response_ids)
            row = {
                "observation": t.observation,
                "prompt_ids": t.prompt_ids,
                "response": t.response_text,
                "response_tokens": tokenizer.convert_ids_to_tokens(t.response_ids),
                "response_ids": t.response_ids,
                "logprobs": t.logprobs,
                "advantage": advantages.turns[i][j],
                "token_advantages": advantages.token_values(i, j, n),
                "actions": t.actions,
                "valid": t.valid,
                "reward": t.reward,
                "reward_components": t.reward_components,
                "finish_reason": t.finish_reason,
            }
            entropies = t.info.get("token_entropies")
            if entropies is not None and len(entropies) == n:
                row["entropies"] = [float(e) for e in entropies]
            row |= {k: t.info[k] for k in ("memory", "context") if k in t.info}  # turnrl.agent.memory, budgeted context
            if trained is not None:
                why = masked_by(i, j, traj, t)
                row["masked_by"] = why
                row["loss_mask"] = [int(why is None)] * n
            turns.append(row)
        rows.append({
            "step": step,
            "index": i,
            "group_index": traj.group_index,
            "env_id": traj.env_id,
            "seed": traj.seed,
            "success": traj.success,
            "termination": traj.termination.value,
            "error": traj.error,
            "reward": traj.total_reward,
            "agent": traj.agent,
            "team_return": traj.team_return,
            "turns": turns,
        })
    with (run_dir / "trajectories.jsonl").open("a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
