"""Run untrusted Python code (model-written programs) in an isolated, resource-limited child process.

    result = run_python("print(sum(range(10)))", limits=Limits(cpu_seconds=2))
    result.stdout == "45\\n" and result.ok

The isolation is bubblewrap's (``bwrap``, the sandbox Flatpak is built on) with a seccomp filter compiled by
libseccomp (through ``pyseccomp``); this module writes bubblewrap's command line and reads back what happened.
``docs/sandbox.md`` states the threat model in full (what is defended and what is not) and how to install
bubblewrap. Each run gets:

- **Namespaces**: new mount, PID, network, IPC, UTS and cgroup namespaces (and, without root, a user
  namespace). The network namespace holds only its own loopback interface: no host or outside address can
  be reached. When the run's first process exits, the kernel kills every process left in its PID namespace.
- **Filesystem**: a new root holding read-only binds of the Python runtime (``/usr``, the ``/lib*`` links
  and the interpreter's ``sys.base_prefix``), four device nodes (``null``, ``zero``, ``random``,
  ``urandom``) and two size-limited tmpfs mounts: ``/tmp`` and the working directory ``/work`` (a copy of
  ``files`` and ``main.py``). No ``/etc``, ``/home``, ``/proc``, ``/sys`` or project directory.
- **Identity**: as root, a fresh unprivileged uid per run (see :data:`UID_BASE`) with no groups; without
  root, the caller's own uid inside a user namespace. No capabilities, ``no_new_privs``.
- **Syscall filter** (seccomp, :data:`DENIED_SYSCALLS` and :func:`_seccomp_program`): namespace, mount,
  ptrace, keyring, BPF, io_uring, perf, module and clock syscalls fail with ``EPERM``; sockets other than
  Unix, IPv4 and IPv6 with ``EAFNOSUPPORT``; a syscall through another ABI (i386 ``int 0x80``, x32) kills
  the process.
- **Resource limits** (``setrlimit``): CPU seconds (``SIGXCPU``, ``SIGKILL`` one second later), address
  space (allocations fail with ``MemoryError``), processes, file size, open files, no core dumps.
- **Wall time**: the parent kills bubblewrap's process group after ``wall_seconds``; the sandbox dies with it.
- **Output**: at most ``max_output_bytes`` of stdout and of stderr are kept (the rest is read and dropped).

Inside, a small supervisor (:data:`_SUPERVISOR`) is the sandbox's PID 1: it starts the code under the
limits (as root, after switching it to the run's uid) and reports its exit status, signal and CPU time.

``run_python`` never raises because of the code it runs: syntax errors, exceptions, crashes, limits and
hangs all come back as a :class:`SandboxResult`. When the machine cannot isolate code (not Linux, no
bubblewrap, no user namespaces) it raises :class:`SandboxUnavailable` saying what to install; it never runs
code unprotected.
"""

from __future__ import annotations

import errno
import functools
import itertools
import json
import os
import resource
import select
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
"""As root, code runs as uid/gid ``UID_BASE + 256 * <caller pid> + <run counter mod 256>``: a uid no host account
uses, distinct for every run in flight on the host (up to 256 at once per calling process)."""

KilledBy = Literal["cpu", "memory", "wall"]

DENIED_SYSCALLS: tuple[tuple[str, int], ...] = tuple(
    [(name, errno.EPERM) for name in (
        # namespaces and mounts: the isolation itself must not be undone or nested (a user namespace would hand
        # the code every capability over new namespaces, a large kernel attack surface)
        "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot",
        # other processes' memory and the kernel's view of them
        "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "perf_event_open",
        # kernel interfaces unneeded by Python programs and with a history of exploitable bugs
        "bpf", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
        "add_key", "keyctl", "request_key", "open_by_handle_at", "name_to_handle_at",
        "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
        "swapon", "swapoff", "acct", "syslog", "quotactl", "quotactl_fd", "lookup_dcookie", "nfsservctl",
        "uselib", "sysfs", "ustat", "_sysctl", "vhangup", "iopl", "ioperm", "modify_ldt",
        "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
        "mbind", "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages",
    )]
    # the new mount API and clone3 (whose flags seccomp cannot read): ENOSYS, so libc falls back to the old calls
    + [(name, errno.ENOSYS) for name in ("open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
                                         "mount_setattr", "clone3")]
)
"""Syscalls the filter refuses, with the errno they fail with; everything else is allowed. The list follows
Flatpak's filter (itself from linux-user-chroot and Sandstorm) and Docker's default profile. Conditional rules
(``clone`` with a namespace flag, ``ioctl`` TIOCSTI/TIOCLINUX, ``personality`` changes, socket families) are in
:func:`_seccomp_program`."""

