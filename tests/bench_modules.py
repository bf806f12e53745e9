"""Load a script under bench/ as a module, for tests of its pure parts (bench/ is not a package)."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str) -> ModuleType:
    """``bench/NAME.py`` as a fresh module; bench/ goes on ``sys.path`` first, for its own imports (machine, baselines)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # registered first, as an import does: a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module
