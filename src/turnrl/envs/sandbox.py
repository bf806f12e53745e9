"""Run untrusted Python code (model-written programs) in an isolated, resource-limited child process.

    result = run_python("print(sum(range(10)))", limits=Limits(cpu_seconds=2))
    result.stdout == "45\\n" and result.ok

Threat model. The code is adversarial or merely buggy output of a model being trained: it may try to read
the host's files (``/etc/passwd``, the project's sources, credentials), write outside its directory, reach
the network, exhaust CPU, memory, processes or disk, or hang. It runs as unprivileged code; it is *not*
assumed to hold a Linux kernel exploit. What ``run_python`` does, per run (Linux only, needs root or
CAP_SYS_ADMIN to create namespaces; it was verified as root in a Docker/Firecracker container):

- **Namespaces** (``unshare(2)``): a new mount, network, PID, IPC and UTS namespace. The network
  namespace has only a loopback interface that is down: no connection to the host's loopback services or
  to anything else can be made (``connect`` fails with ``ENETUNREACH``). In the PID namespace the code
  cannot see or signal host processes, and when the namespace's first process exits, the kernel kills
  every process left in it (daemons, double forks, ``setsid`` children included).
- **Filesystem**: the code is ``chroot``-ed into a fresh, size-limited ``tmpfs`` holding only read-only,
  ``nosuid``/``nodev`` bind mounts of the Python runtime (``/usr``, ``/lib*`` and the interpreter's
  ``sys.base_prefix``), four device nodes (``null``, ``zero``, ``random``, ``urandom``), a writable
  ``/tmp`` and the writable working directory ``/work`` (a copy of ``files``). There is no ``/etc``,
  ``/home``, ``/root`` (besides the interpreter's prefix when it lives there), ``/proc``, ``/sys`` or
  project directory: ``open("/etc/passwd")`` and ``open("/work/main/pyproject.toml")`` raise
  ``FileNotFoundError``. Everything the code writes lives in that ``tmpfs`` and vanishes with the run.
- **Identity**: the code runs as a fresh unprivileged uid/gid (``UID_BASE`` + the launcher's host pid, so
  concurrent runs never share one) with no supplementary groups, no capabilities and ``no_new_privs``
  (setuid binaries cannot raise privileges). Hence ``chroot`` cannot be escaped and read-only mounts
  cannot be remounted.
- **Resource limits** (``setrlimit``): CPU seconds (``RLIMIT_CPU``: ``SIGXCPU``, then ``SIGKILL`` one second
  later), address space (``RLIMIT_AS``: allocations fail with ``MemoryError``), processes (``RLIMIT_NPROC``
  counted for the run's own uid, which is why the uid is fresh: as root the limit would not apply), file
  size (``RLIMIT_FSIZE``), open files, no core dumps. The ``tmpfs`` size caps the disk the run can use.
- **Wall time**: the parent kills the launcher's process group with ``SIGKILL`` after ``wall_seconds``;
  the PID namespace then takes every other process of the run with it.
- **Output**: at most ``max_output_bytes`` of stdout and of stderr are kept (the rest is read and dropped).

What is *not* protected: kernel vulnerabilities (there is no seccomp filter: every system call is
available to the unprivileged uid); reads of the read-only runtime directories (``/usr``, the Python
prefix with its installed packages); CPU contention with the host (the code gets up to
``max_processes`` busy processes for up to ``wall_seconds``); timing side channels. Without root
(or ``CAP_SYS_ADMIN``) or on another OS, :func:`run_python` raises :class:`SandboxUnavailable` instead
of running the code unprotected.

``run_python`` never raises because of the code it runs: syntax errors, exceptions, crashes, limits and
hangs all come back as a :class:`SandboxResult`.

Implementation: the parent starts this file as a script (``python sandbox.py --launch CONFIG``) in a new
session. That launcher unshares the namespaces and forks the namespace's first process, which builds the
root, ``chroot``-s into it and forks the worker; the worker drops to the fresh uid, applies the limits
and ``exec``-s the interpreter on ``/work/main.py``. The first process reports the worker's exit status
and CPU time to the parent over a pipe. Only the standard library is imported, at the top of this file.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Literal

UID_BASE = 200_000
"""Sandboxed code runs as uid/gid ``UID_BASE + <launcher pid>``, a uid no host account uses."""

KilledBy = Literal["cpu", "memory", "wall"]

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWPID, _CLONE_NEWNET = 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
_PR_SET_NO_NEW_PRIVS = 38
_RUNTIME_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
_DEVICES = ("null", "zero", "random", "urandom")
_SETUP_FAILED = 125


class SandboxUnavailable(RuntimeError):
    """This machine cannot isolate code as documented (not Linux, not root, namespaces disabled)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one run (see the module docstring for how each is enforced)."""

    cpu_seconds: int = 2
    """CPU time per process; exceeding it kills the process (``killed_by="cpu"``)."""
    wall_seconds: float = 5.0
    """Elapsed time of the whole run; exceeding it kills every process (``killed_by="wall"``)."""
    memory_mb: int = 256
    """Address space per process; larger allocations raise ``MemoryError`` (``killed_by="memory"``)."""
    max_processes: int = 16
    """Processes (and threads) the run's uid may have at once; further forks fail with ``EAGAIN``."""
    disk_mb: int = 32
    """Size of the run's tmpfs (``/work`` and ``/tmp`` together) and largest file it may write."""
    max_open_files: int = 64
    max_output_bytes: int = 64_000
    """Bytes of stdout and of stderr kept in the result; the rest is discarded (``*_truncated``)."""

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "wall_seconds", "memory_mb", "max_processes", "disk_mb", "max_open_files", "max_output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name}={getattr(self, name)} must be positive")
        if self.memory_mb < 32:
            raise ValueError(f"Limits.memory_mb={self.memory_mb} is too small for the Python interpreter to start; use >= 32")


