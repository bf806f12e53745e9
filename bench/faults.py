"""Does turnrl hold against bad input, faults and escape attempts? Counts the probes that hold.

Every probe is a test marked ``@pytest.mark.probe(kind)`` (issue 17's list, one test per probe, parametrized
cases counted one by one):

- ``bad_input``: configs, overrides, files, checkpoints and model text a user or a model can get wrong. Each
  must end in one line naming the problem and the fix, with nothing written or nothing lost.
- ``fault``: envs and servers that hang, raise, trickle, reply in the wrong shape or die, and runs killed or
  diverging. Each must end only its own episode or stop the run cleanly, resumable.
- ``escape``: model-written code trying to leave the sandbox (files, network, syscalls, privileges, resources).

A probe holds when its test passes; a skipped probe does not hold (it was not checked). The script runs the
probes through pytest in this process and prints one line:

    bad inputs N/N, faults N/N, escapes N/N held

followed by every probe that did not hold, and writes bench/results/faults.json.

    python bench/faults.py            # every probe (about 2-3 minutes on 2 cores)
    python bench/faults.py --smoke    # the bad-input probes only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from machine import write_result  # noqa: E402

KINDS = {"bad_input": "bad inputs", "fault": "faults", "escape": "escapes"}


class ProbeCounter:
    """A pytest plugin that keeps the probes (``only``: of one kind) and records whether each held."""

    def __init__(self, only: str | None = None) -> None:
        self.only = only
        self.kind: dict[str, str] = {}
        self.outcome: dict[str, str] = {}

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        kept = []
        for item in items:
            marker = item.get_closest_marker("probe")
            if marker is None:
                continue
            kind = marker.args[0]
            if kind not in KINDS:
                raise pytest.UsageError(f"{item.nodeid}: probe kind {kind!r} is not one of {sorted(KINDS)}")
            if self.only in (None, kind):
                self.kind[item.nodeid] = kind
                kept.append(item)
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid not in self.kind])
        items[:] = kept

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """A probe holds when its call passed and neither its setup nor its teardown went wrong."""
        if report.nodeid not in self.kind or self.outcome.get(report.nodeid) == "failed":
            return
        if report.failed:
            self.outcome[report.nodeid] = "failed"
        elif report.skipped:
            self.outcome[report.nodeid] = "skipped"
        elif report.when == "call":
            self.outcome[report.nodeid] = "passed"

    def counts(self, kind: str) -> tuple[int, int]:
        """(held, total) for one kind; a probe that never reported (the run was cut short) does not hold."""
        nodes = [n for n, k in self.kind.items() if k == kind]
        return sum(self.outcome.get(n) == "passed" for n in nodes), len(nodes)

    def not_held(self) -> list[str]:
        return [f"{n} ({self.outcome.get(n, 'not run')})" for n in self.kind if self.outcome.get(n) != "passed"]

    def summary(self) -> str:
        return ", ".join("{} {}/{}".format(KINDS[k], *self.counts(k)) for k in KINDS) + " held"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="run only the bad-input probes")
    args = ap.parse_args()
    counter = ProbeCounter(only="bad_input" if args.smoke else None)
    code = pytest.main([str(ROOT / "tests"), "-q", "-p", "no:cacheprovider", "--no-header"], plugins=[counter])
    line = counter.summary()
    print(line)
    for probe in counter.not_held():
        print(f"  did not hold: {probe}")
    fields: dict = {"summary": line, "smoke": args.smoke, "not_held": counter.not_held(), "pytest_exit": int(code)}
    for kind in KINDS:
        held, total = counter.counts(kind)
        fields[kind] = {"held": held, "total": total}
    print(f"wrote {write_result('faults', fields, measure=False)}")
    return 0 if counter.kind and not counter.not_held() else 1


if __name__ == "__main__":
    sys.exit(main())