_CLONE_NAMESPACE_FLAGS = (0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)  # CLONE_NEW*
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_ALLOWED_SOCKET_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6
_AF_MAX = 46  # one past the last address family Linux 6.x defines (AF_MCTP = 45)
_RUNTIME_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
_DEVICES = ("null", "zero", "random", "urandom")
_INSTALL_BWRAP = "install bubblewrap: `apt-get install bubblewrap` (Debian, Ubuntu), `dnf install bubblewrap` (Fedora)"
_RUN_COUNTER = itertools.count()


class SandboxUnavailable(RuntimeError):
    """This machine cannot isolate code as documented (not Linux, no bubblewrap, namespaces not allowed)."""


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
    """Processes (and threads) the code may have at once; further forks fail with ``EAGAIN``."""
    disk_mb: int = 32
    """Size of each of the run's two tmpfs mounts (``/work`` and ``/tmp``) and the largest file it may write."""
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
    """What a run did. ``exit_code`` is None when the code died of a signal (then ``signal`` names it)."""

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
    """CPU seconds (user + system) used by the code's process and the children it waited for."""
    uid: int = -1
    """The host uid the code ran as: a fresh one under root (see :data:`UID_BASE`), else the caller's."""
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
    """Raise :class:`SandboxUnavailable` (saying why and what to do) unless :func:`run_python` can isolate code.

    The first call on a machine runs one empty program in the sandbox; later calls only look for the tools.
    """
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(f"the code sandbox needs Linux namespaces; this is {sys.platform}. Run on Linux.")
    _probe(_tools()["bwrap"])


def run_python(code: str, *, files: dict[str, str] | None = None, stdin: str = "", limits: Limits = Limits()) -> SandboxResult:
    """Run ``code`` as ``/work/main.py`` with ``python -S`` inside the sandbox; never raises for bad code.

    Args:
        code: the program's source.
        files: extra files for the working directory, relative path -> text (e.g. a test harness).
        stdin: text fed to the program's standard input.
        limits: the resource limits.

    Raises :class:`SandboxUnavailable` when the machine cannot isolate code (see :func:`check_isolation`), and
    ``ValueError`` for a file name that leaves the working directory.
    """
    work = _work_files({**(files or {}), "main.py": code})
    check_isolation()
    return _run(work, stdin, limits)


@functools.cache
def _probe(bwrap: str) -> None:
    """Run an empty program once per ``bwrap`` binary; a set-up failure raises :class:`SandboxUnavailable`."""
    result = _run({"/work/main.py": ""}, "", Limits())
    if not result.ok:
        raise SandboxUnavailable(f"the sandbox's test run failed ({result.describe()}): {result.stderr.strip()[-500:]}")


def _tools() -> dict[str, str]:
    """The host programs a run needs: bubblewrap, and the interpreter the code runs on."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"the code sandbox runs code under bubblewrap, which is not installed; {_INSTALL_BWRAP}")
    return {"bwrap": bwrap, "python": os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)}


def _work_files(files: dict[str, str]) -> dict[str, str]:
    """Map each relative file name to its absolute path under ``/work``, refusing names that leave it."""
    out = {}
    for rel, text in files.items():
        path = os.path.normpath(os.path.join("/work", rel))
        if not path.startswith("/work/"):
            raise ValueError(f"sandbox file name {rel!r} must be a relative path inside the working directory")
        out[path] = text
    return out


def _run(work: dict[str, str], stdin: str, limits: Limits) -> SandboxResult:
    """Run the files ``work`` (absolute path -> text) in a new sandbox: start it, feed and drain it, read the code's status."""
    root = os.geteuid() == 0
    uid = UID_BASE + 256 * os.getpid() + next(_RUN_COUNTER) % 256 if root else os.getuid()
    start = time.monotonic()
    proc, report = _start(work, limits, uid if root else None)
    out, err = _Capped(proc.stdout, limits.max_output_bytes), _Capped(proc.stderr, limits.max_output_bytes)
    threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True).start()
    timed_out = _wait(proc, limits.wall_seconds)
    with os.fdopen(report, "rb") as f:
        raw = f.read()
    out.join(), err.join()
    duration = time.monotonic() - start
    if not timed_out and not raw:  # bubblewrap or the supervisor stopped before the code ran
        raise SandboxUnavailable(f"bubblewrap could not set up the sandbox: {err.text().strip()[-500:]}. It needs "
                                 "user namespaces (without root) or CAP_SYS_ADMIN (as root); see docs/sandbox.md")
    status = json.loads(raw) if raw else {}
    stderr = err.text()
    exit_code, sig, cpu = status.get("exit_code"), status.get("signal"), float(status.get("cpu_seconds", 0.0))
    killed_by: KilledBy | None = None
    if timed_out:
        killed_by, exit_code, sig = "wall", None, signal.SIGKILL
    elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= limits.cpu_seconds - 0.05):
        killed_by = "cpu"
    elif exit_code not in (0, None) and _ran_out_of_memory(stderr):
        killed_by = "memory"
    return SandboxResult(out.text(), stderr, exit_code, sig, timed_out, killed_by, duration, cpu, uid, out.truncated, err.truncated)


