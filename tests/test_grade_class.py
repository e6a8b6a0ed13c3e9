"""``python -m course grade-class``: a class graded in parallel, each submission confined, resumable, with a CSV,
a JSON per submission and a report; attacks on the grader stopped; Dask's LocalCluster gives the same points.

One small file-route class of lesson 14 is graded once for the module (``graded_class``): a correct, a wrong
(the lesson's notebook mistake: only its hidden cell lost), a stderr-printing and a crashing submission and one
submission per attack. Its first run is interrupted (SIGINT) after the first result and a second run finishes
it. The two that hang are graded apart, on Dask's LocalCluster with a short time limit (a hang costs its whole
limit), beside a quick partial submission that is graded locally too: the same points both ways. The notebook route's equality with ``nbgrader autograde`` is tested on autograde's own round
(tests/test_notebooks.py, ``test_grade_class_scores_every_cell_like_autograde``).
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from course.checks import get_lesson
from course.checks.assignments import scored_cells
from course.classroom import grade_class
from course.classroom.confinement import unavailable
from course.classroom.pool import FILES
from course.classroom.simulate import ENDLESS_LOOP
from course.cli import main
from course.implementations import REFERENCE_DIR, REPO_ROOT

LESSON = get_lesson("14")
TIMEOUT_S = 30        # a correct submission takes ~10 s on a busy 2-core machine
HANG_TIMEOUT_S = 5    # the submissions that hang (their cost) and a quick partial one, graded on Dask
PARTIAL = """
def train_one_epoch(*args, **kwargs):
    raise NotImplementedError("train_one_epoch: TODO")


def test_accumulation_matches_big_batch(accumulate_gradients):
    raise NotImplementedError("test_accumulation_matches_big_batch: TODO")
