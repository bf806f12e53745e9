"""The sandbox denies or stops hostile code within seconds, leaves the host unaffected, and never raises for it.

As root each run gets a fresh uid; otherwise it runs as the caller's. Either way
``test_an_unprivileged_user_gets_the_same_isolation`` runs the sandbox as a non-root user. The syscall probes run
unconfined first, to show each call works on this machine outside the sandbox.
"""

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyseccomp
import pytest

from turnrl.envs import sandbox
from turnrl.envs.sandbox import UID_BASE, Limits, SandboxUnavailable, run_python

ROOT = Path(__file__).resolve().parents[1]
FAST = Limits(cpu_seconds=1, wall_seconds=3.0)
FORK_SIX = (  # forks sleeping children until the process limit refuses one, then prints how many it started
    "import os, time\nkids = 0\n"
    "for _ in range(50):\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n"
    "    if pid == 0:\n        time.sleep(5); os._exit(0)\n    kids += 1\nprint(kids)\n"
)
DETACHED = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint('parent done')\n"


def _sandboxed_processes_of(uid: int) -> list[int]:
    """Host pids of processes running as ``uid`` in another PID namespace than ours (a sandbox's), polled for up to
    2 s (the kernel reaps a dead namespace quickly)."""
    ours = os.readlink("/proc/self/ns/pid")
    deadline = time.monotonic() + 2.0
    while True:
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    uid_line = next(line for line in open(f"/proc/{entry}/status") if line.startswith("Uid:"))
                    namespace = os.readlink(f"/proc/{entry}/ns/pid")
                except (OSError, StopIteration):
                    continue
                if int(uid_line.split()[1]) == uid and namespace != ours:
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
@pytest.mark.probe("escape")
def test_host_files_cannot_be_read(path):
    assert Path("/etc/passwd").exists() and (ROOT / "pyproject.toml").exists()  # they exist on the host
    r = run_python(f"print(open({path!r}).read()[:40])")
    assert r.stdout == "" and r.exit_code == 1 and "FileNotFoundError" in r.stderr


@pytest.mark.probe("escape")
def test_the_filesystem_holds_only_the_runtime_and_the_work_dir():
    r = run_python("import os; print(sorted(os.listdir('/')), os.getcwd(), os.getuid() != 0, os.listdir('.'))",
                   files={"data/input.txt": "x"})
    listing = r.stdout
    assert "'work'" in listing and "'etc'" not in listing and "'home'" not in listing and "'proc'" not in listing
    assert "/work True" in listing and "'data'" in listing


@pytest.mark.parametrize("target", ["/usr/pwned", "/pwned", "/bin/pwned", "/dev/pwned", str(ROOT / "pwned")])
@pytest.mark.probe("escape")
def test_writes_outside_the_work_dir_fail_and_work_dir_writes_stay_inside(target):
    code = f"open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\nopen({target!r}, 'w').write('x')"
    r = run_python(code)
    assert r.stdout == "ok\n" and r.exit_code == 1
    assert any(e in r.stderr for e in ("Read-only file system", "Permission denied", "No such file or directory"))
    assert not Path(target).exists() and not (ROOT / "inside.txt").exists()


@pytest.mark.probe("escape")
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


@pytest.mark.probe("escape")
def test_infinite_loop_is_killed_by_the_cpu_limit():
    start = time.monotonic()
    r = run_python("while True:\n    pass", limits=Limits(cpu_seconds=1, wall_seconds=10.0))
    assert r.killed_by == "cpu" and r.signal == signal.SIGXCPU and not r.ok
    assert time.monotonic() - start < 6  # ~1.2 s on an idle machine; CPU seconds take longer when cores are busy
    assert "CPU time limit" in r.describe()


@pytest.mark.probe("escape")
def test_sleeping_forever_is_killed_by_the_wall_limit():
    r = run_python("import time\ntime.sleep(60)", limits=Limits(wall_seconds=1.0))
    assert r.timed_out and r.killed_by == "wall" and r.exit_code is None and 1.0 <= r.duration < 4


@pytest.mark.probe("escape")
def test_ten_gigabytes_are_refused():
    r = run_python("b = bytearray(10 * 1024 ** 3)\nprint('allocated')", limits=FAST)
    assert r.stdout == "" and r.killed_by == "memory" and "MemoryError" in r.stderr and r.duration < 5


@pytest.mark.probe("escape")
def test_fork_bomb_is_contained_and_everything_dies_with_the_run():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_python(code, limits=Limits(cpu_seconds=2, wall_seconds=2.0, max_processes=8))
    assert r.killed_by in ("wall", "cpu") and r.duration < 6  # 2 s, plus slack for a loaded machine
    assert _sandboxed_processes_of(r.uid) == []  # no process of the run survives it
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


