"""Confining one submission's grading process: its own namespaces, a filesystem it can only write in its scratch
directory, and limits on memory, file size and time.

``run_confined`` runs a function in a child (the *keeper*, trusted code) that creates a new user and PID
namespace and forks the *grader* into it as the namespace's PID 1; the grader applies the rlimits and a Landlock
ruleset, then runs the function and writes its JSON answer to a pipe the keeper reads. When the grader exits or is
killed at the time limit, the kernel kills every process left in its PID namespace: a fork, a ``setsid`` double
fork or a daemon cannot outlive it. In the new user namespace the grader holds no capability of the machine's
root: it cannot raise its rlimits again, and it sees (and can signal) only its own PID namespace.

Landlock (Linux >= 5.13; ``landlock_abi``) confines the grader's filesystem to reading the Python installation
and the course package and reading and writing its scratch directory; from ABI 4 on it has no TCP, from ABI 6 on
it can signal no process outside its domain. Where the kernel lacks Landlock or unprivileged user namespaces,
``unavailable`` says why and ``python -m course grade-class`` refuses unless ``--unconfined`` accepts grading
with the time and memory limits alone.
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from course.implementations import REPO_ROOT

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_CLONE_NEWUSER, _CLONE_NEWPID = 0x10000000, 0x20000000
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38

# Landlock's filesystem rights (include/uapi/linux/landlock.h), and the ABI that introduced the last ones
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ABI1_RIGHTS = (1 << 13) - 1                  # execute ... make_sym
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV   # the rights a rule on a file may hold
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1   # ABI 4
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1   # ABI 6
_READ_ONLY = _EXECUTE | _READ_FILE | _READ_DIR

MAX_ANSWER_BYTES = 32 << 20   # a grader's JSON answer; more is a broken submission, not a result
_POLL_SECONDS = 0.05


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none (or it is disabled)."""
    abi = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), _LANDLOCK_CREATE_RULESET_VERSION)
    return max(abi, 0)


def _handled_rights(abi: int) -> int:
    return _ABI1_RIGHTS | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0) | \
        (_IOCTL_DEV if abi >= 5 else 0)


def _failed(what: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"{what}: {os.strerror(number)}")