"""   # appended to the reference: the four quick exercises written, the two that train left as stubs
MEMORY_MB = 2500      # the pool's address space (~1 GiB after torch and the lesson) and room to grade
DAEMON = "gc-daemon-t1"   # /proc/PID/comm of the processes the attackers leave behind (15 characters at most)
pytestmark = pytest.mark.skipif(bool(unavailable()), reason=f"no confinement here: {unavailable()}")

ATTEMPT = textwrap.dedent('''
    import os, sys, time, ctypes, signal

    def attempt(what, action):
        try:
            action()
            print(f"ATTACK {what}: succeeded", file=sys.stderr)
        except BaseException as exc:
            print(f"ATTACK {what}: {type(exc).__name__}", file=sys.stderr)

    def daemon():
        """A setsid double fork: the grandchild sleeps forever, named DAEMON."""
        child = os.fork()
        if child == 0:
            os.setsid()
            if os.fork() == 0:
                ctypes.CDLL(None).prctl(15, b"DAEMON", 0, 0, 0)
                while True:
                    time.sleep(1)
            os._exit(0)
        os.waitpid(child, 0)
''').replace("DAEMON", DAEMON)


def attacks(paths: dict) -> dict[str, str]:
    """student -> the module it hands in: the attack alone (no exercise: it scores 0 even where it succeeds)."""
    return {
        "x-read-other": f"attempt('read', lambda: open({str(paths['other'])!r}).read())",
        "x-write-gradebook": f"attempt('write', lambda: open({str(paths['gradebook'])!r}, 'a').write('forged'))",
        "x-write-course": f"attempt('write', lambda: open({str(paths['course_file'])!r}, 'w').write('x'))",
        "x-daemon": "attempt('daemon', daemon)",
        "x-fork-and-hang": "attempt('daemon', daemon)\nwhile True:\n    time.sleep(1)",
        "x-memory": "attempt('memory', lambda: [bytearray(1 << 26) for _ in iter(int, 1)])",
        "x-signal": f"attempt('signal', lambda: os.kill({os.getpid()}, signal.SIGTERM))\n"
                    "attempt('signal', lambda: os.kill(-1, signal.SIGKILL))",
    }


@dataclass(frozen=True)
class GradedClass:
    folder: Path
    out: Path
    dask_out: Path             # the submissions that hang and f-partial, graded on Dask with HANG_TIMEOUT_S
    on_dask: subprocess.CompletedProcess
    interrupted: subprocess.CompletedProcess
    finished: subprocess.CompletedProcess
    sentinels: dict            # path -> bytes before grading
    course_files: set


def cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "course", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=600, **kwargs)


def grade_command(folder: Path, out: Path, *extra: str, timeout: float = TIMEOUT_S) -> list[str]:
    return ["grade-class", "14", str(folder), "--out", str(out), "--jobs", "2", "--timeout", str(timeout),
            "--memory-mb", str(MEMORY_MB), *extra]


def course_files() -> set:
    return {p for p in (REPO_ROOT / "course").rglob("*") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory) -> GradedClass:
    root = tmp_path_factory.mktemp("class")
    folder, out = root / "submitted", root / "results"
    reference = (REFERENCE_DIR / LESSON.module_file).read_text(encoding="utf-8")
    mistake = next(m for m in LESSON.mistakes if m.name == LESSON.notebook_mistake)
    gradebook = root / "gradebook.db"   # stands for any file outside the scratch directory
    gradebook.write_bytes(b"the instructor's grades")
    paths = {"other": folder / "a-correct" / LESSON.module_file, "gradebook": gradebook,
             "course_file": REPO_ROOT / "course" / "PWNED_BY_A_SUBMISSION.py"}
    modules = {"a-correct": reference, "b-wrong": mistake.source(), "f-partial": reference + PARTIAL,
               "d-stderr": reference + "\nimport sys\nprint('debugging output', file=sys.stderr)\n",
               "e-crash": reference + "\nimport ctypes\nctypes.string_at(0)   # a crash in native code\n"}
    modules |= {student: ATTEMPT + attack for student, attack in attacks(paths).items()}
    on_dask = {"c-hanging": reference + "\n" + ENDLESS_LOOP, "x-fork-and-hang": modules.pop("x-fork-and-hang"),
               "f-partial": modules["f-partial"]}
    for where, submissions in ((folder, modules), (root / "on-dask", on_dask)):
        for student, source in submissions.items():
            (where / student).mkdir(parents=True)
            (where / student / LESSON.module_file).write_text(source, encoding="utf-8")
    sentinels = {p: p.read_bytes() for p in (gradebook, paths["other"])}
    before = course_files()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    # SIGINT as a terminal's Ctrl-C finds it: a test run started in the background (`&` without job control)
    # hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt
    first = subprocess.Popen([sys.executable, "-m", "course", *grade_command(folder, out)], cwd=REPO_ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in first.stdout:   # interrupted as a Ctrl-C would, once a first submission is graded
        lines.append(line)
        if line.startswith("[1/"):
            first.send_signal(signal.SIGINT)
            break
    rest, err = first.communicate(timeout=120)
    interrupted = subprocess.CompletedProcess(first.args, first.returncode, "".join(lines) + rest, err)
    finished = cli(*grade_command(folder, out))
    dask_out = root / "results-dask"
    done_on_dask = cli(*grade_command(root / "on-dask", dask_out, "--dask-scheduler", "local", timeout=HANG_TIMEOUT_S))
    return GradedClass(folder, out, dask_out, done_on_dask, interrupted, finished, sentinels, before)


def result(graded: GradedClass, student: str, out: Path | None = None) -> dict:
    out = out or (graded.out if (graded.folder / student).is_dir() else graded.dask_out)
    return json.loads((out / "submissions" / f"{student}.json").read_text(encoding="utf-8"))


def test_an_interrupted_run_goes_on_where_it_stopped(graded_class):
    first, second = graded_class.interrupted, graded_class.finished
    runs = (f"\nfirst run (exit {first.returncode}):\n{first.stdout[-2000:]}{first.stderr[-2000:]}"
            f"\nsecond run (exit {second.returncode}):\n{second.stdout[-2000:]}{second.stderr[-2000:]}")
    assert first.returncode == 130 and "run the same command again" in first.stdout, (
        f"ACTUAL exit {first.returncode}, EXPECTED 130 with the resume message{runs}")
    assert second.returncode == 0, f"ACTUAL exit {second.returncode}, EXPECTED 0{runs}"
    total = len(list(graded_class.folder.iterdir()))
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


def test_every_submission_gets_the_points_it_earns(graded_class):
    """Correct: every point; the notebook mistake: all but its hidden cell; hanging and crashing: 0 and reported;
    writing to stderr costs nothing and is reported."""
    cells = {grade_id: points for grade_id, points, _ in scored_cells(LESSON)}
    failing = next(g for g, _, names in scored_cells(LESSON)
                   if next(m for m in LESSON.mistakes if m.name == LESSON.notebook_mistake).caught_by in names)
    expected = {"a-correct": cells, "b-wrong": {**cells, failing: 0}, "c-hanging": {g: 0 for g in cells},
                "d-stderr": cells, "e-crash": {g: 0 for g in cells}}
    for student, want in expected.items():
        got = result(graded_class, student)["cells"]
        assert got == {g: float(p) for g, p in want.items()}, (
            f"{student}: points per grade cell\n  ACTUAL:   {got}\n  EXPECTED: {want}")
    assert "timed out" in result(graded_class, "c-hanging")["problem"], result(graded_class, "c-hanging")
    assert "crashed (signal SIGSEGV)" in result(graded_class, "e-crash")["problem"], result(graded_class, "e-crash")
    noisy = result(graded_class, "d-stderr")
    assert noisy["wrote_stderr"] and "debugging output" in noisy["stderr"] and not noisy["problem"], noisy
    with open(graded_class.out / "grades.csv", newline="", encoding="utf-8") as handle:
        totals = {row["student"]: float(row["points"]) for row in csv.DictReader(handle)}
    assert totals["a-correct"] == LESSON.points and totals["b-wrong"] == LESSON.points - cells[failing], totals


def test_attacks_are_stopped_scored_zero_and_change_nothing(graded_class):
    """Reading another submission, writing a gradebook or the course folder, leaving a (setsid, double-forked)
    process behind, allocating without bound, signalling outside: each denied, each attacker 0 points."""
    denied = {"x-read-other": "ATTACK read: PermissionError", "x-write-gradebook": "ATTACK write: PermissionError",
              "x-write-course": "ATTACK write: PermissionError", "x-memory": "ATTACK memory: MemoryError",
              "x-signal": "ATTACK signal: ProcessLookupError"}
    for student in [s for s in os.listdir(graded_class.folder) if s.startswith("x-")] + ["x-fork-and-hang"]:
        row = result(graded_class, student)
        assert row["points"] == 0, f"{student}: ACTUAL {row['points']} points, EXPECTED 0"
        assert "succeeded" not in row["stderr"] or student.endswith(("daemon", "hang")), (
            f"{student}: an attack went through:\n{row['stderr']}")
        if student in denied:
            assert denied[student] in row["stderr"], f"{student}: EXPECTED {denied[student]!r} in\n{row['stderr']}"
    assert "timed out" in result(graded_class, "x-fork-and-hang")["problem"]
    assert result(graded_class, "x-memory")["max_rss_mb"] < MEMORY_MB, result(graded_class, "x-memory")
    for path, data in graded_class.sentinels.items():
        assert path.read_bytes() == data, f"{path} changed: ACTUAL {path.read_bytes()[:80]!r}, EXPECTED {data[:80]!r}"
    added = course_files() - graded_class.course_files
    for path in added:
        path.unlink()
    assert not added, f"files written into the course folder: {sorted(map(str, added))}"
    left = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _comm(p) == DAEMON]
    assert not left, f"processes the attackers started outlived their grading: pids {left}"


def _comm(proc: Path) -> str:
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return ""


def test_the_report_sums_up_the_class(graded_class):
    report = (graded_class.out / "report.md").read_text(encoding="utf-8")
    for section in ("## Passed, per exercise", "## Checks most failed", "## Not graded in full",
                    "## Slowest submissions", "![points_histogram.png](figures/points_histogram.png)"):
        assert section in report, f"report.md lacks {section!r}"
    mistake = next(m for m in LESSON.mistakes if m.name == LESSON.notebook_mistake)
    assert f"| {mistake.caught_by} | " in report, f"the wrong submission's failed check is not listed:\n{report}"
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
    [before] = grade_class.find_submissions(LESSON, tmp_path, FILES)
    with open(copy / LESSON.module_file, "a", encoding="utf-8") as handle:
        handle.write("# an edit\n")
    [after] = grade_class.find_submissions(LESSON, tmp_path, FILES)
    assert before.digest != after.digest, "an edited submission kept its digest: it would not be regraded"


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
    """f-partial (some points, not all) graded on a LocalCluster (one Dask task per shard, a pool on its worker)
    gets the points it got on this machine; the hanging ones time out there too."""
    done = graded_class.on_dask
    assert done.returncode == 0 and not done.stderr, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    got = result(graded_class, "f-partial", graded_class.dask_out)["cells"]
    want = result(graded_class, "f-partial", graded_class.out)["cells"]
    assert got == want and 0 < sum(got.values()) < LESSON.points, (
        f"f-partial on Dask\n  ACTUAL:   {got}\n  EXPECTED: {want} (graded on this machine; some points, not all)")
    for student in ("c-hanging", "x-fork-and-hang"):
        assert "timed out" in result(graded_class, student)["problem"], result(graded_class, student)


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
    """Where the kernel lacks Landlock or user namespaces: one line with the reason and the way out, exit 2."""
    import course.cli
    monkeypatch.setattr(course.cli, "unavailable", lambda: "this kernel has no Landlock")
    code = main(["grade-class", "14", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, f"ACTUAL exit {code}, {err!r}; EXPECTED 2 and one line"
    assert "no Landlock" in err and "--unconfined" in err, f"ACTUAL {err!r}, EXPECTED the reason and --unconfined"