@pytest.mark.probe("escape")
def test_processes_beyond_the_limit_cannot_be_started():
    r = run_python(FORK_SIX, limits=Limits(max_processes=6, wall_seconds=3.0))
    assert r.ok and int(r.stdout) == 5  # the worker itself is the sixth process
    assert _sandboxed_processes_of(r.uid) == []  # the sleeping children died with the namespace


@pytest.mark.probe("escape")
def test_detached_children_do_not_outlive_the_run():
    r = run_python(DETACHED, limits=FAST)
    assert r.ok and r.stdout == "parent done\n" and r.duration < 5
    assert _sandboxed_processes_of(r.uid) == []


@pytest.mark.probe("escape")
def test_output_floods_are_capped():
    r = run_python("import sys\nfor _ in range(2000):\n    sys.stdout.write('x' * 1000)\n", limits=Limits(max_output_bytes=1000))
    assert r.ok and len(r.stdout) == 1000 and r.stdout_truncated


@pytest.mark.probe("escape")
def test_disk_fill_is_capped_by_the_tmpfs():
    code = "f = open('big', 'wb')\nfor _ in range(100):\n    f.write(b'x' * 1024 * 1024)\n"
    r = run_python(code, limits=Limits(disk_mb=8))
    assert not r.ok and (r.signal == signal.SIGXFSZ or "No space left" in r.stderr), (r.signal, r.stderr[-200:])
    code = "for i in range(100):\n    open(f'f{i}', 'wb').write(b'x' * 1024 * 1024)\n"  # many files under the size limit
    r = run_python(code, limits=Limits(disk_mb=8))
    assert not r.ok and "No space left on device" in r.stderr


@pytest.mark.probe("escape")
def test_no_privileges_to_regain():
    code = (
        "import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n"
        "try:\n    os.setuid(0)\nexcept PermissionError:\n    print('setuid denied')\n"
        "try:\n    os.chroot('/tmp')\nexcept PermissionError:\n    print('chroot denied')\n"
        "print(open('/proc/self/status').read() if os.path.exists('/proc') else 'no proc')\n"
    )
    r = run_python(code, limits=FAST)
    uid, gid, groups = r.stdout.split("\n")[0].split(" ", 2)
    assert int(uid) == r.uid != 0
    if os.geteuid() == 0:  # a fresh uid of its own, with no groups (without root it is the caller's uid)
        assert r.uid >= UID_BASE and int(gid) == r.uid and groups == "[]"
    assert "setuid denied" in r.stdout and "chroot denied" in r.stdout and "no proc" in r.stdout


@pytest.mark.probe("escape")
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
    assert len(uids) == (3 if os.geteuid() == 0 else 1)  # as root, each run has a uid of its own


def test_unsafe_file_names_and_bad_limits_are_rejected():
    with pytest.raises(ValueError, match="relative path"):
        run_python("pass", files={"../escape.py": ""})
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=8)
    with pytest.raises(ValueError, match="cpu_seconds"):
        Limits(cpu_seconds=0)


