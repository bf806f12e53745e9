"""Any reasoning-gym dataset as a turnrl env: one question per episode, one or ``attempts`` answers.

- **Task**: ``reset(seed=s)`` poses item ``s % size`` of ``reasoning_gym.create_dataset(dataset, seed=
  dataset_seed, size=size, **config)``. reasoning-gym builds item ``i`` from its own ``Random(dataset_seed
  + i)``, so an episode depends only on the seed. ``reset()`` without a seed draws the index from the
  env's own RNG (seeded by the last seeded reset).
- **Answer**: the last ``<answer>...</answer>`` tag of the response (reasoning-gym's ``extract_answer``).
  A response without the tag (or with an empty one) is an invalid turn: feedback, no attempt used, ``info["valid"] = False``
  (``require_tag=False`` scores the whole response instead). So is an answer the dataset's ``score_answer`` raises
  on (prime_factorization's scorer calls ``int()`` on ``2 x 3``): the feedback names the error.
- **Reward**: the dataset's own ``score_answer(answer, entry)`` in [0, 1] (partial credit where the dataset
  gives it), paid on the step that ends the episode as the component ``"outcome"``; earlier wrong attempts
  pay 0. ``info["score"]`` holds every attempt's score. **success**: score 1.0.
- **Attempts**: with ``attempts=k`` a wrong answer (score < 1) gets the feedback "Incorrect" and the
  question again until ``k`` answers were given; a correct one ends the episode at once. ``terminated`` is
  set on success or when the attempts are used up. Invalid turns do not count as attempts, so the
  ``TurnLimit`` (``max_turns``) bounds them.
- **Oracle**: ``solve()`` returns ``["<answer>{entry['answer']}</answer>"]``, the dataset's reference
  answer. In reasoning-gym 0.1.25, 100 of the 106 registered datasets have one and score it 1.0; boxnet,
  graph_color, propositional_logic, rubiks_cube and rush_hour have none (a checker scores answers), so
  ``solve()`` raises ``NotImplementedError`` there; ``composite`` needs its dataset list as config.
"""

from __future__ import annotations

import random
from typing import Any

from turnrl.envs.adapters import require
from turnrl.envs.base import Env

_EXAMPLE_SEED = 2_147_480_009  # the dataset seed of the few-shot examples: a stream no episode draws from