@dataclass(frozen=True)
class SandboxResult:
    """What a run did. ``exit_code`` is None when the worker died of a signal (then ``signal`` names it)."""

    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    """True when the wall-time limit killed the run."""
    killed_by: KilledBy | None
    """Which limit stopped the code, if one did: ``"cpu"``, ``"memory"`` (a ``MemoryError`` or a kill
    after failed allocation) or ``"wall"``; None when it ended on its own."""
    duration: float
    """Wall-clock seconds of the whole run, sandbox set-up included."""
    cpu_seconds: float
    """CPU seconds (user + system) used by the worker and the children it waited for."""
    uid: int = -1
    """The uid the code ran as (``UID_BASE`` + the launcher's pid); no process of it outlives the run."""
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        """The code ran to completion with exit status 0 and no limit was hit."""
        return self.exit_code == 0 and self.killed_by is None

    def describe(self) -> str:
        """One line for an observation: how the run ended (``exit status 1``, ``killed: CPU time limit``...)."""
        if self.killed_by == "wall":
            return "killed: wall-time limit exceeded (the program did not finish in time)"
        if self.killed_by == "cpu":
            return "killed: CPU time limit exceeded (infinite loop or too slow)"
        if self.killed_by == "memory":
            return "stopped: memory limit exceeded (MemoryError)"
        if self.signal is not None:
            return f"killed by signal {signal.Signals(self.signal).name if self.signal in signal.Signals._value2member_map_ else self.signal}"
        return f"exit status {self.exit_code}"


