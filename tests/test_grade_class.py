"""``python -m course grade-class``: a class graded in parallel, each submission confined, resumable, with a CSV,
a JSON per submission and a report; every attack of issue 35 tried by a submission, each beside an honest correct
and an honest wrong one; Dask's LocalCluster gives the same points.

Three class runs are shared by the tests (each run is the expensive part):

* ``graded_class``: one file-route class of lesson 14: the honest correct one (a corpus solution, not the
  reference), the honest wrong one (that solution with a test that never fails), a stderr-printing, a crashing
  and a partial one, and one submission per attack that does not need a class of its own (they run two at a
  time and none can reach another: that is what is tested). Its first run is interrupted (SIGINT) after the first
  result and a second run finishes it; the machine is compared before and after (files outside the scratch
  directory: contents, modes, timestamps, extended attributes; System V IPC objects; processes; listeners).
* ``graded_class.dask_out``: the two that hang, on Dask's LocalCluster with a short time limit (a hang costs its
  whole limit), beside the partial one graded locally too: the same points both ways.
* ``notebook_class``: the notebook route's attacks (an nbgrader course, like nbgrader's submitted/), beside an
  honest correct and an honest wrong notebook. The notebook route's equality with ``nbgrader autograde`` is
  tested on autograde's own round (tests/test_notebooks.py, ``test_grade_class_scores_every_cell_like_autograde``).
"""
from __future__ import annotations

import csv
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from course.checks import get_lesson
from course.checks.assignments import scored_cells
from course.classroom import grade_class
from course.classroom import confinement
from course.classroom.confinement import Outcome, probe, unavailable
from course.classroom.inside import MUTED_NOTE
from course.classroom.pool import FILES, Settings
from course.classroom.simulate import ENDLESS_LOOP
from course.cli import main
from course.implementations import REFERENCE_DIR, REPO_ROOT

LESSON = get_lesson("14")
TIMEOUT_S = 40        # a correct submission takes ~10 s on a busy 2-core machine
HANG_TIMEOUT_S = 5    # the submissions that hang (their cost) and a quick partial one, graded on Dask
MEMORY_MB = 2500      # each grader process's address space (~1.5 GiB after torch) and its tree's memory (cgroup)
CORRECT = REPO_ROOT / "tests" / "corpus" / "lesson14" / "functional" / LESSON.module_file   # not the reference
NEVER_FAILS = """

def test_accumulation_matches_big_batch(accumulate_gradients):   # a test that passes wrong code too
    pass
"""   # appended to the correct one: the honest wrong one, which loses only the student-test cell
STUDENT_TEST_CELL = "test_test_accumulation_matches_big_batch"
PARTIAL = """
def train_one_epoch(*args, **kwargs):
    raise NotImplementedError("train_one_epoch: TODO")


def test_accumulation_matches_big_batch(accumulate_gradients):
    raise NotImplementedError("test_accumulation_matches_big_batch: TODO")
"""   # appended to the correct one: the four quick exercises written, the two that train left as stubs
DAEMON = "gc-daemon-t1"   # /proc/PID/comm of the processes the attackers start (15 characters at most)
REFUSED = ("x-symlink", "x-fifo", "x-sparse", "x-not-utf8", "x-notebook-only")   # refused before grading
IPC_KEYS = (0x6763_0001, 0x6763_0002, 0x6763_0003)   # the System V keys the IPC attack creates
pytestmark = pytest.mark.skipif(bool(unavailable()), reason=f"no full confinement here: {unavailable()}")

ATTEMPT = textwrap.dedent('''
    import ctypes, os, signal, socket, sys, time
    print("LEFTOVERS", sorted(set(os.listdir("/scratch")) - {"train_loop.py"}), os.listdir("/dev/shm"), file=sys.stderr)

    def attempt(what, action):
        try:
            result = action()
            print(f"ATTACK {what}: succeeded {result!r:.80}", file=sys.stderr)
        except BaseException as exc:
            print(f"ATTACK {what}: {type(exc).__name__}", file=sys.stderr)

    def named(body):
        """Fork a process named DAEMON (in its own session) that runs body, then sleeps forever."""
        child = os.fork()
        if child == 0:
            try:
                os.setsid()
                ctypes.CDLL(None).prctl(15, b"DAEMON", 0, 0, 0)
                body()
                while True:
                    time.sleep(1)
            finally:
                os._exit(0)
        return child

    def daemon():
        """A setsid double fork: the grandchild sleeps forever, named DAEMON."""
        child = os.fork()
        if child == 0:
            named(lambda: None)
            os._exit(0)
        os.waitpid(child, 0)

    def spin(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        os._exit(0)

    def answer_pipes(data):
        """Write data into every pipe this process holds (the answer pipe among them), then exit at once."""
        import stat
        for fd in range(3, 64):
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, data)
            except OSError:
                pass
        os._exit(0)
''').replace("DAEMON", DAEMON)