class ReasoningGym(Env):
    """A reasoning-gym dataset as an env (see the module docstring).

    Args:
        dataset: a reasoning-gym dataset name (``reasoning_gym.factory.DATASETS``), e.g. ``"basic_arithmetic"``.
        attempts: how many answers the agent may give (1: single-turn).
        dataset_seed: the seed of the dataset; with ``size`` it fixes which question each episode seed poses.
        size: number of distinct questions; episode seed ``s`` poses question ``s % size``.
        require_tag: answers must be inside ``<answer></answer>``; False scores the whole text when no tag is found.
        system_prompt: which of ``reasoning_gym.utils.SYSTEM_PROMPTS`` is the instructions.
        n_examples: how many few-shot (question, reference answer) pairs ``examples()`` returns.
        **config: the dataset's config fields (e.g. ``min_terms=2``); unknown ones raise reasoning-gym's error.
    """

    def __init__(
        self,
        dataset: str = "basic_arithmetic",
        attempts: int = 1,
        dataset_seed: int = 0,
        size: int = 100_000,
        require_tag: bool = True,
        system_prompt: str = "default",
        n_examples: int = 2,
        **config: Any,
    ) -> None:
        rg = require("reasoning_gym", "reasoning-gym")
        from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer

        if dataset not in rg.factory.DATASETS:
            import difflib

            close = difflib.get_close_matches(dataset, list(rg.factory.DATASETS), n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(f"reasoning-gym has no dataset {dataset!r}.{hint} See reasoning_gym.factory.DATASETS")
        if attempts < 1 or size < 1:
            raise ValueError(f"attempts={attempts} and size={size} must be >= 1")
        if system_prompt not in SYSTEM_PROMPTS:
            raise ValueError(f"system_prompt={system_prompt!r} must be one of {sorted(SYSTEM_PROMPTS)}")
        self.dataset_name, self.attempts, self.require_tag = dataset, attempts, require_tag
        self.instructions = SYSTEM_PROMPTS[system_prompt]  # type: ignore[misc]
        self._extract = extract_answer
        self.dataset = rg.create_dataset(dataset, seed=dataset_seed, size=size, **config)
        self._example_data = rg.create_dataset(dataset, seed=_EXAMPLE_SEED, size=max(n_examples, 1), **config)
        self.n_examples = n_examples
        self._rng = random.Random()
        self.index = 0
        self.entry: dict[str, Any] = {}
        self.used = 0
        self.done = self.solved = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Pose question ``seed % size``; ``info`` has ``index`` and the dataset's ``metadata``."""
        if seed is not None:
            self._rng = random.Random(seed)
            self.index = seed % len(self.dataset)
        else:
            self.index = self._rng.randrange(len(self.dataset))
        self.entry = self.dataset[self.index]
        self.used, self.done, self.solved = 0, False, False
        return self.entry["question"], {"index": self.index, "metadata": _jsonable(self.entry.get("metadata", {}))}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Score one answer with the dataset's ``score_answer`` (see the module docstring)."""
        if self.done:
            raise RuntimeError("step() after the episode terminated; call reset() first")
        answer = self._extract(action_text) or None  # an empty tag is no answer
        if answer is None and not self.require_tag and action_text.strip():
            answer = action_text.strip()
        if answer is None:
            return self._invalid("No answer found. Put your final answer inside <answer></answer> tags.")
        try:
            score = float(self.dataset.score_answer(answer, self.entry))
        except Exception as e:  # noqa: BLE001 - a scorer that cannot read the answer must not end the episode
            return self._invalid(
                f"Your answer could not be scored ({type(e).__name__}: {e}). Put only the final answer inside "
                "<answer></answer>, written in the form the question asks for."
            )
        self.used += 1
        success = self.solved = score >= 1.0
        self.done = success or self.used >= self.attempts
        reward = score if self.done else 0.0
        info = {
            "actions": [answer],
            "valid": True,
            "success": success,
            "reward_components": {"outcome": reward},
            "score": score,
            "attempts_left": self.attempts - self.used,
        }
        if success:
            obs = "Correct."
        elif self.done and self.entry.get("answer") is not None:
            obs = f"Incorrect. The expected answer was: {self.entry['answer']}"
        elif self.done:
            obs = "Incorrect."
        else:
            left = self.attempts - self.used
            obs = f"Incorrect. {left} attempt{'s' if left > 1 else ''} left.\n\n{self.entry['question']}"
        return obs, reward, self.done, False, info

    def _invalid(self, feedback: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """An invalid turn: ``feedback`` and the question again; no attempt is used."""
        info = {"actions": [], "valid": False, "success": False, "reward_components": {"outcome": 0.0}}
        return f"{feedback}\n\n{self.entry['question']}", 0.0, False, False, info

    def anchor(self) -> str:
        """``"<dataset>:<index>:<attempts used>"``."""
        return f"{self.dataset_name}:{self.index}:{self.used}"

    def task_key(self) -> str:
        """``"<dataset>: <question>"``: items with the same question are one task (small configs repeat questions)."""
        return f"{self.dataset_name}: {self.entry['question']}"

    def solve(self) -> list[str] | None:
        """The dataset's reference answer in tags, or ``[]`` once solved, None once the attempts are used up.

        Raises ``NotImplementedError`` for datasets without a reference answer (``answer`` is None: boxnet,
        graph_color, propositional_logic, rubiks_cube, rush_hour score answers with a checker instead).
        """
        if self.done:
            return [] if self.solved else None
        if self.entry.get("answer") is None:
            raise NotImplementedError(f"reasoning-gym's {self.dataset_name} has no reference answer to give as a plan")
        return [f"<answer>{self.entry['answer']}</answer>"]

    def examples(self) -> list[tuple[str, str]]:
        """Up to ``n_examples`` (question, tagged reference answer) pairs from a dataset seed no episode uses
        (none for datasets without reference answers)."""
        items = (self._example_data[i] for i in range(self.n_examples))
        return [(item["question"], f"<answer>{item['answer']}</answer>") for item in items if item.get("answer") is not None]

    def render(self) -> str:
        return f"{self.entry.get('question', '')}\n(attempts used: {self.used}/{self.attempts})"


def _jsonable(value: Any) -> Any:
    """``value`` with tuples as lists and anything else that JSON cannot hold as its ``repr``."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
