"""Shell completion for ``turnrl``: subcommands, options, config keys and their values.

``turnrl completion bash`` and ``turnrl completion zsh`` print a script. The script holds no names of its own: at
every TAB it runs ``turnrl --complete CWORD WORD...`` (a hidden flag; ``WORD...`` is the command line as the shell
split it, ``CWORD`` the index of the word under the cursor), and :func:`candidates` answers from the CLI's own
parser and the config schema, so a new subcommand, option or config key completes without a new script.

What completes where: subcommands after ``turnrl``; options (``--resume``, ...) after ``-``; an option's choices
after it (``--engine`` -> ``hf vllm openai``); config keys in the ``key=value`` position of ``train`` and ``eval``
(``train.l`` -> ``train.lr=``); after ``key=``, the values the schema knows (a ``Literal``'s, ``true``/``false``,
the registered env ids for ``env.id`` and ``eval.env_id``, the estimators for ``algo.estimator``); env ids for
``play``. Everywhere else (``-c FILE``, ``--resume RUN``, ...) the shell completes file names.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable

from turnrl.config import Config, valid_keys

SHELLS = ("bash", "zsh")
COMPLETE_FLAG = "--complete"
_BREAKS = ("=", ":")  # characters bash splits a word at (COMP_WORDBREAKS) that occur in turnrl's arguments

BASH = """\
# turnrl completion for bash. Load it in this shell:  source <(turnrl completion bash)
# or for every shell:  turnrl completion bash > ~/.local/share/bash-completion/completions/turnrl
# Each TAB asks turnrl itself (turnrl --complete ...), so new commands and config keys need no new script.
_turnrl() {
    local IFS=$'\\n'
    COMPREPLY=($("${COMP_WORDS[0]}" --complete "$COMP_CWORD" "${COMP_WORDS[@]}" 2>/dev/null))
    if [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == *[=.:] ]]; then
        compopt -o nospace 2>/dev/null  # train.lr= : the value follows without a space
    fi
}
complete -o default -F _turnrl turnrl
"""

ZSH = """\
#compdef turnrl
# turnrl completion for zsh. Load it in this shell (after compinit):  source <(turnrl completion zsh)
# or for every shell: save it as _turnrl in a directory of $fpath:  turnrl completion zsh > ~/.zfunc/_turnrl
# Each TAB asks turnrl itself (turnrl --complete ...), so new commands and config keys need no new script.
_turnrl() {
    local -a found
    found=("${(@f)$("${words[1]}" --complete $((CURRENT - 1)) "${words[@]}" 2>/dev/null)}")
    found=(${found:#})
    if (( ! ${#found} )); then
        _files
        return
    fi
    compadd -S '' -- ${(M)found:#*[=.:]}  # train.lr= : the value follows without a space
    compadd -- ${found:#*[=.:]}
}
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _turnrl "$@"
else
    compdef _turnrl turnrl
fi
"""


def script(shell: str) -> str:
    """The completion script for ``shell`` (``bash`` or ``zsh``)."""
    return {"bash": BASH, "zsh": ZSH}[shell]


def complete(parser: argparse.ArgumentParser, args: list[str]) -> int:
    """``turnrl --complete CWORD WORD...``: print the candidates for ``WORD[CWORD]``, one a line."""
    if not args or not args[0].isdigit():
        raise SystemExit(f"usage: turnrl {COMPLETE_FLAG} CWORD WORD... (what `turnrl completion bash` runs at a TAB)")
    for word in candidates(parser, args[1:], int(args[0])):
        print(word)
    return 0


def candidates(parser: argparse.ArgumentParser, words: list[str], cword: int) -> list[str]:
    """Completions of ``words[cword]``, ``words`` being the command line as the shell split it (``words[0]`` is the
    program). Bash splits ``train.lr=1e-5`` into ``train.lr``, ``=``, ``1e-5``: the words are joined back first,
    and each candidate is returned as the part that replaces ``words[cword]``."""
    words = words[: cword + 1] + [""] * (cword + 1 - len(words))
    joined, head = _rejoin(words)
    current = joined[-1]
    found = _complete(parser, joined[1:-1], current)
    return [c[len(head):] for c in found if c.startswith(current)]


def _rejoin(words: list[str]) -> tuple[list[str], str]:
    """``words`` with the pieces bash split at ``=`` and ``:`` joined again, and the part of the last joined word that
    comes before the last raw word (what a candidate keeps of it when the shell replaces only the raw word)."""
    joined: list[str] = []
    head_end, glue = 0, False
    for word in words:
        if joined and (glue or word in _BREAKS):
            head_end = len(joined[-1])
            joined[-1] += word
        else:
            joined.append(word)
            head_end = 0
        glue = word in _BREAKS
    return joined, joined[-1][:head_end]


def _complete(parser: argparse.ArgumentParser, before: list[str], current: str) -> list[str]:
    """Candidates for ``current`` given the words ``before`` it (the program left out)."""
    commands = _subcommands(parser)
    given = next((i for i, w in enumerate(before) if w in commands), None)
    if given is None:
        return _options(parser) if current.startswith("-") else sorted(commands)
    sub, rest = commands[before[given]], before[given + 1 :]
    takes_value = _option_actions(sub).get(rest[-1]) if rest else None
    if takes_value is not None and takes_value.nargs != 0:
        return [str(c) for c in takes_value.choices or ()]
    if current.startswith("-"):
        return _options(sub)
    action = _positional(sub, rest)
    if action is None:
        return []
    if action.choices:
        return [str(c) for c in action.choices]
    source = _POSITIONAL_VALUES.get(action.dest)
    return source(current) if source else []


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its actions here; completion tools read them the same way
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(_option_actions(parser))


def _positional(parser: argparse.ArgumentParser, rest: list[str]) -> argparse.Action | None:
    """The positional argument that the next word fills, after the words ``rest`` of the subcommand."""
    options = _option_actions(parser)
    taken, skip = 0, False
    for word in rest:
        if skip:
            skip = False
        elif word in options:
            skip = options[word].nargs != 0
        elif not word.startswith("-"):
            taken += 1
    for action in (a for a in parser._actions if not a.option_strings):
        if action.nargs in ("*", "+", argparse.REMAINDER) or taken == 0:
            return action
        taken -= 1
    return None


# ---------------------------------------------------------------------------------------------- config keys and values


def config_words(current: str) -> list[str]:
    """``key=`` for every config key, or after ``key=`` the ``key=value`` words of the values the schema knows."""
    if "=" not in current:
        return [f"{key}=" for key in valid_keys()]
    key = current.split("=", 1)[0]
    return [f"{key}={value}" for value in config_values(key)]


def config_values(key: str) -> list[str]:
    """The values ``key`` takes, where the schema knows them: a ``Literal``'s, booleans, registered names."""
    if key in _REGISTERED:
        return _REGISTERED[key]()
    section, _, name = key.partition(".")
    fields = Config.model_fields.get(section)
    field = fields.annotation.model_fields.get(name) if fields is not None else None
    if field is None:
        return []
    if field.annotation is bool:
        return ["true", "false"]
    if typing.get_origin(field.annotation) is typing.Literal:
        return [str(v) for v in typing.get_args(field.annotation)]
    return []


def _env_ids() -> list[str]:
    from turnrl.envs import registered

    return list(registered())


def _estimators() -> list[str]:
    from turnrl.credit import available_estimators

    return available_estimators()


_REGISTERED: dict[str, Callable[[], list[str]]] = {"env.id": _env_ids, "eval.env_id": _env_ids,
                                                   "algo.estimator": _estimators}
#: Positional arguments (by argparse ``dest``) whose words turnrl knows; the others are file names.
_POSITIONAL_VALUES: dict[str, Callable[[str], list[str]]] = {"overrides": config_words, "env": lambda _: _env_ids()}