@dataclass(frozen=True)
class Host:
    """What a submission must not reach, set up on this machine before the class is graded."""
    gradebook: Path          # stands for any file of the instructor's outside the scratch directory
    source_dir: Path         # stands for nbgrader's source/ (the solutions)
    classmate: Path          # another student's file
    tcp_port: int
    udp_port: int
    unix_path: Path
    abstract: str
    token: str               # an instructor's secret in the environment grade-class runs in

    def attacks(self) -> dict[str, str]:
        """student -> the module it hands in: the attack alone (it scores 0 even where it would succeed), or the
        attack beside the correct solution where the run must still grade it."""
        gradebook, source, classmate = str(self.gradebook), str(self.source_dir), str(self.classmate)
        ipc = ", ".join(map(str, IPC_KEYS))
        return {
            "x-read-other": f"attempt('read', lambda: open({classmate!r}).read())",
            "x-write-gradebook": f"attempt('write', lambda: open({gradebook!r}, 'a').write('forged'))",
            "x-write-course": f"attempt('write', lambda: open({str(REPO_ROOT / 'course' / 'PWNED.py')!r}, 'w'))",
            "x-metadata": "\n".join([
                f"attempt('chmod', lambda: os.chmod({gradebook!r}, 0o666))",
                f"attempt('chmod', lambda: os.chmod({source!r}, 0o777))",
                f"attempt('chmod', lambda: os.chmod({classmate!r}, 0))",
                f"attempt('utime', lambda: os.utime({gradebook!r}, (0, 0)))",
                f"attempt('xattr', lambda: os.setxattr({gradebook!r}, 'user.forged', b'1'))",
                f"attempt('chmod', lambda: os.chmod({str(REPO_ROOT / 'course' / '__init__.py')!r}, 0o777))",
                f"attempt('utime', lambda: os.utime({str(REPO_ROOT / 'course' / '__init__.py')!r}, (0, 0)))",
                f"attempt('xattr', lambda: os.setxattr({str(REPO_ROOT / 'course')!r}, 'user.forged', b'1'))"]),
            "x-stat": "\n".join(f"attempt('stat', lambda: os.stat({p!r}).st_mode)" for p in
                                (gradebook, source, str(REPO_ROOT / "notebooks" / "nbgrader_config.py"),
                                 str(REPO_ROOT / "tests"), "/home", "/etc/passwd")),
            "x-ipc": textwrap.dedent(f"""
                libc = ctypes.CDLL(None, use_errno=True)
                libc.shmat.restype = ctypes.c_void_p
                keys = [{ipc}]
                shm = libc.shmget(keys[0], 16 << 20, 0o1666)
                address = libc.shmat(shm, None, 0)
                ctypes.memset(address, 1, 16 << 20)   # resident
                libc.msgget(keys[1], 0o1666)
                libc.semget(keys[2], 1, 0o1666)
                fd = os.open('/dev/shm/gc-posix', os.O_CREAT | os.O_RDWR)
                os.write(fd, b'x' * (16 << 20))
                print('ATTACK ipc: made', shm, file=sys.stderr)
            """),
            "x-environment": "print('ATTACK environment:', dict(os.environ), file=sys.stderr)",
            "x-network": "\n".join([
                f"attempt('tcp', lambda: socket.create_connection(('127.0.0.1', {self.tcp_port}), timeout=2))",
                f"attempt('mptcp', lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262).connect("
                f"('127.0.0.1', {self.tcp_port})))",
                f"attempt('udp', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', "
                f"('127.0.0.1', {self.udp_port})))",
                f"attempt('unix', lambda: socket.socket(socket.AF_UNIX).connect({str(self.unix_path)!r}))",
                f"attempt('abstract', lambda: socket.socket(socket.AF_UNIX).connect({self.abstract!r}))"]),
            "x-proc": textwrap.dedent("""
                me = os.readlink('/proc/self')
                for pid in [p for p in os.listdir('/proc') if p.isdigit() and p != me]:
                    for name in ('environ', 'mem', 'fd'):
                        attempt('proc', lambda: os.listdir(f'/proc/{pid}/fd') if name == 'fd'
                                else open(f'/proc/{pid}/{name}', 'rb').read(1))
            """),
            "x-daemon": "attempt('daemon', daemon)",
            "x-signal": f"attempt('signal', lambda: os.kill({os.getpid()}, signal.SIGTERM))\n"
                        "attempt('signal', lambda: os.kill(-1, signal.SIGKILL))",
            "x-memory": "attempt('memory', lambda: [bytearray(1 << 26) for _ in iter(int, 1)])",
            "x-memfd": textwrap.dedent("""
                def fill(megabytes):   # memfds of 192 MiB each (a file may not pass 256 MiB: RLIMIT_FSIZE)
                    for _ in range(megabytes // 192):
                        fd = os.memfd_create('gc-fill')
                        for _ in range(3):
                            os.write(fd, b'x' * (64 << 20))
                children = [named(lambda: fill(1024)) for _ in range(2)]
                time.sleep(3)
                attempt('memfd', lambda: fill(1024))
            """),
            "x-fork-bomb": textwrap.dedent("""
                count = 0
                try:
                    while True:
                        if os.fork() == 0:
                            time.sleep(60)
                            os._exit(0)
                        count += 1
                except OSError as exc:
                    print(f'ATTACK fork bomb: stopped after {count}: {type(exc).__name__}', file=sys.stderr)
            """),
            # the sandbox's temporary directory ($TMPDIR; /tmp is the same one unless the checkout lives under /tmp)
            # and a folder named like the next submission's file, nested past PATH_MAX (found by an attack pass)
            "x-disk": "tmp = os.environ['TMPDIR']\nos.makedirs(tmp + '/' + 'a/' * 200 + 'deep')\n"
                      f"os.unlink({LESSON.module_file!r})   # read already: it is being imported\n"
                      f"fd = os.open('.', os.O_RDONLY)\nfor part in [{LESSON.module_file!r}] + ['d' * 200] * 30:\n"
                      "    os.mkdir(part, dir_fd=fd)\n    fd = os.open(part, os.O_RDONLY, dir_fd=fd)\n"
                      "os.mkdir(tmp + '/locked')\nos.chmod(tmp + '/locked', 0)\n"
                      "attempt('disk', lambda: [open(tmp + '/gc-fill', 'ab').write(b'x' * (64 << 20)) "
                      "for _ in range(32)])",
            "a-busy": "for _ in range(16):\n    if os.fork() == 0:\n        os.setsid()\n        spin(15)\n"
                      "time.sleep(15)",
            "x-answer-nested": "answer_pipes(b'[' * 200_000)",
            "x-answer-list": "answer_pipes(b'{\"checks\": []}')",
        }


