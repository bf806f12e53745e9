"""The transfer matrix in `turnrl report`: a run's ``suite-*.json`` files (written by ``turnrl eval --suite``) in the
report's data and on the page, and a malformed one named in a note while the rest still renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_report import Browser
from turnrl.evalsuite import Cell, Row, SuiteEntry, SuiteResult
from turnrl.monitor.report import load_report_data, render_html, write_report


def _suite() -> SuiteResult:
    """A two-model, two-column matrix in the format ``turnrl eval --suite`` writes (its own writer makes the file)."""
    entries = [SuiteEntry.model_validate({"name": "frozenlake-4x4", "env": {"id": "frozenlake-v0", "kwargs": {"size": 4}}}),
               SuiteEntry.model_validate({"name": "sokoban-5x5", "env": {"id": "sokoban-v0", "kwargs": {"size": 5}}})]
    rows = [Row("base (default)", [Cell("frozenlake-4x4", 0.25, 0.1, 0.47, 0.93, 16, 0.5, (0.28, 0.72)),
                                   Cell("sokoban-5x5", 0.0, 0.0, 0.2, 0.41, 16, 0.0, (0.0, 0.2))]),
            Row("runs/A/checkpoints/step_000040", [Cell("frozenlake-4x4", 0.8125, 0.57, 0.93, 1.0, 16, 0.9375, (0.72, 0.99)),
                                                   Cell("sokoban-5x5", 0.0625, 0.01, 0.28, 0.88, 16, 0.125, (0.03, 0.36))])]
    return SuiteResult("transfer", entries, rows, pass_k=4, seed_start=1_000_000, excluded_keys=37)


@pytest.fixture
def run_dir(tmp_path) -> Path:
    (tmp_path / "config.yaml").write_text("env:\n  id: frozenlake-v0\n")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval/success_rate": 0.5}) + "\n")
    return tmp_path


def test_a_suite_file_of_the_run_is_in_the_reports_data_and_html(run_dir):
    _suite().write(run_dir)
    data = load_report_data(run_dir)
    [s] = data.suites
    assert s["file"] == "suite-transfer.json" and s["pass_k"] == 4 and s["excluded_keys"] == 37
    assert [c["name"] for c in s["columns"]] == ["frozenlake-4x4", "sokoban-5x5"]
    assert s["columns"][0]["kwargs"] == {"size": "4"}
    assert [r["model"] for r in s["rows"]] == ["base (default)", "runs/A/checkpoints/step_000040"]
    cell = s["rows"][1]["cells"][0]
    assert cell == {"success": 0.8125, "ci_low": 0.57, "ci_high": 0.93, "valid_action_rate": 1.0, "distinct_tasks": 16,
                    "pass_at_k": 0.9375, "pass_ci": [0.72, 0.99]}
    payload = json.loads(render_html(data).split('id="report-data">')[1].split("</script>")[0])
    assert payload["suites"] == data.suites


def test_a_malformed_suite_file_is_named_and_the_rest_of_the_report_renders(run_dir):
    _suite().write(run_dir)
    (run_dir / "suite-broken.json").write_text("{not json")
    bad = _suite().to_dict()
    bad["rows"][0]["cells"][1]["success"] = "high"
    (run_dir / "suite-typed.json").write_text(json.dumps(bad))
    data = load_report_data(run_dir)
    assert [s["file"] for s in data.suites] == ["suite-transfer.json"]
    broken = [n for n in data.notes if n.startswith("suite-broken.json ")]
    typed = [n for n in data.notes if n.startswith("suite-typed.json ")]
    assert len(broken) == 1 and "turnrl eval --suite" in broken[0]
    assert len(typed) == 1 and "rows[0].cells[1].success is 'high'" in typed[0]
    assert data.metrics["eval/success_rate"] == [[1, 0.5]] and "frozenlake-v0" in data.config
    assert "suite-typed.json" in render_html(data)


def test_a_run_without_suite_files_has_no_matrix(run_dir):
    assert load_report_data(run_dir).suites == []


def test_the_page_draws_the_matrix_and_hides_it_without_suites(run_dir, tmp_path_factory):
    plain = write_report(run_dir, tmp_path_factory.mktemp("plain") / "report.html")
    _suite().write(run_dir)
    with_suite = write_report(run_dir)
    browser = Browser(tmp_path_factory.mktemp("chromium-profile"))
    try:
        browser.open(plain)
        assert browser.eval("document.getElementById('suites').hidden") is True
        assert browser.eval("document.querySelectorAll('table.matrix').length") == 0
        browser.open(with_suite)
        assert browser.errors() == []
        assert browser.eval("document.getElementById('suites').hidden") is False
        heads = browser.eval("[...document.querySelectorAll('table.matrix th')].map(e => e.textContent)")
        assert heads[:3] == ["model", "frozenlake-4x4frozenlake-v0, size=4", "sokoban-5x5sokoban-v0, size=5"]
        rows = browser.eval("[...document.querySelectorAll('tr.matrix-row')].map(r => [...r.children].map(e => e.textContent))")
        assert rows[1] == ["runs/A/checkpoints/step_000040", "0.813 [0.57-0.93]pass@4 0.938 [0.72-0.99]valid 1.00 · n=16",
                           "0.063 [0.01-0.28]pass@4 0.125 [0.03-0.36]valid 0.88 · n=16"]
        assert "4" in browser.eval("document.querySelector('.suite .meta').textContent")
    finally:
        browser.close()
