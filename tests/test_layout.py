"""The layout holds (docs/concepts.md): folders follow the data flow and no module imports a layer above it.

Layers, lowest first: envs < agent < engines < rollout < credit < learner < monitor < scale < build < loop < sft < api
< evalsuite < completion < cli.
``types``, ``config``, ``checkpoint`` and ``models`` (model loading and the shared-prefix forward) are shared by all.
Every import counts, including those inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "turnrl"
# api (turnrl.train / turnrl.evaluate) runs the loop and is what the CLI's train and eval call; completion (shell
# completion) reads the config schema and the env and estimator registries for the CLI: both sit just below cli.
# evalsuite (turnrl eval --suite) builds each row's model through api's config and checkpoint resolution.
LAYERS = ["envs", "agent", "engines", "rollout", "credit", "learner", "monitor", "scale", "build", "loop", "sft", "api",
          "evalsuite", "completion", "cli"]
SHARED = {"types", "config", "checkpoint", "models"}
# Shared modules that reach up on purpose, each with its reason.
ALLOWED_UP = {
    ("config", "credit"): "the config validates algo.estimator against the estimator registry",
    ("config", "monitor"): "the config validates monitor.actions against the detector names",
}


def _part(module: str) -> str:
    """``turnrl.engines.native.engine`` -> ``engines``; ``turnrl.loop`` -> ``loop``."""
    return module.split(".")[1] if module.count(".") else module


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("turnrl")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("turnrl"):
                found.add(name)
    return found


def _rank(part: str) -> int | None:
    return LAYERS.index(part) if part in LAYERS else None


def test_every_top_level_part_is_a_known_layer_or_shared():
    parts = {_part(m) for m in _modules() if m != "turnrl"}
    assert parts <= set(LAYERS) | SHARED, parts - set(LAYERS) - SHARED


def test_no_module_imports_a_layer_above_it():
    bad = []
    for module, path in _modules().items():
        if module == "turnrl":
            continue
        mine = _part(module)
        for target in _imports(path, module):
            theirs = _part(target) if target != "turnrl" else None
            if theirs is None or theirs == mine or (mine, theirs) in ALLOWED_UP:
                continue
            if mine in SHARED and theirs not in SHARED:
                bad.append(f"{module} (shared) imports {target}")
            elif _rank(mine) is not None and _rank(theirs) is not None and _rank(theirs) > _rank(mine):
                bad.append(f"{module} ({mine}) imports {target} ({theirs}, a higher layer)")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("low", ["envs", "credit", "engines", "learner"])
def test_core_never_imports_train_cli_or_monitor(low):
    for module, path in _modules().items():
        if _part(module) == low:
            hits = {t for t in _imports(path, module) if _part(t) in ("loop", "cli", "monitor")}
            assert not hits, f"{module} imports {hits}"


def test_sizes_stay_readable():
    lines = {m: len(p.read_text().splitlines()) for m, p in _modules().items()}
    assert lines["turnrl.loop"] <= 350, lines["turnrl.loop"]
    too_long = {m: n for m, n in lines.items() if n > 600}
    assert not too_long, too_long


def test_no_folder_imports_in_a_circle():
    """Between top-level parts (envs, agent, ...) the import graph has no cycle, lazy imports included."""
    graph: dict[str, set[str]] = {}
    for module, path in _modules().items():
        if module == "turnrl":
            continue
        mine = _part(module)
        for target in _imports(path, module):
            theirs = _part(target)
            if target != "turnrl" and theirs != mine and (mine, theirs) not in ALLOWED_UP:
                graph.setdefault(mine, set()).add(theirs)
    seen: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        seen[node] = 1
        for nxt in graph.get(node, ()):
            assert seen.get(nxt) != 1, f"import cycle: {' -> '.join(stack + [node, nxt])}"
            if nxt not in seen:
                visit(nxt, stack + [node])
        seen[node] = 2

    for node in list(graph):
        if node not in seen:
            visit(node, [])