def forgeries() -> dict[str, str]:
    """student -> a module that forges its own points: each must be flagged (worker T's flags)."""
    stubs = (REPO_ROOT / "impl" / LESSON.module_file).read_text(encoding="utf-8")
    names = [c.name for c in LESSON.checks]
    all_pass = json.dumps({"checks": {n: {"status": "PASS", "seconds": 0.0, "message": ""} for n in names}})
    return {
        "z-forge-verdict": stubs + "\nimport course.checks.framework as f\n"
                                   "f._verdict = lambda check, module: f.CheckResult(check.name, check.exercise, "
                                   "f.PASS, '')\n",
        "z-forge-answer": ATTEMPT + f"answer_pipes({all_pass!r}.encode())",
        "z-forge-equal": stubs + "\nimport torch\ntorch.equal = lambda *a, **k: True\n"
                                 "torch.allclose = lambda *a, **k: True\n",
        "z-forge-reference": "from course.reference.train_loop import *\n",
    }


@dataclass(frozen=True)
class GradedClass:
    folder: Path
    out: Path
    dask_out: Path             # the submissions that hang and f-partial, graded on Dask with HANG_TIMEOUT_S
    on_dask: subprocess.CompletedProcess
    interrupted: subprocess.CompletedProcess
    finished: subprocess.CompletedProcess
    host: Host
    before: dict               # the machine's state before grading (``machine_state``)
    after: dict
    course_files: set
    tmp: Path                  # TMPDIR of the runs: what they leave there
    received: list             # what the listeners got


def cli(*args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    env = env or dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "course", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=900, **kwargs)


def grade_command(folder: Path, out: Path, *extra: str, timeout: float = TIMEOUT_S, jobs: int = 2) -> list[str]:
    return ["grade-class", "14", str(folder), "--out", str(out), "--jobs", str(jobs), "--timeout", str(timeout),
            "--memory-mb", str(MEMORY_MB), *extra]


def course_files() -> set:
    return {p for p in (REPO_ROOT / "course").rglob("*") if "__pycache__" not in p.parts}


def _file_state(path: Path):
    info = path.lstat()
    xattrs = {name: os.getxattr(path, name, follow_symlinks=False) for name in os.listxattr(path,
                                                                                            follow_symlinks=False)}
    data = path.read_bytes() if path.is_file() else None
    return info.st_mode, info.st_mtime_ns, info.st_uid, xattrs, data


def sysv_keys() -> set:
    """The System V IPC objects of this machine: (kind, key)."""
    keys = set()
    for kind in ("shm", "msg", "sem"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        keys |= {(kind, int(line.split()[0])) for line in lines if line.strip()}
    return keys


def machine_state(host: Host) -> dict:
    watched = [host.gradebook, host.source_dir, host.source_dir / "solution.ipynb", host.classmate,
               REPO_ROOT / "course" / "__init__.py"]
    course = _file_state(REPO_ROOT / "course")   # its mtime aside: other work may add files to the checkout
    ipc = {(kind, key) for kind in ("shm", "msg", "sem") for key in IPC_KEYS}
    return {"files": {p: _file_state(p) for p in watched}, "course folder": (course[0], course[2], course[3]),
            "ipc": sysv_keys() & ipc,
            "daemons": [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _comm(p) == DAEMON]}


def _comm(proc: Path) -> str:
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return ""


def _listeners(root: Path):
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix_path = root / "instructor.sock"
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(unix_path))
    unix.listen()
    abstract = f"\0grade-class-test-{os.getpid()}"
    hidden = socket.socket(socket.AF_UNIX)
    hidden.bind(abstract)
    hidden.listen()
    sockets = [tcp, udp, unix, hidden]
    for s in sockets:
        s.setblocking(False)
    return sockets, tcp.getsockname()[1], udp.getsockname()[1], unix_path, abstract


