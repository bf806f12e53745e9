"""bench/faults.py counts a probe as held only when it passed: a failure, a skip or a broken teardown does not hold."""

import pytest

from tests.bench_modules import load_bench

PROBES = '''
import pytest

@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown went wrong")

@pytest.mark.probe("bad_input")
def test_holds():
    pass

@pytest.mark.probe("bad_input")
@pytest.mark.parametrize("x", [1, 2])
def test_second_case_fails(x):
    assert x == 1

@pytest.mark.probe("fault")
def test_skipped():
    pytest.skip("not checked")

@pytest.mark.probe("fault")
def test_teardown_breaks(broken_teardown):
    pass

@pytest.mark.probe("escape")
def test_escape_holds():
    pass

def test_not_a_probe():
    pass
'''


def _count(tmp_path, only=None):
    """Run PROBES through pytest in this process with bench/faults.py's counter; return the counter."""
    faults = load_bench("faults")
    (tmp_path / "test_probes.py").write_text(PROBES)
    counter = faults.ProbeCounter(only=only)
    args = [str(tmp_path), "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "--import-mode=importlib"]
    pytest.main(args, plugins=[counter])
    return counter


def test_only_passing_probes_hold(tmp_path):
    counter = _count(tmp_path)
    assert [counter.counts(kind) for kind in ("bad_input", "fault", "escape")] == [(2, 3), (0, 2), (1, 1)]
    assert counter.summary() == "bad inputs 2/3, faults 0/2, escapes 1/1 held"
    assert sorted(p.split("::")[1] for p in counter.not_held()) == [
        "test_second_case_fails[2] (failed)", "test_skipped (skipped)", "test_teardown_breaks (failed)"]


def test_one_kind_keeps_only_its_probes(tmp_path):
    counter = _count(tmp_path, only="escape")
    assert counter.summary() == "bad inputs 0/0, faults 0/0, escapes 1/1 held" and counter.not_held() == []