def test_without_bubblewrap_it_refuses_instead_of_running_unprotected(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    with pytest.raises(SandboxUnavailable, match="bubblewrap, which is not installed; install bubblewrap: `apt-get install bubblewrap`"):
        run_python("print(1)")


def test_a_sandbox_that_cannot_be_set_up_is_an_error_not_an_unprotected_run(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"  # what bubblewrap says where user namespaces are disabled
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create a new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SandboxUnavailable, match="could not set up the sandbox: bwrap: No permissions to create a new namespace"):
        run_python("print(1)")


@pytest.mark.probe("escape")
def test_no_descriptor_of_the_host_reaches_the_code():
    r = run_python("import os\nopen_fds = []\nfor fd in range(3, 1024):\n    try:\n        os.fstat(fd)\n"
                   "        open_fds.append(fd)\n    except OSError:\n        pass\nprint(open_fds)", files={"a.txt": "x", "b/c.txt": "y"})
    assert r.ok and r.stdout == "[]\n"


# ---- the syscall filter ---------------------------------------------------------------------------------------

SYSCALL_PROBES = r"""
import ctypes, json, os, signal, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def call(nr, *args):  # errno of a raw syscall, 0 if it succeeded (a returned fd is closed)
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[a if isinstance(a, ctypes.Array) else ctypes.c_long(a) for a in args])
    if r < 0:
        return ctypes.get_errno()
    if nr in (298, 323, 425):
        os.close(r)
    return 0

def ptrace_attach():  # attach to our own child, as a debugger would
    child = os.fork()
    if child == 0:
        signal.pause()
        os._exit(0)
    try:
        return call(101, 16, child, 0, 0)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)

def perf_event_open():  # a software CPU clock on ourselves, user space only (allowed at perf_event_paranoid 2)
    attr = ctypes.create_string_buffer(128)
    struct.pack_into("IIQ", attr, 0, 1, 128, 0)
    struct.pack_into("Q", attr, 40, 1 | 1 << 5 | 1 << 6)
    return call(298, attr, 0, -1, -1, 0)

def netlink_socket():
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()
        return 0
    except OSError as e:
        return e.errno

print(json.dumps({
    "ptrace": ptrace_attach(),
    "unshare": call(272, 0x10000000),  # a new user namespace for this process
    "keyctl": call(250, 0, -3, 1),  # the session keyring's id
    "io_uring_setup": call(425, 1, ctypes.create_string_buffer(120)),
    "userfaultfd": call(323, 1),  # user-mode-only faults, allowed without privileges
    "perf_event_open": perf_event_open(),
    "personality": call(135, 0x0040000),  # ADDR_NO_RANDOMIZE: turn address randomisation off
    "netlink_socket": netlink_socket(),
}))
"""
"""Syscalls an unprivileged process may make on this kernel (each prints errno 0 unconfined) and the filter refuses."""


@pytest.mark.probe("escape")
def test_syscalls_an_unprivileged_process_may_make_are_refused_in_the_sandbox():
    outside = subprocess.run([sys.executable, "-c", SYSCALL_PROBES], capture_output=True, text=True, timeout=30)
    unconfined = json.loads(outside.stdout)
    assert set(unconfined.values()) == {0}, unconfined  # every probe works on this machine outside the sandbox
    r = run_python(SYSCALL_PROBES, limits=FAST)
    assert r.ok, r.stderr
    confined = json.loads(r.stdout)
    assert confined == {**{name: errno.EPERM for name in unconfined}, "netlink_socket": errno.EAFNOSUPPORT}


@pytest.mark.probe("escape")
def test_namespace_mount_bpf_and_raw_socket_calls_fail_and_threads_still_work():
    code = (
        "import ctypes, os, socket, threading\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def err(r):\n    return 0 if r >= 0 else ctypes.get_errno()\n"
        "print(err(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)))\n"  # clone(CLONE_NEWUSER | SIGCHLD)
        "print(err(libc.syscall(56, 0x20000000 | 17, 0, 0, 0, 0)))\n"  # clone(CLONE_NEWPID | SIGCHLD)
        "print(err(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)))\n"
        "print(err(libc.syscall(321, 0, None, 0)))\n"  # bpf(BPF_MAP_CREATE)
        "print(err(libc.syscall(435, None, 0)))\n"  # clone3: ENOSYS, so libc falls back to clone
        "try:\n    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)\nexcept OSError as e:\n    print(e.errno)\n"
        "t = threading.Thread(target=print, args=('thread ran',))\nt.start(); t.join()\n"
    )
    r = run_python(code, limits=FAST)
    assert r.ok, r.stderr
    eperm, enosys, eafnosupport = errno.EPERM, errno.ENOSYS, errno.EAFNOSUPPORT
    assert r.stdout.split("\n") == [str(eperm), str(eperm), str(eperm), str(eperm), str(enosys), str(eafnosupport), "thread ran", ""]


I386_GETPID = (  # getpid through the 32-bit syscall table (int 0x80), which a filter written for x86-64 does not see
    "import ctypes, mmap, os\n"
    "page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
    "page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))\n"  # mov eax, 20; int 0x80; ret
    "getpid = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))\n"
    "print(getpid() == os.getpid())\n"
)
X32_GETPID = "import ctypes\nprint(ctypes.CDLL(None).syscall(0x40000000 | 39))\n"  # getpid through the x32 table


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the i386 and x32 syscall tables exist only on x86-64")
@pytest.mark.probe("escape")
def test_a_syscall_through_another_abi_kills_the_process():
    outside = subprocess.run([sys.executable, "-c", I386_GETPID], capture_output=True, text=True, timeout=30)
    assert outside.stdout == "True\n" or outside.returncode == -signal.SIGSEGV  # works here, or this kernel has no i386 table
    for program in (I386_GETPID, X32_GETPID):
        r = run_python(program, limits=FAST)
        assert r.stdout == "" and r.signal == signal.SIGSYS and r.describe() == "killed by signal SIGSYS", (r.signal, r.stderr[-300:])


# ---- without root ---------------------------------------------------------------------------------------------

UNPRIVILEGED_RUNS = r"""
import importlib.util, json, sys
sys.path.insert(0, sys.argv[2])  # pyseccomp
spec = importlib.util.spec_from_file_location("sandbox", sys.argv[1])
sandbox = sys.modules["sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
runs = {name: sandbox.run_python(code, limits=sandbox.Limits(**limits)) for name, (code, limits) in json.loads(sys.argv[3]).items()}
print(json.dumps({name: {"stdout": r.stdout, "stderr": r.stderr[-300:], "exit_code": r.exit_code, "killed_by": r.killed_by,
                         "uid": r.uid} for name, r in runs.items()}))
"""
"""Load sandbox.py by path (the package's other modules need torch, which another interpreter may not have), run each
program of argv[3] (name -> [code, Limits keywords]) in it and print what each run did."""


def _interpreter_for(uid: int) -> str:
    """A Python that ``uid`` may execute: ours unless it lives in a private directory (e.g. root's pyenv), else the system's."""
    for candidate in (os.path.realpath(sys._base_executable), shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")):
        try:
            if candidate and subprocess.run([candidate, "-c", "pass"], user=uid, group=uid, extra_groups=[]).returncode == 0:
                return candidate
        except PermissionError:
            continue
    pytest.fail(f"no Python interpreter that uid {uid} may run; install python3 (apt-get install python3) to test the non-root path")


@pytest.mark.probe("escape")
def test_an_unprivileged_user_gets_the_same_isolation():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    fast = {"cpu_seconds": 1, "wall_seconds": 3.0}
    programs = {
        "who": ("import os; print(os.getuid())", fast),
        "etc": ("print(open('/etc/passwd').read())", fast),
        "write": ("open('/usr/pwned', 'w')", fast),
        "net": (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", fast),
        "cpu": ("while True:\n    pass", {"cpu_seconds": 1, "wall_seconds": 10.0}),  # 1 CPU second may take 3 s on a busy machine
        "memory": ("b = bytearray(10 * 1024 ** 3)", fast),
        "fork": (FORK_SIX, {"max_processes": 6, "wall_seconds": 3.0}),
        "detached": (DETACHED, fast),
        "syscalls": (SYSCALL_PROBES, fast),
    }
    root = os.geteuid() == 0  # then switch to a uid no other test run uses; else we are the unprivileged user
    uid = 100_000 + os.getpid() % 100_000 if root else os.getuid()
    # that uid reads sandbox.py and pyseccomp from a directory it may enter: a checkout or venv may be private (0700)
    shared = tempfile.mkdtemp(prefix="turnrl-sandbox-")
    os.chmod(shared, 0o755)
    for module in (sandbox.__file__, pyseccomp.__file__):
        os.chmod(shutil.copy(module, shared), 0o644)
    argv = [_interpreter_for(uid) if root else sys.executable, "-I", "-c", UNPRIVILEGED_RUNS,
            os.path.join(shared, os.path.basename(sandbox.__file__)), shared, json.dumps(programs)]
    as_user = {"user": uid, "group": uid, "extra_groups": []} if root else {}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/", **as_user)
        assert done.returncode == 0, done.stderr[-2000:]
        runs = json.loads(done.stdout)
        with pytest.raises(socket.timeout):
            server.accept()  # nothing reached the host's server
    finally:
        server.close()
        shutil.rmtree(shared)
    assert runs["who"]["stdout"] == f"{uid}\n" and {r["uid"] for r in runs.values()} == {uid}
    assert "FileNotFoundError" in runs["etc"]["stderr"] and "Read-only file system" in runs["write"]["stderr"]
    assert "ConnectionRefusedError" in runs["net"]["stderr"]
    assert runs["cpu"]["killed_by"] == "cpu" and runs["memory"]["killed_by"] == "memory"
    assert runs["fork"]["stdout"] == "5\n" and runs["detached"]["stdout"] == "parent done\n"
    assert set(json.loads(runs["syscalls"]["stdout"]).values()) == {errno.EPERM, errno.EAFNOSUPPORT}
    assert _sandboxed_processes_of(uid) == []  # the forked sleepers and the detached child died with their sandboxes


# ---- the env that uses the sandbox: hostile submissions become error observations; the loop goes on --------

HOSTILE = [
    ("```python\nwhile True:\n    pass\n```", "limit exceeded"),  # CPU, or wall time on a busy machine
    ("```python\nprint(open('/etc/passwd').read())\n```", "FileNotFoundError"),
    ("```python\nimport socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\n```", "Connection refused"),
    ("```python\nimport os\nwhile True:\n    os.fork()\n```", "Error:"),
    ("```python\nx = bytearray(10 * 1024 ** 3)\n```", "MemoryError"),
]


@pytest.mark.probe("escape")
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


@pytest.mark.probe("escape")
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
