"""The sandbox denies or stops hostile code within seconds, leaves the host unaffected, and never raises for it."""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from turnrl.envs.sandbox import UID_BASE, Limits, SandboxUnavailable, run_python

ROOT = Path(__file__).resolve().parents[1]
FAST = Limits(cpu_seconds=1, wall_seconds=3.0)


def _processes_of(uid: int) -> list[int]:
    """Host pids of processes running as ``uid``, polled for up to 2 s (the kernel reaps a dead namespace quickly)."""
    deadline = time.monotonic() + 2.0
    while True:
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    uid_line = next(line for line in open(f"/proc/{entry}/status") if line.startswith("Uid:"))
                except (OSError, StopIteration):
                    continue
                if int(uid_line.split()[1]) == uid:
                    pids.append(int(entry))
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.1)


def test_runs_code_and_returns_output_status_and_timing():
    r = run_python("import sys\nprint(input().upper())\nprint('err', file=sys.stderr)\nsys.exit(3)", stdin="hello\n")
    assert r.stdout == "HELLO\n" and r.stderr == "err\n" and r.exit_code == 3 and r.signal is None
    assert not r.timed_out and r.killed_by is None and not r.ok and 0 < r.duration < 5
    assert run_python("print(6 * 7)").ok


def test_bad_code_comes_back_as_a_result():
    r = run_python("def f(:\n")
    assert r.exit_code == 1 and "SyntaxError" in r.stderr and r.killed_by is None
    r = run_python("import os; os.kill(os.getpid(), 11)")
    assert r.signal == 11 and r.exit_code is None and r.describe() == "killed by signal SIGSEGV"


@pytest.mark.parametrize("path", ["/etc/passwd", "/etc/shadow", str(ROOT / "pyproject.toml"), str(ROOT / "src/turnrl/envs/sandbox.py"),
                                  "/proc/1/environ", "../../etc/passwd"])
def test_host_files_cannot_be_read(path):
    assert Path("/etc/passwd").exists() and (ROOT / "pyproject.toml").exists()  # they exist on the host
    r = run_python(f"print(open({path!r}).read()[:40])")
    assert r.stdout == "" and r.exit_code == 1 and "FileNotFoundError" in r.stderr


def test_the_filesystem_holds_only_the_runtime_and_the_work_dir():
    r = run_python("import os; print(sorted(os.listdir('/')), os.getcwd(), os.getuid() != 0, os.listdir('.'))",
                   files={"data/input.txt": "x"})
    listing = r.stdout
    assert "'work'" in listing and "'etc'" not in listing and "'home'" not in listing and "'proc'" not in listing
    assert "/work True" in listing and "'data'" in listing


@pytest.mark.parametrize("target", ["/usr/pwned", "/pwned", "/bin/pwned", "/dev/pwned", str(ROOT / "pwned")])
def test_writes_outside_the_work_dir_fail_and_work_dir_writes_stay_inside(target):
    code = f"open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\nopen({target!r}, 'w').write('x')"
    r = run_python(code)
    assert r.stdout == "ok\n" and r.exit_code == 1
    assert any(e in r.stderr for e in ("Read-only file system", "Permission denied", "No such file or directory"))
    assert not Path(target).exists() and not (ROOT / "inside.txt").exists()


def test_no_network_even_to_a_loopback_server_of_the_host():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        code = (
            "import socket\n"
            "s = socket.socket(); s.settimeout(1)\n"
            f"try:\n    s.connect(('127.0.0.1', {port})); print('connected')\n"
            "except OSError as e:\n    print('refused', e.errno)\n"
            "try:\n    socket.create_connection(('example.com', 80), timeout=1); print('connected')\n"
            "except OSError as e:\n    print('refused', type(e).__name__)\n"
        )
        r = run_python(code, limits=FAST)
        assert "connected" not in r.stdout and r.stdout.count("refused") == 2
        with pytest.raises(socket.timeout):
            server.accept()  # nothing reached the host's server
        probe = socket.create_connection(("127.0.0.1", port), timeout=1)  # while the host itself still can
        probe.close()
    finally:
        server.close()