def _received(sockets) -> list:
    got = []
    for s in sockets:
        try:
            got.append((s, s.recv(100) if s.type == socket.SOCK_DGRAM else s.accept()))
        except BlockingIOError:
            pass
        s.close()
    return got


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory) -> GradedClass:
    root = tmp_path_factory.mktemp("class")
    folder, out, tmp = root / "submitted", root / "results", root / "tmp"
    tmp.mkdir()
    correct = CORRECT.read_text(encoding="utf-8")
    reference = (REFERENCE_DIR / LESSON.module_file).read_text(encoding="utf-8")
    sockets, tcp_port, udp_port, unix_path, abstract = _listeners(root)
    host = Host(root / "gradebook.db", root / "source", folder / "a-correct" / LESSON.module_file, tcp_port, udp_port,
                unix_path, abstract, f"instructor-token-{secrets.token_hex(8)}")
    host.gradebook.write_bytes(b"the instructor's grades")
    host.source_dir.mkdir()
    (host.source_dir / "solution.ipynb").write_text("the solutions")
    modules = {"a-correct": correct, "b-wrong": correct + NEVER_FAILS, "f-partial": correct + PARTIAL,
               "d-stderr": correct + "\nimport sys\nprint('debugging output', file=sys.stderr)\n",
               "e-crash": correct + "\nimport ctypes\nctypes.string_at(0)   # a crash in native code\n",
               "x-surrogate": correct + "\nimport sys\nprint('a lone \\udcff surrogate', file=sys.stderr)\n"
                              "def test_accumulation_matches_big_batch(accumulate_gradients):\n"
                              "    raise ValueError('bad \\ud800 value')\n"}
    modules |= {student: ATTEMPT + attack for student, attack in host.attacks().items()}
    modules |= forgeries()
    on_dask = {"c-hanging": reference + "\n" + ENDLESS_LOOP, "x-fork-and-hang": ATTEMPT + "attempt('daemon', daemon)\n"
               "while True:\n    time.sleep(1)", "f-partial": modules["f-partial"]}
    for where, submissions in ((folder, modules), (root / "on-dask", on_dask)):
        for student, source in submissions.items():
            (where / student).mkdir(parents=True)
            (where / student / LESSON.module_file).write_text(source, encoding="utf-8")
    # submissions that are broken as folders: each refused with its reason before anything is copied
    (folder / "x-symlink").mkdir()
    (folder / "x-symlink" / LESSON.module_file).symlink_to(host.classmate)
    (folder / "x-fifo").mkdir()
    (folder / "x-fifo" / LESSON.module_file).write_text(correct, encoding="utf-8")
    os.mkfifo(folder / "x-fifo" / "pipe")
    (folder / "x-sparse").mkdir()
    (folder / "x-sparse" / LESSON.module_file).write_text(correct, encoding="utf-8")
    with open(folder / "x-sparse" / "big.bin", "wb") as handle:
        handle.truncate(1536 << 20)   # 1.5 GB that takes no disk
    os.mkdir(os.fsencode(folder) + b"/x-not-utf8-\xff")
    (Path(os.fsdecode(os.fsencode(folder) + b"/x-not-utf8-\xff")) / LESSON.module_file).write_text(correct)
    notebook = folder / "x-notebook-only" / LESSON.name / f"{LESSON.name}.ipynb"
    notebook.parent.mkdir(parents=True)
    notebook.write_text("{}")   # an .ipynb in a file-route class: no longer flips the whole class
    both = folder / "y-notebook-and-module"
    shutil.copytree(folder / "b-wrong", both)
    shutil.copytree(notebook.parent, both / LESSON.name)
    before_course = course_files()
    before = machine_state(host)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), INSTRUCTOR_TOKEN=host.token, TMPDIR=str(tmp),
               SSH_AUTH_SOCK=str(root / "ssh-agent.sock"))
    # SIGINT as a terminal's Ctrl-C finds it: a test run started in the background (`&` without job control)
    # hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt
    # one slot: it is interrupted after its first graded submission (a second slot's warm-up would be wasted)
    first = subprocess.Popen([sys.executable, "-m", "course", *grade_command(folder, out, jobs=1)], cwd=REPO_ROOT,
                             env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in first.stdout:   # interrupted as a Ctrl-C would, once a first submission is graded (not refused)
        lines.append(line)
        if line.startswith("[") and not line.split("] ", 1)[1].startswith(REFUSED):
            first.send_signal(signal.SIGINT)
            break
    rest, err = first.communicate(timeout=120)
    interrupted = subprocess.CompletedProcess(first.args, first.returncode, "".join(lines) + rest, err)
    finished = cli(*grade_command(folder, out), env=env)
    dask_out = root / "results-dask"
    done_on_dask = cli(*grade_command(root / "on-dask", dask_out, "--dask-scheduler", "local",
                                      timeout=HANG_TIMEOUT_S), env=dict(env, TMPDIR=str(root)))   # Dask's own
    after = machine_state(host)
    return GradedClass(folder, out, dask_out, done_on_dask, interrupted, finished, host, before, after,
                       before_course, tmp, _received(sockets))


def result(graded: GradedClass, student: str, out: Path | None = None) -> dict:
    out = out or (graded.out if (graded.out / "submissions" / f"{student}.json").exists() else graded.dask_out)
    return json.loads((out / "submissions" / f"{student}.json").read_text(encoding="utf-8"))


def full_marks() -> dict:
    return {grade_id: float(points) for grade_id, points, _ in scored_cells(LESSON)}


def test_an_interrupted_run_goes_on_where_it_stopped(graded_class):
    first, second = graded_class.interrupted, graded_class.finished
    runs = (f"\nfirst run (exit {first.returncode}):\n{first.stdout[-2000:]}{first.stderr[-2000:]}"
            f"\nsecond run (exit {second.returncode}):\n{second.stdout[-2000:]}{second.stderr[-2000:]}")
    assert first.returncode == 130 and "run the same command again" in first.stdout, (
        f"ACTUAL exit {first.returncode}, EXPECTED 130 with the resume message{runs}")
    assert second.returncode == 0, f"ACTUAL exit {second.returncode}, EXPECTED 0{runs}"
    total = len(os.listdir(graded_class.folder))
    header = next((line for line in second.stdout.splitlines() if " already graded" in line), "")
    assert header, f"the second run printed no header line{runs}"
    reused = int(header.split(" already graded")[0].rsplit(" ", 1)[1])
    assert reused >= 1, (
        f"the second run regraded everything: ACTUAL {header!r}, EXPECTED at least 1 already graded{runs}")
    graded = [line for line in second.stdout.splitlines() if line.startswith("[")]
    assert len(graded) == total - reused, (
        f"ACTUAL {len(graded)} graded by the second run, EXPECTED {total - reused} (likely cause: a finished "
        f"submission graded again){runs}")
    assert all("/min, ETA " in line for line in graded), f"progress lines without rate and ETA: {graded}"
    left = [str(p) for p in graded_class.tmp.rglob("*")]
    assert not left, f"the runs left their spool behind (TMPDIR): {left}"


def test_the_honest_submissions_keep_their_points_beside_every_attack(graded_class):
    """Correct: every point, though a classmate spun 16 processes beside it; wrong: all but the student-test
    cell; crashing: 0 and reported; writing to stderr costs nothing and is reported."""
    cells = full_marks()
    expected = {"a-correct": cells, "b-wrong": {**cells, STUDENT_TEST_CELL: 0.0}, "d-stderr": cells,
                "y-notebook-and-module": {**cells, STUDENT_TEST_CELL: 0.0}, "c-hanging": {g: 0.0 for g in cells},
                "e-crash": {g: 0.0 for g in cells}}
    for student, want in expected.items():
        got = result(graded_class, student)
        assert got["cells"] == want, (f"{student}: points per grade cell\n  ACTUAL:   {got['cells']}\n  EXPECTED: "
                                      f"{want}\n  problem: {got['problem']!r} retried: {got['retried']!r}")
    for student in ("a-correct", "b-wrong"):   # copies of one another, as are most submissions here
        kinds = {f["kind"] for f in result(graded_class, student)["flags"]}
        assert kinds <= {"identical-to-student"}, f"{student} is honest, yet flagged: {kinds}"
    assert "timed out" in result(graded_class, "c-hanging")["problem"], result(graded_class, "c-hanging")
    assert "crashed (signal SIGSEGV)" in result(graded_class, "e-crash")["problem"], result(graded_class, "e-crash")
    noisy = result(graded_class, "d-stderr")
    assert noisy["wrote_stderr"] and "debugging output" in noisy["stderr"] and not noisy["problem"], noisy
    with open(graded_class.out / "grades.csv", newline="", encoding="utf-8") as handle:
        totals = {row["student"]: float(row["points"]) for row in csv.DictReader(handle)}
    assert totals["a-correct"] == LESSON.points and totals["b-wrong"] == LESSON.points - 3, totals


def test_a_broken_submission_costs_its_own_points_only(graded_class):
    """A symlink, a FIFO, a 1.5 GB file, a folder name that is not UTF-8, a notebook in a file-route class, an
    answer of 200,000 nested brackets or of the wrong shape, lone surrogates: each scores 0 with its reason, and
    the run grades every other submission."""
    reasons = {"x-symlink": "symlink", "x-fifo": "special file", "x-sparse": "refused unread",
               "x-not-utf8-\\xff": "not UTF-8", "x-notebook-only": "not an nbgrader course",
               "x-answer-nested": "malformed", "x-answer-list": "malformed"}
    for student, reason in reasons.items():
        row = result(graded_class, student)
        assert row["points"] == 0 and reason in row["problem"], (
            f"{student}: ACTUAL {row['points']} points, problem {row['problem']!r}; EXPECTED 0 and {reason!r}")
    surrogate = result(graded_class, "x-surrogate")
    assert surrogate["cells"] == {**full_marks(), STUDENT_TEST_CELL: 0.0}, surrogate
    assert "\ufffd" in surrogate["stderr"] or "\\udcff" in surrogate["stderr"], surrogate["stderr"]
    report = (graded_class.out / "report.md").read_text(encoding="utf-8")
    assert "x-fifo" in report and "x-not-utf8-\\xff" in report, report
    with open(graded_class.out / "grades.csv", newline="", encoding="utf-8") as handle:
        students = {row["student"] for row in csv.DictReader(handle)}
    assert students == {grade_class.shown_name(name) for name in os.listdir(graded_class.folder)}, students


def test_no_attack_reaches_another_submission_the_instructor_or_the_machine(graded_class):
    """Reading another submission, writing or chmod-ing the gradebook, the solutions or a classmate's file, their
    timestamps and extended attributes, the course folder; the environment; TCP, MPTCP, UDP and Unix sockets;
    stat of the instructor's paths; other processes' /proc; System V IPC; leftover processes; memory past the
    limit through memfd and children; a fork bomb; a full disk: each denied or contained, each attacker 0."""
    attackers = [s for s in graded_class.host.attacks() if s.startswith("x-") and s != "x-memfd"]   # see below
    for student in attackers:
        row = result(graded_class, student)
        assert row["points"] == 0, f"{student}: ACTUAL {row['points']} points, EXPECTED 0"
        went_through = [line for line in row["stderr"].splitlines() if "succeeded" in line
                        and not line.startswith("ATTACK daemon")]   # started, then killed with its grader
        assert not went_through, f"{student}: an attack went through:\n{row['stderr']}"
    assert graded_class.after == graded_class.before, (
        f"the machine changed\n  BEFORE: {graded_class.before}\n  AFTER:  {graded_class.after}")
    assert not graded_class.received, f"a listener on this machine was reached: {graded_class.received}"
    added = course_files() - graded_class.course_files
    for path in added:
        path.unlink()
    assert not added, f"files written into the course folder: {sorted(map(str, added))}"
    environment = result(graded_class, "x-environment")["stderr"]
    for secret in (graded_class.host.token, "SSH_AUTH_SOCK", "INSTRUCTOR_TOKEN", str(graded_class.out)):
        assert secret not in environment, f"the grader's environment holds {secret!r}:\n{environment}"
    memfd = result(graded_class, "x-memfd")
    assert "memory" in memfd["limits_hit"] and memfd["max_rss_mb"] <= MEMORY_MB * 1.02, (
        f"memfd and children: ACTUAL limits hit {memfd['limits_hit']}, peak {memfd['max_rss_mb']} MiB; EXPECTED "
        f"the memory limit hit at {MEMORY_MB} MiB")
    bomb = result(graded_class, "x-fork-bomb")
    assert "processes" in bomb["limits_hit"] and "stopped after" in bomb["stderr"], bomb
    assert "ATTACK disk: OSError" in result(graded_class, "x-disk")["stderr"], result(graded_class, "x-disk")
    assert "ATTACK memory: MemoryError" in result(graded_class, "x-memory")["stderr"]
    assert "ATTACK ipc: made" in result(graded_class, "x-ipc")["stderr"], "the IPC attack did not run"
    for student in attackers:   # x-ipc and x-disk leave files in /dev/shm and /tmp: the next in their slot sees none
        stderr = result(graded_class, student)["stderr"]
        assert "LEFTOVERS [] []" in stderr, f"{student} found an earlier submission's files:\n{stderr[:500]}"


def test_every_forgery_is_flagged(graded_class):
    """Replacing the grader's verdict, writing the answer into the answer pipe, forcing torch.equal, importing
    the reference: each one's points are its own business, but the report flags it for the instructor."""
    for student in forgeries():
        row = result(graded_class, student)
        assert row["flags"], f"{student}: {row['points']} points and no flag"


def test_the_report_sums_up_the_class(graded_class):
    report = (graded_class.out / "report.md").read_text(encoding="utf-8")
    for section in ("## Passed, per exercise", "## Checks most failed", "## Not graded in full",
                    "## Slowest submissions", "![points_histogram.png](figures/points_histogram.png)"):
        assert section in report, f"report.md lacks {section!r}"
    [student_test] = [names[0] for grade_id, _, names in scored_cells(LESSON) if grade_id == STUDENT_TEST_CELL]
    assert f"| {student_test} | " in report, f"the wrong submission's failed check is not listed:\n{report}"
    assert "e-crash: crashed" in report and "d-stderr" in report.split("Wrote to stderr")[1], report
    on_dask = (graded_class.dask_out / "report.md").read_text(encoding="utf-8")
    assert "c-hanging: timed out" in on_dask, on_dask
    for figure in ("points_histogram.png", "exercise_pass_rate.png"):
        data = (graded_class.out / "figures" / figure).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000, f"{figure}: {len(data)} bytes, not a real PNG"


def test_a_rerun_grades_nothing_and_a_changed_submission_gets_a_new_key(graded_class, tmp_path):
    again = cli(*grade_command(graded_class.folder, graded_class.out))
    assert again.returncode == 0 and ", 0 to grade" in again.stdout.splitlines()[0], (
        f"ACTUAL {again.stdout.splitlines()[:1]}, EXPECTED nothing to grade\n{again.stderr}")
    copy = shutil.copytree(graded_class.folder / "a-correct", tmp_path / "a-correct")
    [before] = grade_class.find_submissions(LESSON, tmp_path)
    with open(copy / LESSON.module_file, "a", encoding="utf-8") as handle:
        handle.write("# an edit\n")
    [after] = grade_class.find_submissions(LESSON, tmp_path)
    assert before.route == after.route == FILES and before.digest != after.digest, (
        "an edited submission kept its digest: it would not be regraded")


def test_the_grader_digest_changes_with_the_lessons_grader_only(tmp_path, monkeypatch):
    """A fix in lesson 14's checks regrades lesson 14; one in lesson 15's does not."""
    shutil.copytree(REPO_ROOT / "course", tmp_path / "course", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(grade_class, "REPO_ROOT", tmp_path)
    digest = grade_class.grader_digest(LESSON)
    with open(tmp_path / "course" / "checks" / "lesson15" / "__init__.py", "a", encoding="utf-8") as handle:
        handle.write("# a fix elsewhere\n")
    assert grade_class.grader_digest(LESSON) == digest, "a change to lesson 15's grader changed lesson 14's key"
    with open(tmp_path / "course" / "checks" / "lesson14" / "__init__.py", "a", encoding="utf-8") as handle:
        handle.write("# a fix\n")
    assert grade_class.grader_digest(LESSON) != digest, "a change to lesson 14's grader kept lesson 14's key"


def test_a_dask_local_cluster_gives_the_same_points(graded_class):
    """f-partial (some points, not all) graded on a LocalCluster (one Dask task per shard, slots on its worker)
    gets the points it got on this machine; the hanging ones time out there too."""
    done = graded_class.on_dask
    assert done.returncode == 0 and not done.stderr, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    got = result(graded_class, "f-partial", graded_class.dask_out)["cells"]
    want = result(graded_class, "f-partial", graded_class.out)["cells"]
    assert got == want and 0 < sum(got.values()) < LESSON.points, (
        f"f-partial on Dask\n  ACTUAL:   {got}\n  EXPECTED: {want} (graded on this machine; some points, not all)")
    for student in ("c-hanging", "x-fork-and-hang"):
        assert "timed out" in result(graded_class, student)["problem"], result(graded_class, student)
    sleeper = result(graded_class, "x-fork-and-hang")
    assert sleeper["retried"].startswith("timed out"), (
        f"a hang that used no CPU may come from load: EXPECTED it graded twice, ACTUAL retried={sleeper['retried']!r}")


@pytest.mark.parametrize("arguments, named", [
    (["MISSING"], "SUBMISSIONS_DIR"),
    (["EMPTY"], "SUBMISSIONS_DIR"),
    (["CLASS", "--out", "CLASS/results"], "--out"),
])
def test_bad_input_is_refused_in_one_line_before_anything_is_written(arguments, named, tmp_path, capsys):
    (tmp_path / "EMPTY").mkdir()
    (tmp_path / "CLASS" / "alice").mkdir(parents=True)
    (tmp_path / "CLASS" / "alice" / LESSON.module_file).write_text("x = 1\n", encoding="utf-8")
    before = sorted(tmp_path.rglob("*"))
    code = main(["grade-class", "14", *[str(tmp_path / a) if a.isupper() or "/" in a else a for a in arguments]])
    err = capsys.readouterr().err.strip()
    assert code == 2, f"ACTUAL exit {code}, EXPECTED 2 ({err})"
    assert len(err.splitlines()) == 1 and named in err, f"ACTUAL {err!r}, EXPECTED one line naming {named}"
    assert sorted(tmp_path.rglob("*")) == before, "a refused run wrote files"


def test_without_confinement_the_command_refuses_unless_told_unconfined(tmp_path, monkeypatch, capsys):
    """Where the sandbox or the cgroups are missing: one line with the reason and the way out, exit 2."""
    import course.cli
    monkeypatch.setattr(course.cli, "unavailable", lambda: "not enforced here: the sandbox (no bwrap)")
    code = main(["grade-class", "14", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, f"ACTUAL exit {code}, {err!r}; EXPECTED 2 and one line"
    assert "no bwrap" in err and "--unconfined" in err, f"ACTUAL {err!r}, EXPECTED the reason and --unconfined"


def test_the_sandbox_is_bubblewrap_with_cgroups_here():
    """On this machine (root, cgroup v1 controllers): nothing is missing; a machine without them is refused."""
    enforcement = probe()
    assert enforcement.bwrap and enforcement.cgroups and not enforcement.missing, enforcement


def test_a_wipe_empties_a_tree_deeper_than_path_max_and_follows_no_link(tmp_path):
    """What a grader leaves in its scratch folder goes before the next submission is written there (found by an
    attack pass: a folder named like the next submission's file, nested past PATH_MAX, made every later submission
    of its slot fail): a tree past PATH_MAX, one deeper than the descriptors a wipe holds, unreadable folders,
    a FIFO; a link is removed, never followed."""
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    scratch.mkdir()
    outside.mkdir()
    (outside / "kept").write_text("the instructor's")
    (scratch / "link").symlink_to(outside)
    os.mkfifo(scratch / "pipe")
    for top, name, depth in ((LESSON.module_file, "d" * 200, 30), ("deep", "e", 3 * confinement._WIPE_DEPTH + 5)):
        fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
        opened = [fd]
        for level, part in enumerate([top] + [name] * depth):
            os.mkdir(part, dir_fd=opened[-1])
            if level % 7 == 3:
                os.symlink(outside, "to-outside", dir_fd=opened[-1])
            opened.append(os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=opened[-1]))
        for level, fd in enumerate(opened):
            if level % 5 == 4:
                os.fchmod(fd, 0)   # a folder its grader made unreadable
            os.close(fd)
    assert len(str(scratch)) + 30 * 201 > os.pathconf("/", "PC_PATH_MAX")
    assert confinement.wipe(scratch), f"ACTUAL left in the scratch folder: {os.listdir(scratch)}"
    assert os.listdir(scratch) == [] and (outside / "kept").read_text() == "the instructor's", os.listdir(outside)


def test_a_failure_of_the_sandbox_is_never_kept_as_a_final_result(tmp_path, monkeypatch):
    """A sandbox that died or could not grade is the machinery's failure: the report says so and the next run
    grades the submission again (the first run's 0 is not kept as "already graded")."""
    student = tmp_path / "submitted" / "a-student"
    student.mkdir(parents=True)
    (student / LESSON.module_file).write_text(CORRECT.read_text(encoding="utf-8"), encoding="utf-8")
    graded = []

    def sandbox_fails(lesson_id, jobs, settings, routes):
        for job in jobs:
            graded.append(job.id)
            yield job.id, Outcome(None, f"{confinement.SANDBOX_FAILED} died or stopped answering (a test)", 0.1, 0.0,
                                  "")

    monkeypatch.setattr(grade_class, "grade_shard", sandbox_fails)
    run = grade_class.ClassRun("14", student.parent, tmp_path / "out",
                               Settings(confinement.Limits(seconds=10, memory_mb=1000), cell_timeout=0))
    for _ in range(2):
        [row] = grade_class.run_class(run, say=lambda line: None)["results"]
    assert graded == ["a-student", "a-student"], f"ACTUAL graded {graded}, EXPECTED the submission in both runs"
    assert row["points"] == 0 and "not final" in row["problem"] and not row.get("key"), row


# --- the notebook route ------------------------------------------------------------------------------------------

HIDDEN_LINE_MARK = "BEGIN HIDDEN TESTS"
LEAK = textwrap.dedent('''
    import functools, gc, glob, linecache, os, sys
    _printed = set()
    def _leak(where):
        """Print every text this process holds that may be a hidden test: the files beside the notebook, the
        objects gc knows, linecache's cells, the callers' frames."""
        found = [open(p, errors='replace').read() for p in glob.glob('*') + glob.glob('.*') if os.path.isfile(p)]
        found += [v for o in gc.get_objects() if isinstance(o, (dict, list, tuple))
                  for v in (o.values() if isinstance(o, dict) else o) if isinstance(v, str)]
        found += ["".join(entry[2]) for entry in linecache.cache.values() if len(entry) == 4]
        frame = sys._getframe()
        while frame is not None:
            found.append("".join(linecache.getlines(frame.f_code.co_filename)))
            found += [v for v in frame.f_locals.values() if isinstance(v, str)]
            frame = frame.f_back
        new = [t[:3000] for t in dict.fromkeys(found) if 'run_checks(' in t and t[:3000] not in _printed]
        _printed.update(new)
        print(f"LEAK {where}:", "\\n".join(new))
''')


WRAPPED = textwrap.dedent('''
    _train_one_epoch = train_one_epoch
    @functools.wraps(_train_one_epoch)
    def train_one_epoch(*args, **kwargs):   # called by the grade cells' checks: leak from inside them
        _leak('grade cell')
        return _train_one_epoch(*args, **kwargs)
''')


@dataclass(frozen=True)
class NotebookClass:
    course: Path
    out: Path
    done: subprocess.CompletedProcess
    hidden_lines: list        # the hidden tests' lines, as the source notebook has them


def _notebook_with(notebook, grade_id: str, append: str = "", replace=None):
    import nbformat
    nb = nbformat.from_dict(json.loads(json.dumps(notebook)))
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = (replace if replace is not None else cell.source) + append
    return nb


@pytest.fixture(scope="module")
def notebook_class(tmp_path_factory) -> NotebookClass:
    import nbformat
    from course.checks.assignments import build_source, release_path, source_path
    from course.classroom.simulate import answered, write_class
    root = tmp_path_factory.mktemp("notebooks")
    course = root / "course"
    write_class(LESSON, course, "notebook", 1, {"correct": 1.0})   # the course, and s000-correct
    submitted = course / "submitted"
    correct = nbformat.read(submitted / "s000-correct" / LESSON.name / f"{LESSON.name}.ipynb", as_version=4)
    mistake = next(m for m in LESSON.mistakes if m.name == LESSON.notebook_mistake)
    release = nbformat.read(release_path(LESSON, course), as_version=4)
    solved = nbformat.read(build_source(LESSON, root / "wrong", reference_source=mistake.source()), as_version=4)
    hidden_cell = next(c for c in correct.cells if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith(
        "hidden_"))
    notebooks = {
        "s001-wrong": answered(release, solved),
        "n-leak": _notebook_with(_notebook_with(correct, "train_one_epoch", LEAK + WRAPPED),
                                 "accumulation_divisor", "\n_leak('later cell')\n"),
        "n-gc-blank": _notebook_with(correct, "cosine_lr", textwrap.dedent('''
            import gc
            for o in gc.get_objects():
                if isinstance(o, dict) and o.get("cell_type") == "code" and o.get("metadata", {}).get(
                        "nbgrader", {}).get("grade"):
                    o["source"] = ""
            ''')),
        "n-hook": _notebook_with(correct, "cosine_lr", "\nget_ipython().events.register('post_run_cell', "
                                                       "lambda result: get_ipython().outputs.clear())\n"),
    }
    duplicated = _notebook_with(correct, "cosine_lr")
    duplicated.cells.append(nbformat.from_dict({**json.loads(json.dumps(hidden_cell)), "id": "a-second-one"}))
    notebooks["n-duplicate-id"] = duplicated
    not_graded = _notebook_with(correct, "cosine_lr")
    for cell in not_graded.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == hidden_cell.metadata.nbgrader.grade_id:
            cell.metadata.nbgrader.grade = False
    notebooks["n-hidden-not-graded"] = not_graded
    lots = _notebook_with(correct, "cosine_lr")
    for cell in lots.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.metadata.nbgrader.points = "lots"
    notebooks["n-points-lots"] = lots
    for student, nb in notebooks.items():
        path = submitted / student / LESSON.name / f"{LESSON.name}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    (submitted / "n-not-json" / LESSON.name).mkdir(parents=True)
    (submitted / "n-not-json" / LESSON.name / f"{LESSON.name}.ipynb").write_text("not a notebook {")
    (submitted / "n-symlink" / LESSON.name).mkdir(parents=True)
    (submitted / "n-symlink" / LESSON.name / f"{LESSON.name}.ipynb").symlink_to(source_path(LESSON, course))
    source = nbformat.read(source_path(LESSON, course), as_version=4)
    hidden = [line.strip() for c in source.cells if HIDDEN_LINE_MARK in c.source for line in c.source.splitlines()
              if len(line.strip()) >= 8 and not line.startswith("#")]
    out = root / "results"
    done = cli("grade-class", "14", str(submitted), "--out", str(out), "--jobs", "2", "--timeout", str(TIMEOUT_S * 2),
               "--cell-timeout", str(TIMEOUT_S), "--memory-mb", str(MEMORY_MB))
    return NotebookClass(course, out, done, hidden)


def notebook_result(graded: NotebookClass, student: str) -> dict:
    return json.loads((graded.out / "submissions" / f"{student}.json").read_text(encoding="utf-8"))


def test_notebooks_a_broken_one_costs_its_own_points_and_the_honest_keep_theirs(notebook_class):
    """Not JSON, a duplicated grade_id, "points": "lots", a symlink to the course's source notebook: each 0 with
    its reason; the correct notebook gets every point and the notebook mistake loses only its hidden cell, as
    recorded in nbgrader's gradebook."""
    done = notebook_class.done
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    cells = full_marks()
    hidden = next(g for g in cells if g.startswith("hidden_"))
    for student, want in (("s000-correct", cells), ("s001-wrong", {**cells, hidden: 0.0})):
        row = notebook_result(notebook_class, student)
        assert row["cells"] == want, (f"{student}\n  ACTUAL:   {row['cells']}\n  EXPECTED: {want}\n"
                                      f"  problem: {row['problem']!r}")
    for student, reason in (("n-not-json", "cannot be graded"), ("n-duplicate-id", "cannot be graded"),
                            ("n-points-lots", "cannot be graded"), ("n-symlink", "symlink")):
        row = notebook_result(notebook_class, student)
        assert row["points"] == 0 and reason in row["problem"], (
            f"{student}: ACTUAL {row['points']} points, problem {row['problem']!r}; EXPECTED 0 and {reason!r}")
    row = notebook_result(notebook_class, "n-hidden-not-graded")
    assert row["points"] == 0 or row["cells"] == cells, row   # refused, or graded from the gradebook's own cells
    assert "the solutions" not in json.dumps(notebook_result(notebook_class, "n-symlink"))


def test_notebooks_hidden_tests_never_reach_the_scratch_folder_nor_the_feedback(notebook_class):
    """A student cell that prints every text it can find that may hold a hidden test (the files beside the
    notebook, gc's objects, linecache, the callers' frames) while its function runs inside a grade cell and in a
    later cell: no output of the autograded notebook, no result carries a hidden test's line (what the student's
    code prints inside the hidden grade cell is left out, with a note); the spool holds none after the run."""
    row = notebook_result(notebook_class, "n-leak")
    autograded = notebook_class.course / "autograded" / "n-leak" / LESSON.name / f"{LESSON.name}.ipynb"
    outputs = json.dumps([c.get("outputs", []) for c in json.loads(autograded.read_text())["cells"]])
    assert "LEAK later cell" in outputs and "LEAK grade cell" in outputs, "the leaking cells did not run"
    for line in notebook_class.hidden_lines:
        assert line not in outputs and line not in json.dumps(row), f"a hidden test's line reached feedback: {line!r}"
    assert MUTED_NOTE.strip() in outputs, "the hidden grade cell showed no note of the output left out"
    assert not (notebook_class.out / "spool").exists(), "a spool of sanitized notebooks was left in the results"


def test_notebooks_forged_grade_cells_are_flagged(notebook_class):
    """Blanking the grade cells through gc, clearing the outputs in a post_run_cell hook: flagged."""
    for student in ("n-gc-blank", "n-hook"):
        row = notebook_result(notebook_class, student)
        assert row["flags"], f"{student}: {row['points']} points and no flag"