def _start(work: dict[str, str], limits: Limits, uid: int | None) -> tuple[subprocess.Popen, int]:
    """Start bubblewrap in a new session with the supervisor as its command: (the process, the report pipe's read end).

    ``uid`` is the uid the supervisor switches the code to (as root), or None to keep the caller's.
    """
    tools = _tools()
    fds = [_memfd("seccomp", _seccomp_program())] + [_memfd("file", text.encode()) for text in work.values()]
    report_r, report_w = os.pipe()
    config = {"argv": [tools["python"], "-s", "-S", "-B", "main.py"], "uid": uid, "report_fd": report_w,
              "rlimits": _rlimits(limits, root=uid is not None)}
    argv = [tools["bwrap"], *_bwrap_options(work, fds, limits, root=uid is not None), "--",
            tools["python"], "-I", "-S", "-B", "-c", _SUPERVISOR, json.dumps(config)]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(*fds, report_w), start_new_session=True, env={"PATH": "/usr/bin:/bin"})
    except BaseException:
        os.close(report_r)
        raise
    finally:
        for fd in (*fds, report_w):
            os.close(fd)
    return proc, report_r


def _rlimits(limits: Limits, root: bool) -> list[tuple[int, tuple[int, int]]]:
    """``setrlimit`` arguments for the code's process (the supervisor itself runs without limits)."""
    mb = 1024 * 1024
    # Without root the supervisor shares the code's uid inside the user namespace, so it is one of its processes.
    nproc = limits.max_processes + (0 if root else 1)
    return [
        (resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1)),
        (resource.RLIMIT_AS, (limits.memory_mb * mb,) * 2),
        (resource.RLIMIT_NPROC, (nproc,) * 2),
        (resource.RLIMIT_FSIZE, (limits.disk_mb * mb,) * 2),
        (resource.RLIMIT_NOFILE, (limits.max_open_files,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]


_SUPERVISOR = r"""
import json, os, resource, signal, sys
config = json.loads(sys.argv[1])
signal.signal(signal.SIGINT, signal.SIG_DFL)  # a namespace's PID 1 ignores default-handled signals from inside it
code = os.fork()
if code == 0:
    try:
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        if config["uid"] is not None:
            os.setgroups([])
            os.setresgid(config["uid"], config["uid"], config["uid"])
            os.setresuid(config["uid"], config["uid"], config["uid"])
        for res, value in config["rlimits"]:
            resource.setrlimit(res, value)
        os.execv(config["argv"][0], config["argv"])
    except BaseException as e:
        os.write(2, f"sandbox: could not start the program: {type(e).__name__}: {e}\n".encode())
    os._exit(127)
while True:
    pid, status, usage = os.wait4(-1, 0)
    if pid == code:
        break
os.write(config["report_fd"], json.dumps({
    "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
    "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
    "cpu_seconds": usage.ru_utime + usage.ru_stime,
}).encode())
"""
"""PID 1 of the sandbox (run with ``python -I -S -c``, stdlib only): fork the code, drop it to its uid (as root),
apply the limits, exec the interpreter on ``main.py``, reap every process until the code exits, then report its
exit status, signal and CPU time (its own and its waited-for children's) on ``report_fd``. When it exits the kernel
kills whatever is left in the PID namespace."""


def _bwrap_options(work: dict[str, str], fds: list[int], limits: Limits, root: bool) -> list[str]:
    """bubblewrap's options: namespaces, the new root's mounts, the environment and the syscall filter.

    ``fds`` are the seccomp program, then one memfd per file of ``work`` in order. Mounts are made in order;
    the root and ``/dev`` are remounted read-only once filled.
    """
    opts = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
            "--as-pid-1"]
    if root:  # no user namespace; the supervisor keeps only what it needs to drop the code to the run's uid
        opts += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        opts += ["--unshare-user"]
    size = str(limits.disk_mb * 1024 * 1024)
    opts += [*_runtime_mounts(), "--perms", "1777", "--size", size, "--tmpfs", "/tmp",
             "--perms", "0777", "--size", size, "--tmpfs", "/work"]
    dirs = sorted({d for path in work for d in _parents(path) if d.startswith("/work/")})
    opts += [a for d in dirs for a in ("--perms", "0777", "--dir", d)]
    for fd, path in zip(fds[1:], work):
        opts += ["--perms", "0666", "--file", str(fd), path]
    opts += ["--remount-ro", "/", "--chdir", "/work", "--clearenv"]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/work", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
           "PYTHONIOENCODING": "utf-8", "PYTHONDONTWRITEBYTECODE": "1"}
    opts += [a for k, v in env.items() for a in ("--setenv", k, v)]
    return opts + ["--seccomp", str(fds[0])]


