"""Render observations into chat-template token ids, exactly.

:class:`ChatRenderer` builds a whole prompt (system instructions, few-shot exchanges, history, the current
observation) for ``per_step`` context, and, for ``full`` context, the ids that follow a response: the
template text that closes the assistant turn, opens a user turn with the observation and opens the next
assistant turn. Those ids come from the template itself (never from re-tokenizing the model's decoded text),
so a conversation's ids are exactly what the engine conditioned on. :mod:`turnrl.agent.context` uses both.
"""

from __future__ import annotations

from collections.abc import Sequence

CHARS_PER_TOKEN_BOUND = 8  # a token of natural text or code is rarely longer; :meth:`ChatRenderer.cut` relies on it

_A = "\u00a7TURNRL_ASSISTANT\u00a7"
_U = "\u00a7TURNRL_USER\u00a7"


class ChatRenderer:
    def __init__(
        self,
        tokenizer,
        instructions: str,
        examples: Sequence[tuple[str, str]] = (),
        *,
        few_shot: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.instructions = instructions
        self.examples = list(examples) if few_shot else []
        self._between, self._after = self._template_glue()
        eos = tokenizer.eos_token
        self._eos_text = eos if eos and self._between.startswith(eos) else None

    def _head(self) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.instructions}] if self.instructions else []
        for obs, resp in self.examples:
            msgs += [{"role": "user", "content": obs}, {"role": "assistant", "content": resp}]
        return msgs

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _render(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def _template_glue(self) -> tuple[str, str]:
        """Template text between an assistant message's content and the next user content, and after it."""
        text = self._render([{"role": "user", "content": "x"}, {"role": "assistant", "content": _A}, {"role": "user", "content": _U}])
        if _A not in text or _U not in text:
            raise ValueError("the tokenizer's chat template drops message content; turnrl cannot render it exactly")
        between = text.split(_A, 1)[1].split(_U, 1)[0]
        after = text.split(_U, 1)[1]
        return between, after

    def per_step_prompt(self, observation: str, history: Sequence[tuple[str, str]] = ()) -> list[int]:
        """Prompt ids for one turn: head + ``history`` (observation, response-text) pairs + the observation."""
        msgs = self._head()
        for obs, resp in history:
            msgs += [{"role": "user", "content": obs}, {"role": "assistant", "content": resp}]
        msgs.append({"role": "user", "content": observation})
        return self._encode(self._render(msgs))

    def cut(self, text: str, max_tokens: int) -> str:
        """``text`` cut to its first ``max_tokens`` tokens (decoded back to text); ``text`` itself when it fits.

        Only the first ``CHARS_PER_TOKEN_BOUND * max_tokens`` characters are ever tokenized, so a huge text costs
        no more than a long one; a text of unusually long tokens is therefore cut at that many characters.
        """
        head = text[: CHARS_PER_TOKEN_BOUND * max_tokens]
        ids = self._encode(head)
        if len(ids) > max_tokens:
            return self.tokenizer.decode(ids[:max_tokens], clean_up_tokenization_spaces=False)
        return head

    def full_initial_prompt(self, observation: str) -> list[int]:
        return self.per_step_prompt(observation)

    def full_continuation(self, observation: str, response_ended_with_eos: bool) -> list[int]:
        """Ids appended to the conversation after a response: close the turn, add ``observation``, reopen."""
        between = self._between
        if response_ended_with_eos and self._eos_text:
            between = between[len(self._eos_text) :]
        return self._encode(between + observation + self._after)
