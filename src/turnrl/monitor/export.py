"""``turnrl export RUN --out DIR``: a run's recorded trajectories as a Hugging Face dataset (Parquet), one row per turn.

Why one row per turn: with the ``per_step`` context (the default) each turn is its own training sample, and in
every context a turn is where the token-aligned columns live (``response_ids``, ``logprobs``, ``loss_mask``,
``token_advantages`` have one entry per response token, the same length in a row). A trajectory is the rows sharing
``step`` and ``trajectory``, in ``turn`` order; its own fields (``success``, ``trajectory_reward``, ...) repeat on
each of its rows. Columns: docs/export.md.

What is exported is what the run recorded in ``trajectories.jsonl``: the first ``log.sample_trajectories``
trajectories of each step (docs/metrics.md), with the task key of each from ``task_keys.jsonl``. Prompts are their
observation text and their exact ``prompt_ids`` (null in runs recorded before the records kept them).

``turnrl export DEMOS.jsonl --out DIR`` exports a demonstration file (``docs/demos.md``: what ``turnrl sft`` writes
as ``RUN/demos.jsonl``) the same way, one row per turn (:func:`export_demonstrations`).

Needs ``pyarrow`` (``pip install 'turnrl[export]'``, which brings ``datasets`` to load the result).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import yaml

from turnrl.monitor.files import read_jsonl

DATA_FILE = Path("data") / "train-00000-of-00001.parquet"  # the hub's layout: `load_dataset(DIR)` finds it as split train


class Exported(NamedTuple):
    """Where the export went and what it holds."""

    path: Path  # the Parquet file
    turns: int  # its rows
    trajectories: int


def export_trajectories(run_dir: Path | str, out: Path | str) -> Exported:
    """Write ``run_dir``'s recorded trajectories to ``out/data/*.parquet`` with a dataset card ``out/README.md``.

    Load it with ``datasets.load_dataset("parquet", data_files="OUT/data/*.parquet")`` or ``load_dataset("OUT")``.
    Raises ``FileNotFoundError`` when ``run_dir`` holds no recorded trajectory and ``FileExistsError`` when ``out``
    exists and is not empty (nothing is written then).
    """
    run_dir, out = Path(run_dir), Path(out)
    records = read_jsonl(run_dir / "trajectories.jsonl")
    if not records:
        raise FileNotFoundError(f"{run_dir / 'trajectories.jsonl'} is missing or empty: pass a run directory that `turnrl "
                                "train` wrote with log.sample_trajectories > 0 and at least one finished step")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already exists and is not empty: choose another --out, or delete it")
    pa, pq = _pyarrow()
    rows = turn_rows(records, _task_keys(run_dir), run_dir.name)
    components = sorted({k for r in rows for k in r["reward_components"]})
    table = pa.Table.from_pylist(rows, schema=_schema(pa, components))
    (out / DATA_FILE).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / DATA_FILE)
    (out / "README.md").write_text(_dataset_card(run_dir, records, len(rows)))
    return Exported(out / DATA_FILE, len(rows), len(records))


def export_demonstrations(path: Path | str, out: Path | str) -> Exported:
    """Write the demonstration JSONL at ``path`` (``docs/demos.md``) to ``out/data/*.parquet`` with a dataset card.

    One row per turn: the episode's ``source``, ``env_id``, ``seed``, ``task_key``, ``context``, ``success``,
    ``termination`` and ``trajectory_reward`` on each of its rows, then the turn's ``observation``, ``response``,
    exact ``prompt_ids`` and ``response_ids``, ``loss_mask`` (1 on every response token: a demonstration trains all of
    them), ``actions``, ``valid``, ``reward``, ``finish_reason``. Raises like :func:`export_trajectories`.
    """
    from turnrl.agent.demos import FORMAT

    path, out = Path(path), Path(out)
    episodes = read_jsonl(path) if path.is_file() else []
    if not episodes or any(e.get("format") != FORMAT for e in episodes):
        raise FileNotFoundError(f"{path} is not a demonstration file (JSONL rows of format {FORMAT!r}, docs/demos.md): "
                                "pass the demos.jsonl that `turnrl sft` wrote, or a run directory for its trajectories")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already exists and is not empty: choose another --out, or delete it")
    pa, pq = _pyarrow()
    rows = [{"source": e["source"], "env_id": e["env_id"], "seed": e["seed"], "task_key": e["task_key"],
             "context": e["context"], "success": e["success"], "termination": e["termination"],
             "trajectory_reward": e["reward"], "trajectory": i, "turn": j, "observation": t["observation"],
             "response": t["response_text"], "prompt_ids": t["prompt_ids"], "response_ids": t["response_ids"],
             "loss_mask": [1] * len(t["response_ids"]), "actions": t["actions"], "valid": t["valid"],
             "reward": t["reward"], "finish_reason": t["finish_reason"]}
            for i, e in enumerate(episodes) for j, t in enumerate(e["turns"])]
    text, integer, real = pa.string(), pa.int64(), pa.float64()
    schema = pa.schema([
        ("source", text), ("env_id", text), ("seed", integer), ("task_key", text), ("context", text),
        ("success", pa.bool_()), ("termination", text), ("trajectory_reward", real), ("trajectory", integer),
        ("turn", integer), ("observation", text), ("response", text), ("prompt_ids", pa.list_(integer)),
        ("response_ids", pa.list_(integer)), ("loss_mask", pa.list_(pa.int8())), ("actions", pa.list_(text)),
        ("valid", pa.bool_()), ("reward", real), ("finish_reason", text),
    ])
    (out / DATA_FILE).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out / DATA_FILE)
    envs = sorted({e["env_id"] for e in episodes})
    (out / "README.md").write_text(_card(
        f"Demonstrations `{path.name}`", ["demonstrations", *envs],
        f"{len(episodes)} demonstration episodes ({len(rows)} turns, one row per turn) on {', '.join(envs)}, "
        "from turnrl's demonstration format (docs/demos.md): the exact prompt and response token ids, with the loss "
        "mask over the response tokens an SFT step trains on. An episode is the rows sharing `trajectory`, in `turn` "
        "order."))
    return Exported(out / DATA_FILE, len(rows), len(episodes))


def turn_rows(records: list[dict[str, Any]], keys: dict[tuple[int, int], str | None], run: str) -> list[dict[str, Any]]:
    """One row per turn of the ``trajectories.jsonl`` records; ``keys`` maps ``(step, seed)`` to the task key."""
    rows = []
    for rec in records:
        trajectory = {
            "run": run, "step": rec["step"], "trajectory": rec["index"], "group_index": rec["group_index"],
            "env_id": rec["env_id"], "seed": rec["seed"], "task_key": keys.get((rec["step"], rec["seed"])),
            "success": rec["success"], "termination": rec["termination"], "error": rec["error"],
            "trajectory_reward": rec["reward"],
        }
        for j, t in enumerate(rec["turns"]):
            rows.append({
                **trajectory, "turn": j, "observation": t["observation"], "response": t["response"],
                "prompt_ids": t.get("prompt_ids"), "response_ids": t["response_ids"], "logprobs": t["logprobs"], "loss_mask": t.get("loss_mask"),
                "token_advantages": t["token_advantages"], "advantage": t["advantage"], "masked_by": t.get("masked_by"),
                "reward": t["reward"], "reward_components": t["reward_components"], "actions": t["actions"],
                "valid": t["valid"], "finish_reason": t["finish_reason"],
            })
    return rows


def _task_keys(run_dir: Path) -> dict[tuple[int, int], str | None]:
    """``(step, seed) -> task key`` of the training tasks in ``task_keys.jsonl`` (trajectories are training tasks)."""
    return {(row["step"], t["seed"]): t["key"] for row in read_jsonl(run_dir / "task_keys.jsonl")
            if row.get("split") == "train" for t in row.get("tasks", [])}


def _schema(pa, components: list[str]):
    """The Arrow schema of :func:`turn_rows`; ``reward_components`` is a struct of the run's component names."""
    text, integer, real = pa.string(), pa.int64(), pa.float64()
    fields = [
        ("run", text), ("step", integer), ("trajectory", integer), ("turn", integer), ("group_index", integer),
        ("env_id", text), ("seed", integer), ("task_key", text), ("success", pa.bool_()), ("termination", text),
        ("error", text), ("trajectory_reward", real), ("observation", text), ("response", text),
        ("prompt_ids", pa.list_(integer)), ("response_ids", pa.list_(integer)), ("logprobs", pa.list_(real)), ("loss_mask", pa.list_(pa.int8())),
        ("token_advantages", pa.list_(real)), ("advantage", real), ("masked_by", text), ("reward", real),
        ("actions", pa.list_(text)), ("valid", pa.bool_()), ("finish_reason", text),
    ]
    if components:  # Parquet cannot store a struct without fields
        fields.append(("reward_components", pa.struct([(c, real) for c in components])))
    return pa.schema(fields)


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("turnrl export writes Parquet with pyarrow, which is not installed: "
                          "pip install 'turnrl[export]'") from None
    return pa, pq


def _dataset_card(run_dir: Path, records: list[dict[str, Any]], turns: int) -> str:
    """The dataset's README.md for a run's trajectories."""
    envs = sorted({r["env_id"] for r in records})
    steps = sorted({r["step"] for r in records})
    return _card(
        f"Trajectories of the turnrl run `{run_dir.name}`", ["trajectories", *envs],
        f"{len(records)} trajectories ({turns} turns, one row per turn) sampled by the policy on {', '.join(envs)} at "
        f"training steps {steps[0]} to {steps[-1]}: the first `log.sample_trajectories` trajectories of each step, with "
        "the exact prompt and response token ids, the behaviour logprobs, the loss mask, the per-token advantages and "
        "the rewards. A trajectory is the rows sharing `step` and `trajectory`, in `turn` order.")


def _card(title: str, tags: list[str], what: str) -> str:
    """A dataset README.md: hub front matter pointing at the Parquet file, a title, what the rows are, how to load it."""
    front = {"library_name": "turnrl", "tags": ["turnrl", "reinforcement-learning", *tags],
             "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": "data/*.parquet"}]}]}
    return (
        f"---\n{yaml.safe_dump(front, sort_keys=False)}---\n\n# {title}\n\n{what}\n\n"
        "```python\nfrom datasets import load_dataset\n\n"
        "ds = load_dataset(\"parquet\", data_files=\"data/*.parquet\")[\"train\"]\n```\n\n"
        "Columns: turnrl's docs/export.md.\n"
    )