def test_infinite_loop_is_killed_by_the_cpu_limit():
    start = time.monotonic()
    r = run_python("while True:\n    pass", limits=Limits(cpu_seconds=1, wall_seconds=10.0))
    assert r.killed_by == "cpu" and r.signal == signal.SIGXCPU and not r.ok
    assert time.monotonic() - start < 6  # ~1.2 s on an idle machine; CPU seconds take longer when cores are busy
    assert "CPU time limit" in r.describe()


def test_sleeping_forever_is_killed_by_the_wall_limit():
    r = run_python("import time\ntime.sleep(60)", limits=Limits(wall_seconds=1.0))
    assert r.timed_out and r.killed_by == "wall" and r.exit_code is None and 1.0 <= r.duration < 4


def test_ten_gigabytes_are_refused():
    r = run_python("b = bytearray(10 * 1024 ** 3)\nprint('allocated')", limits=FAST)
    assert r.stdout == "" and r.killed_by == "memory" and "MemoryError" in r.stderr and r.duration < 5


def test_fork_bomb_is_contained_and_everything_dies_with_the_run():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_python(code, limits=Limits(cpu_seconds=2, wall_seconds=2.0, max_processes=8))
    assert r.killed_by in ("wall", "cpu") and r.duration < 6  # 2 s, plus slack for a loaded machine
    assert r.uid >= UID_BASE and _processes_of(r.uid) == []  # no process of the run survives it
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


def test_processes_beyond_the_limit_cannot_be_started():
    code = (
        "import os, time\nkids = 0\n"
        "for _ in range(50):\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(5); os._exit(0)\n    kids += 1\nprint(kids)\n"
    )
    r = run_python(code, limits=Limits(max_processes=6, wall_seconds=3.0))
    assert r.ok and int(r.stdout) == 5  # the worker itself is the sixth process
    assert _processes_of(r.uid) == []  # the sleeping children died with the namespace  # the sleeping children died with the namespace


def test_detached_children_do_not_outlive_the_run():
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint('parent done')\n"
    r = run_python(code, limits=FAST)
    assert r.ok and r.stdout == "parent done\n" and r.duration < 5
    assert _processes_of(r.uid) == []


def test_output_floods_are_capped():
    r = run_python("import sys\nfor _ in range(2000):\n    sys.stdout.write('x' * 1000)\n", limits=Limits(max_output_bytes=1000))
    assert r.ok and len(r.stdout) == 1000 and r.stdout_truncated


def test_disk_fill_is_capped_by_the_tmpfs():
    code = "f = open('big', 'wb')\nfor _ in range(100):\n    f.write(b'x' * 1024 * 1024)\n"
    r = run_python(code, limits=Limits(disk_mb=8))
    assert not r.ok and (r.signal == signal.SIGXFSZ or "No space left" in r.stderr), (r.signal, r.stderr[-200:])
    code = "for i in range(100):\n    open(f'f{i}', 'wb').write(b'x' * 1024 * 1024)\n"  # many files under the size limit
    r = run_python(code, limits=Limits(disk_mb=8))
    assert not r.ok and "No space left on device" in r.stderr


def test_no_privileges_to_regain():
    code = (
        "import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n"
        "try:\n    os.setuid(0)\nexcept PermissionError:\n    print('setuid denied')\n"
        "try:\n    os.chroot('/tmp')\nexcept PermissionError:\n    print('chroot denied')\n"
        "print(open('/proc/self/status').read() if os.path.exists('/proc') else 'no proc')\n"
    )
    r = run_python(code, limits=FAST)
    uid, gid, groups = r.stdout.split("\n")[0].split(" ", 2)
    assert int(uid) >= UID_BASE and int(gid) >= UID_BASE and groups == "[]"
    assert "setuid denied" in r.stdout and "chroot denied" in r.stdout and "no proc" in r.stdout