def _runtime_mounts() -> list[str]:
    """bubblewrap's options for the read-only runtime: ``/usr``, the ``/lib*`` and ``/bin`` links (or directories),
    the interpreter's prefix when it lives elsewhere (its parents made traversable), and a read-only ``/dev``."""
    opts = []
    for path in _RUNTIME_DIRS:
        if os.path.islink(path):
            opts += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            opts += ["--ro-bind", path, path]
    for prefix in sorted({os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}):
        if not any(prefix == d or prefix.startswith(d + "/") for d in _RUNTIME_DIRS):
            opts += [a for d in _parents(prefix) for a in ("--perms", "0755", "--dir", d)] + ["--ro-bind", prefix, prefix]
    opts += ["--perms", "0755", "--tmpfs", "/dev"]
    for dev in _DEVICES:
        opts += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
    return opts + ["--remount-ro", "/dev"]


def _parents(path: str) -> list[str]:
    """The directories above ``path``, outermost first, without ``/``: ``/a/b/c`` -> ``[/a, /a/b]``."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


@functools.cache
def _seccomp_program() -> bytes:
    """The syscall filter as the BPF program ``bwrap --seccomp`` loads, compiled by libseccomp for this machine.

    Default action: allow. :data:`DENIED_SYSCALLS` fail with their errno; ``clone`` with a namespace flag, the
    ``ioctl`` requests that inject terminal input (TIOCSTI, TIOCLINUX) and ``personality`` other than a query
    fail with ``EPERM``; ``socket`` outside Unix/IPv4/IPv6 with ``EAFNOSUPPORT``. A syscall made through
    another ABI than the native one (i386 ``int 0x80`` or x32 on x86-64) kills the process (``SIGSYS``), so no
    rule can be bypassed by a second syscall table.
    """
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError) as e:  # RuntimeError: pyseccomp found no libseccomp
        raise SandboxUnavailable(f"the sandbox's syscall filter needs pyseccomp and libseccomp ({e}): "
                                 "pip install 'turnrl[sandbox]' (libseccomp2 is a Debian base package)") from e
    f = seccomp.SyscallFilter(seccomp.ALLOW)
    f.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    for name, err in DENIED_SYSCALLS:
        f.add_rule(seccomp.ERRNO(err), name)
    deny, no_family = seccomp.ERRNO(errno.EPERM), seccomp.ERRNO(errno.EAFNOSUPPORT)
    for flag in _CLONE_NAMESPACE_FLAGS:
        f.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    for request in (_TIOCSTI, _TIOCLINUX):
        f.add_rule(deny, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
    f.add_rule(deny, "personality", seccomp.Arg(0, seccomp.NE, 0xFFFFFFFF))
    for family in sorted(set(range(_AF_MAX)) - set(_ALLOWED_SOCKET_FAMILIES)):
        f.add_rule(no_family, "socket", seccomp.Arg(0, seccomp.EQ, family))
    f.add_rule(no_family, "socket", seccomp.Arg(0, seccomp.GE, _AF_MAX))
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()


def _memfd(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding ``data``, positioned at its start (bubblewrap reads it from there)."""
    fd = os.memfd_create(f"turnrl-sandbox-{name}")
    with open(fd, "wb", closefd=False) as f:
        f.write(data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _wait(proc: subprocess.Popen, wall_seconds: float) -> bool:
    """Wait for bubblewrap, killing its process group (and so the sandbox) after ``wall_seconds``; True if it did."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        timed_out = not poller.poll(wall_seconds * 1000)
    finally:
        os.close(pidfd)
    if timed_out:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap is unreaped until proc.wait(), so its pid cannot be reused
        except ProcessLookupError:
            pass
    proc.wait()
    return timed_out


def _ran_out_of_memory(stderr: str) -> bool:
    tail = stderr.strip().splitlines()[-3:]
    return any(line.startswith("MemoryError") or "Cannot allocate memory" in line or "out of memory" in line for line in tail)


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