def confine_filesystem(readable: list[Path], writable: list[Path]) -> int:
    """Landlock this process (and what it starts): read ``readable``, read and write ``writable``, nothing
    else; no TCP and no signals out of the domain where the ABI has them. Returns the ABI used."""
    abi = landlock_abi()
    if abi < 1:
        raise OSError("this kernel has no Landlock")
    handled = _handled_rights(abi)
    attr = _RulesetAttr(handled, (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0,
                        (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise _failed("landlock_create_ruleset")
    try:
        for paths, rights in ((readable, _READ_ONLY), (writable, handled)):
            for path in paths:
                if not path.exists():
                    continue
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                try:
                    allowed = rights & (handled if path.is_dir() else _FILE_RIGHTS)
                    rule = _PathBeneathAttr(allowed, fd)
                    if _libc.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH,
                                     ctypes.byref(rule), 0) != 0:
                        raise _failed(f"landlock_add_rule {path}")
                finally:
                    os.close(fd)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _failed("prctl(PR_SET_NO_NEW_PRIVS)")
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise _failed("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def readable_paths() -> list[Path]:
    """What a confined grader may read: the Python installation (standard library and site-packages), the
    course package and its built-in data, and the few system files Python, torch and matplotlib open."""
    python = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    python |= {Path(p).resolve() for p in sys.path if p and Path(p).is_dir() and "site-packages" in p}
    system = [Path(p) for p in ("/dev/urandom", "/dev/zero", "/proc/self", "/proc/cpuinfo",
                                "/proc/meminfo", "/sys/devices/system/cpu", "/etc/localtime", "/usr/share/zoneinfo",
                                "/etc/ld.so.cache", "/usr/lib", "/lib", "/lib64")]
    return sorted(python) + [REPO_ROOT / "course", REPO_ROOT / "labs" / "data"] + system


def _enter_namespaces() -> None:
    """A new user namespace (no capability over the machine) and PID namespace (the next fork is its PID 1)."""
    if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWPID) != 0:
        raise _failed("unshare(CLONE_NEWUSER | CLONE_NEWPID)")


def unavailable() -> Optional[str]:
    """Why this machine cannot confine a grader (no Landlock, no user or PID namespaces), or None."""
    if not sys.platform.startswith("linux"):
        return f"confinement needs Linux, this is {sys.platform}"
    if landlock_abi() < 1:
        return "this kernel has no Landlock (Linux >= 5.13 with landlock in the lsm= list)"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _enter_namespaces()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return "this kernel does not let this user create user and PID namespaces (unshare failed)"
    return None


@dataclass(frozen=True)
class Limits:
    seconds: float          # wall time of the whole grading of one submission
    memory_mb: int          # address space of the grader (RLIMIT_AS)
    file_mb: int = 256      # the largest file the grader may write (RLIMIT_FSIZE)
    confined: bool = True   # namespaces and Landlock; False: the limits alone (--unconfined)


@dataclass
class Outcome:
    """What became of one confined run: its JSON answer, or why there is none."""
    answer: Optional[dict]
    problem: str            # "" when the answer came back; else timeout, memory, crash, no answer
    seconds: float
    max_rss_mb: float
    stderr: str             # the tail of what the grader wrote on its stderr


def _set_limits(limits: Limits) -> None:
    memory = limits.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits.file_mb << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _grader(work: Callable[[], dict], scratch: Path, answer_fd: int, logs: tuple[int, int], limits: Limits) -> None:
    """In the grader (PID 1 of its namespace when confined): limits, confinement, the work, the answer."""
    code = 1
    try:
        for target, log in zip((1, 2), logs):
            os.dup2(log, target)
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)   # the keeper gone: so is the grader
        os.setsid()   # kill(0, ...) reaches its own process group, not the pool's
        os.chdir(scratch)
        for name in ("HOME", "TMPDIR", "MPLCONFIGDIR"):
            os.environ[name] = str(scratch)
        if limits.confined:
            confine_filesystem(readable_paths(), [scratch, Path(os.devnull)])
        _set_limits(limits)
        answer = json.dumps(work()).encode()
        with os.fdopen(answer_fd, "wb") as pipe:
            pipe.write(answer)
        code = 0
    except BaseException:   # noqa: B036 - the grader must reach os._exit; the traceback goes to its stderr log
        sys.excepthook(*sys.exc_info())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _close_inherited() -> None:
    """Close what the pool had open (its protocol stream, other runs' pipes): no grader may reach them."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))


def _keeper(work: Callable[[], dict], scratch: Path, private: Path, limits: Limits) -> None:
    """In the keeper: start the grader, read its answer, kill it at the time limit, write ``private/outcome``."""
    start = time.monotonic()
    answer, problem, status, rusage = bytearray(), "", 0, None
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)   # the pool gone (an interrupted run): so is this run
    _close_inherited()
    logs = [os.open(private / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) for name in ("stdout", "stderr")]
    try:
        if limits.confined:
            _enter_namespaces()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            _grader(work, scratch, write_end, (logs[0], logs[1]), limits)
        os.close(write_end)
        open_pipe = True
        while True:
            if open_pipe and select.select([read_end], [], [], _POLL_SECONDS)[0]:
                chunk = os.read(read_end, 1 << 16)
                open_pipe = bool(chunk)
                answer += chunk[:max(0, MAX_ANSWER_BYTES + 1 - len(answer))]
            elif not open_pipe:
                time.sleep(_POLL_SECONDS)
            done, status, rusage = os.wait4(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - start > limits.seconds:
                os.kill(pid, signal.SIGKILL)
                _, status, rusage = os.wait4(pid, 0)
                problem = f"timed out after {limits.seconds:g} s (killed, with every process it started)"
                break
        while open_pipe and (chunk := os.read(read_end, 1 << 16)):
            answer += chunk[:max(0, MAX_ANSWER_BYTES + 1 - len(answer))]
        outcome = {"seconds": time.monotonic() - start, "max_rss_mb": rusage.ru_maxrss / 1024 if rusage else 0.0,
                   "exit": os.waitstatus_to_exitcode(status), "answer": answer.decode(errors="replace"),
                   "problem": problem}
    except BaseException as exc:   # noqa: B036 - the keeper too must reach os._exit
        outcome = {"seconds": time.monotonic() - start, "max_rss_mb": 0.0, "exit": None, "answer": "",
                   "problem": f"the sandbox could not start: {type(exc).__name__}: {exc}"}
    (private / "outcome.json").write_text(json.dumps(outcome))
    os._exit(0)


def start_confined(work: Callable[[], dict], scratch: Path, private: Path, limits: Limits) -> int:
    """Fork the keeper of one run of ``work`` (in a single-threaded process: see module docstring); returns its
    pid. ``scratch`` is all the grader may write; ``private`` (not readable by it) receives its logs and outcome.
    Collect the result with ``outcome`` once the pid has exited."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _keeper(work, scratch, private, limits)
    return pid


def outcome(private: Path, limits: Limits) -> Outcome:
    """The outcome the keeper wrote in ``private``: the grader's answer, or the reason it has none."""
    try:
        raw = json.loads((private / "outcome.json").read_text())
    except (OSError, ValueError):
        raw = {"seconds": 0.0, "max_rss_mb": 0.0, "exit": None, "answer": "", "problem": "the sandbox died"}
    stderr = (private / "stderr").read_bytes()[-4000:].decode(errors="replace") if (private / "stderr").exists() else ""
    problem, answer = raw["problem"], None
    if not problem:
        try:
            answer = json.loads(raw["answer"]) if len(raw["answer"]) <= MAX_ANSWER_BYTES else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            answer = None
            problem = _why_no_answer(raw["exit"], stderr, raw["max_rss_mb"], limits)
    return Outcome(answer, problem, raw["seconds"], raw["max_rss_mb"], stderr)


def _why_no_answer(exit_code, stderr: str, max_rss_mb: float, limits: Limits) -> str:
    if "MemoryError" in stderr or max_rss_mb >= limits.memory_mb * 0.9:
        return f"ran out of its {limits.memory_mb} MiB of memory"
    if exit_code is not None and exit_code < 0:
        return f"crashed (signal {signal.Signals(-exit_code).name})"
    return f"crashed (exit code {exit_code}) before answering"