def check_isolation() -> None:
    """Raise :class:`SandboxUnavailable` (saying why and what to do) unless :func:`run_python` can isolate code."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(f"the code sandbox needs Linux namespaces; this is {sys.platform}. Run on Linux.")
    if os.geteuid() != 0:
        raise SandboxUnavailable(
            "the code sandbox needs root (it creates mount/network/PID namespaces and switches to a fresh uid); "
            f"this process runs as uid {os.geteuid()}. Run as root, e.g. in a container (docker run --cap-add SYS_ADMIN)."
        )


def run_python(code: str, *, files: dict[str, str] | None = None, stdin: str = "", limits: Limits = Limits()) -> SandboxResult:
    """Run ``code`` as ``/work/main.py`` with ``python -S`` inside the sandbox; never raises for bad code.

    Args:
        code: the program's source.
        files: extra files for the working directory, relative path -> text (e.g. a test harness).
        stdin: text fed to the program's standard input.
        limits: the resource limits.

    Raises :class:`SandboxUnavailable` when the machine cannot isolate code (see :func:`check_isolation`).
    """
    check_isolation()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="turnrl-sandbox-") as scratch:
        os.chmod(scratch, 0o700)
        work, root = os.path.join(scratch, "work"), os.path.join(scratch, "root")
        os.mkdir(work)
        os.mkdir(root)
        for rel, text in {**(files or {}), "main.py": code}.items():
            path = os.path.normpath(os.path.join(work, rel))
            if not path.startswith(work + os.sep):
                raise ValueError(f"sandbox file name {rel!r} must be a relative path inside the working directory")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        config = {
            "work": work, "root": root, "limits": limits.__dict__,
            "interpreter": os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable),
            "prefixes": sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}),
        }
        status_r, status_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), "--launch", json.dumps(config), str(status_w)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=(status_w,), start_new_session=True, env={"PATH": "/usr/bin:/bin"},
            )
        finally:
            os.close(status_w)
        out, err = _Capped(proc.stdout, limits.max_output_bytes), _Capped(proc.stderr, limits.max_output_bytes)
        feeder = threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True)
        feeder.start()
        timed_out = False
        try:
            proc.wait(timeout=limits.wall_seconds)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        with os.fdopen(status_r, "rb") as f:
            raw = f.read()
        out.join(), err.join()
        duration = time.monotonic() - start
    status = json.loads(raw) if raw else {}
    if "setup_error" in status:
        raise SandboxUnavailable(f"the sandbox could not be set up: {status['setup_error']}")
    if not timed_out and not status:
        raise SandboxUnavailable(f"the sandbox launcher exited with {proc.returncode} without reporting: {err.text()[-500:]}")
    stderr = err.text()
    exit_code, sig, cpu = status.get("exit_code"), status.get("signal"), float(status.get("cpu_seconds", 0.0))
    killed_by: KilledBy | None = None
    if timed_out:
        killed_by, exit_code, sig = "wall", None, signal.SIGKILL
    elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= limits.cpu_seconds - 0.05):
        killed_by = "cpu"
    elif exit_code not in (0, None) and _ran_out_of_memory(stderr):
        killed_by = "memory"
    return SandboxResult(out.text(), stderr, exit_code, sig, timed_out, killed_by, duration, cpu, UID_BASE + proc.pid,
                         out.truncated, err.truncated)


def _ran_out_of_memory(stderr: str) -> bool:
    tail = stderr.strip().splitlines()[-3:]
    return any(line.startswith("MemoryError") or "Cannot allocate memory" in line or "out of memory" in line for line in tail)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError):
        pass


class _Capped:
    """Drain a pipe in a thread, keeping the first ``cap`` bytes."""

    def __init__(self, pipe, cap: int) -> None:
        self.pipe, self.cap, self.data, self.truncated = pipe, cap, bytearray(), False
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while chunk := self.pipe.read1(65536):
            room = self.cap - len(self.data)
            if len(chunk) > room:
                self.truncated = True
            self.data += chunk[: max(room, 0)]
        self.pipe.close()

    def join(self) -> None:
        self.thread.join()

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------------------------------------
# The launcher: everything below runs in the child processes, started as `python sandbox.py --launch ...`.


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(libc: ctypes.CDLL, src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {src} on {dst}")


def _bind_readonly(libc: ctypes.CDLL, src: str, dst: str) -> None:
    _mount(libc, src, dst, None, _MS_BIND | _MS_REC)
    _mount(libc, None, dst, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _build_root(libc: ctypes.CDLL, config: dict, uid: int) -> None:
    """Mount the run's tmpfs at ``root`` and fill it: runtime bind mounts, devices, ``/tmp``, ``/work``."""
    root, limits = config["root"], config["limits"]
    _mount(libc, "tmpfs", root, "tmpfs", _MS_NOSUID, f"size={limits['disk_mb']}m,mode=755")
    for path in _RUNTIME_DIRS:
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        elif os.path.isdir(path):
            os.makedirs(root + path)
            _bind_readonly(libc, path, root + path)
    for prefix in config["prefixes"]:
        if not any(prefix == d or prefix.startswith(d + "/") for d in _RUNTIME_DIRS):
            os.makedirs(root + prefix, mode=0o755)
            _bind_readonly(libc, prefix, root + prefix)
    os.makedirs(root + "/dev")
    for dev in _DEVICES:
        open(f"{root}/dev/{dev}", "w").close()
        _mount(libc, f"/dev/{dev}", f"{root}/dev/{dev}", None, _MS_BIND)
    os.mkdir(root + "/tmp")
    os.chmod(root + "/tmp", 0o1777)
    shutil.copytree(config["work"], root + "/work")
    for dirpath, dirnames, filenames in os.walk(root + "/work"):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(name, uid, uid)


