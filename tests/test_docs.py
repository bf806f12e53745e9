"""Every ```python block of docs/envs.md runs as pasted: alone, in a fresh interpreter, in an empty directory."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line number of the opening fence, code)`` of each ```python block; fences may be indented (list items)."""
    blocks, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        fence = lines[i].strip()
        if fence.startswith("```"):
            start, indent = i, len(lines[i]) - len(lines[i].lstrip())
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                i += 1
            if fence == "```python":
                blocks.append((start + 1, textwrap.dedent("\n".join(line[indent:] for line in lines[start + 1 : i]))))
        i += 1
    return blocks


ENV_BLOCKS = python_blocks(DOCS / "envs.md")


def test_the_extractor_finds_the_examples():
    assert len(ENV_BLOCKS) >= 8 and all("```" not in code.splitlines()[0] for _, code in ENV_BLOCKS)
    assert any("class Counter(Env)" in code for _, code in ENV_BLOCKS)


@pytest.mark.parametrize("line, code", ENV_BLOCKS, ids=[f"envs.md:{line}" for line, _ in ENV_BLOCKS])
def test_envs_md_example_runs_as_pasted(line, code, tmp_path):
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"docs/envs.md:{line} failed:\n{run.stderr[-3000:]}"