def test_concurrent_runs_are_isolated_from_each_other():
    import concurrent.futures

    code = "import os, time\nopen('/tmp/mine', 'w').write(str(os.getuid()))\ntime.sleep(0.3)\nprint(os.getuid(), open('/tmp/mine').read(), os.listdir('/tmp'))"
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: run_python(code, limits=FAST), range(3)))
    uids = set()
    for r in results:
        uid, seen, listing = r.stdout.split(" ", 2)
        assert uid == seen and listing.strip() == "['mine']"
        uids.add(uid)
    assert len(uids) == 3


def test_unsafe_file_names_and_bad_limits_are_rejected():
    with pytest.raises(ValueError, match="relative path"):
        run_python("pass", files={"../escape.py": ""})
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=8)
    with pytest.raises(ValueError, match="cpu_seconds"):
        Limits(cpu_seconds=0)


def test_without_root_it_refuses_instead_of_running_unprotected(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxUnavailable, match="needs root"):
        run_python("print(1)")


# ---- the env that uses the sandbox: hostile submissions become error observations; the loop goes on --------

HOSTILE = [
    ("```python\nwhile True:\n    pass\n```", "limit exceeded"),  # CPU, or wall time on a busy machine
    ("```python\nprint(open('/etc/passwd').read())\n```", "FileNotFoundError"),
    ("```python\nimport socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\n```", "Network is unreachable"),
    ("```python\nimport os\nwhile True:\n    os.fork()\n```", "Error:"),
    ("```python\nx = bytearray(10 * 1024 ** 3)\n```", "MemoryError"),
]


def test_code_env_answers_hostile_code_with_an_error_observation_and_continues():
    from turnrl.envs import make

    env = make("code-v0", cpu_seconds=1, wall_seconds=2.0, max_turns=len(HOSTILE) + 1)
    env.reset(seed=4)
    for code, needle in HOSTILE:
        obs, reward, terminated, truncated, info = env.step(code)
        assert needle in obs and "passed 0/8 tests" in obs and "Fix the function" in obs
        assert info["valid"] and reward == 0.0 and not terminated and not truncated
    obs, reward, terminated, _, info = env.step(env.solve()[0])  # the episode is still alive and can be solved
    assert terminated and info["success"] and reward == 1.0 and "All tests passed." in obs


class _ScriptedEngine:
    """An engine that answers every prompt with the next hostile program (token ids of its text)."""

    version = 0

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.calls = tokenizer, texts, 0

    def generate(self, prompts, params):
        from turnrl.engines.base import Completion

        out = []
        for _ in prompts:
            ids = self.tokenizer.encode(self.texts[self.calls % len(self.texts)], add_special_tokens=False)
            self.calls += 1
            out.append(Completion(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"))
        return out

    def sync_weights(self):
        self.version += 1

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_a_training_style_collection_over_hostile_code_keeps_every_episode(tokenizer):
    from turnrl.engines.base import SamplingParams
    from turnrl.envs import make
    from turnrl.rollout import Collector
    from turnrl.types import Termination

    engine = _ScriptedEngine(tokenizer, [code for code, _ in HOSTILE[1:]] + [HOSTILE[0][0]])
    collector = Collector(engine, tokenizer, lambda: make("code-v0", cpu_seconds=1, wall_seconds=2.0, max_turns=2))
    start = time.monotonic()
    groups = collector.collect([5, 6], group_size=2, sampling=SamplingParams(max_new_tokens=64))
    trajectories = [t for g in groups for t in g.trajectories]
    assert len(trajectories) == 4 and time.monotonic() - start < 20
    for t in trajectories:
        assert t.termination == Termination.TRUNCATED_TURNS and t.error is None and len(t.turns) == 2
        assert "Error:" in t.turns[1].observation and t.total_reward == 0.0  # the model saw why its code failed