def _exec_worker(libc: ctypes.CDLL, config: dict, uid: int) -> None:
    """In the forked worker (already chroot-ed): drop to ``uid``, apply the limits, exec the interpreter."""
    limits = config["limits"]
    mb = 1024 * 1024
    for res, value in (
        (resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1)),
        (resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2),
        (resource.RLIMIT_NPROC, (limits["max_processes"],) * 2),
        (resource.RLIMIT_FSIZE, (limits["disk_mb"] * mb,) * 2),
        (resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(res, value)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.chdir("/work")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "PYTHONHASHSEED": "0", "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1"}
    os.execve(config["interpreter"], [config["interpreter"], "-s", "-S", "-B", "main.py"], env)


def _namespace_init(libc: ctypes.CDLL, config: dict, uid: int, status_fd: int) -> int:
    """PID 1 of the new namespace: build the root, run the worker, report its status. Returns an exit code."""
    try:
        _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing we mount propagates to the host
        _build_root(libc, config, uid)
        os.chroot(config["root"])
        os.chdir("/")
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises SandboxUnavailable
        os.write(status_fd, json.dumps({"setup_error": f"{type(e).__name__}: {e}"}).encode())
        return _SETUP_FAILED
    worker = os.fork()
    if worker == 0:
        try:
            os.close(status_fd)
            _exec_worker(libc, config, uid)
        except BaseException as e:  # noqa: BLE001
            os.write(2, f"sandbox: could not start the program: {type(e).__name__}: {e}\n".encode())
        os._exit(_SETUP_FAILED)
    _, status, usage = os.wait4(worker, 0)
    report = {
        "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
    }
    os.write(status_fd, json.dumps(report).encode())
    return 0


def _launch(config: dict, status_fd: int) -> int:
    """The launcher (host PID namespace): unshare, fork the namespace's PID 1, wait for it."""
    libc = _libc()
    uid = UID_BASE + os.getpid()
    try:
        _check(libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS), "unshare")
    except OSError as e:
        os.write(status_fd, json.dumps({"setup_error": f"{e} (creating namespaces needs root or CAP_SYS_ADMIN)"}).encode())
        return _SETUP_FAILED
    child = os.fork()
    if child == 0:
        code = 1
        try:
            code = _namespace_init(libc, config, uid, status_fd)
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--launch":
    sys.exit(_launch(json.loads(sys.argv[2]), int(sys.argv[3])))
