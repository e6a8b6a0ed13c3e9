"""Shared pytest wiring: choose the implementation under test and turn check results into outcomes.

    pytest                      # student (impl/) and reference
    pytest --impl reference     # only the reference
    pytest --impl-dir DIR       # a submission laid out like impl/
"""
from __future__ import annotations

import functools
import os
import re
import time

# Every test process, and what it starts, on the course's thread count (course/runs/threads.py), set before
# torch starts: the tiny models run fastest on one thread, and two xdist workers each on torch's default
# (all cores) would oversubscribe the machine, 3-4 times slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from course.checks import get_lesson  # noqa: E402
from course.checks.framework import FAIL, HARDENING, TODO  # noqa: E402
from course.checks.results import describe, grade_exercises  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--impl", choices=["student", "reference", "both"], default="both",
                     help="implementation(s) the exercise tests grade (default: both)")
    parser.addoption("--impl-dir", default=None, help="grade a directory laid out like impl/")


def pytest_generate_tests(metafunc):
    if "impl_name" in metafunc.fixturenames:
        config = metafunc.config
        if config.getoption("--impl-dir"):
            names = ["dir"]
        elif config.getoption("--impl") == "both":
            names = ["student", "reference"]
        else:
            names = [config.getoption("--impl")]
        metafunc.parametrize("impl_name", names)


@functools.lru_cache(maxsize=None)
def _load(lesson_id: str, impl_name: str, impl_dir):
    return get_lesson(lesson_id).load("student" if impl_name == "dir" else impl_name, impl_dir)


@pytest.fixture
def impl_module(request, impl_name):
    """A factory: ``impl_module(lesson)`` -> the module under test for that lesson."""
    impl_dir = request.config.getoption("--impl-dir")
    return lambda lesson: _load(lesson.lesson_id, impl_name, impl_dir)


@pytest.fixture
def graded(impl_module, impl_name):
    """``graded(lesson, check_name)``: run one check; TODO skips (untouched stub), FAIL fails. A student's
    failure of a hardening check (argument rules, conventions: not the lesson's objectives) is reported as a
    skip: a solution that meets the objectives never fails the suite."""
    def run(lesson, check_name: str):
        [result] = grade_exercises(lesson, impl_module(lesson), check_names=[check_name])
        problem = result.first_problem
        student = impl_name in ("student", "dir")
        if result.status == TODO:
            if not student:
                pytest.fail(f"the {impl_name} implementation must not raise NotImplementedError: "
                            f"{describe(problem)}", pytrace=False)
            pytest.skip(describe(problem))
        if result.status == FAIL:
            if student and result.tier == HARDENING:
                pytest.skip(f"hardening tier, not graded by default: {describe(problem)}")
            pytest.fail(describe(problem), pytrace=False)
    return run


# --- scheduling `python -m pytest -n auto` (pytest-xdist, --dist loadgroup) ---------------------------------
# Tests of one group run on one worker, in collection order. A group keeps together the tests that share an
# expensive fixture (their module's), a run (tests/doc_runs.py: the notebook tests build on the README's
# `python -m course release`, the stage-assembly tests and lesson 17's claim read the main job's output) or
# files: the documented commands of one text run in order, the main job's second stage and the chat join the main
# job, and a command that resumes from another's folder under out/ joins that command's group; the release
# rewrites the committed notebooks that the new-lesson test copies. The slowest groups start first, so that both
# workers finish together.
MAIN_JOB = "python impl/train_pretrain_impl.py --impl reference"     # the README's main job: ~35 s alone
# The main job's second stage reads its out/pretrain_128.pth, the chat the second stage's out/full_sft_128.pth
AFTER_MAIN_JOB = re.compile(r"impl/train_full_sft_impl\.py|--weights out/full_sft_")
RELEASE = "python -m course release"
SFT_CLAIM_TEST = "test_the_documented_path_answers_most_heldout_questions"   # tests/test_sft_stage.py
OUT_FOLDER = re.compile(r"--(?:save-dir|out_dir|out|resume)\s+(out/[^/\s]+)")


def _groups(items) -> dict[str, str]:
    """nodeid -> group of every item."""
    groups, writers = {}, {}   # writers: folder under out/ -> the group of the first command naming it
    for item in items:
        if item.path.name == "test_docs_commands.py" and item.originalname == "test_command_runs":
            command = item.callspec.params["command"]
            folders = OUT_FOLDER.findall(command)
            if command == MAIN_JOB or AFTER_MAIN_JOB.search(command):
                group = "main job"
            elif command == RELEASE:
                group = "notebooks"
            else:
                group = next((writers[f] for f in folders if f in writers),
                             f"documented commands of {item.callspec.params['source']}")
            for folder in folders:
                writers.setdefault(folder, group)
        elif item.path.name in ("test_notebooks.py", "test_lessons_complete.py"):
            group = "notebooks"
        elif item.path.name == "test_stage_assembly.py" or item.originalname == SFT_CLAIM_TEST:
            group = "main job"   # they read the main job's runs (tests/doc_runs.py shares them)
        elif item.path.name in ("test_hint_rules.py", "test_lesson16_rule_hints.py"):   # read the mistakes' results
            group = "test_mistakes.py"                                                   # (tests/mistake_results.py)
        else:
            group = item.path.name
        groups[item.nodeid] = group
    return groups


# Module groups measured at 15-40 s (`python labs/bench_suite.py -n auto`): started before the many small
# modules, so that none of them is what one worker still runs after the other has finished
SLOW_MODULES = ("test_grade_class.py", "test_mistakes.py", "test_stage_assembly_ddp.py", "test_lesson15_checkpoint.py",
                "test_lesson16_train_session.py", "test_cli.py")


def _rank(group: str) -> int:
    return (0 if group == "notebooks" else 1 if group == "main job" else 2 if group.startswith("documented")
            else 3 if group in SLOW_MODULES else 4)


# The modules whose tests compare numbers with a doc, with numbers recorded on another machine, or with a run
# in another process (the oracle cache, a resume, DDP ranks): the results that can differ from one CPU kernel
# family or thread count to another. `-m cpu_matrix` selects them; .ci/run runs them again under each of the
# CPU's other kernel families and with two threads.
CPU_MATRIX_MODULES = ("test_docs_commands.py", "test_stage_assembly.py", "test_lesson14_predictions.py",
                      "test_lesson15_predictions.py", "test_lesson16_predictions.py", "test_lesson17_predictions.py",
                      "test_oracle.py", "test_upstream_fixture.py", "test_lesson15_checkpoint.py",
                      "test_stage_assembly_ddp.py", "test_lesson16_train_session.py", "test_lesson_checks.py")


@pytest.hookimpl(wrapper=True)   # around xdist's own hook, which reads the xdist_group marks (tryfirst alone
def pytest_collection_modifyitems(config, items):   # ran after it under pytest 9.2)
    groups = _groups(items)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
        if item.path.name in CPU_MATRIX_MODULES:
            item.add_marker(pytest.mark.cpu_matrix)
    items.sort(key=lambda item: _rank(groups[item.nodeid]))
    return (yield)


# --- progress a person can read --------------------------------------------------------------------------------
# `-n auto` prints only dots for minutes; this prints one line per test file as its last test finishes (its counts,
# the seconds its tests took and the suite's elapsed time), from the process that reports (xdist's controller).

class FileProgress:
    def __init__(self, terminal):
        self.terminal, self.start = terminal, time.monotonic()
        self.left, self.outcomes, self.seconds = {}, {}, {}

    def expect(self, nodeids) -> None:
        for nodeid in nodeids:
            self.left[_file_of(nodeid)] = self.left.get(_file_of(nodeid), 0) + 1

    def report(self, report) -> None:
        name = _file_of(report.nodeid)
        self.seconds[name] = self.seconds.get(name, 0.0) + report.duration
        outcome = ("failed" if report.failed else "skipped" if report.skipped else "passed") if report.when == "call" \
            or (report.when == "setup" and not report.passed) else None
        if outcome is None or name not in self.left:
            return
        counts = self.outcomes.setdefault(name, {})
        counts[outcome] = counts.get(outcome, 0) + 1
        self.left[name] -= 1
        if self.left[name] == 0:
            summary = ", ".join(f"{n} {o}" for o, n in counts.items())
            if self.terminal._tw.width_of_current_line:   # after a row of dots: a line of its own
                self.terminal.write_line("")
            self.terminal.write_line(f"[{time.monotonic() - self.start:5.0f} s] done {name}: {summary} "
                                     f"({self.seconds[name]:.1f} s of tests)")

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):   # without xdist: this process runs the tests
        self.expect(item.nodeid for item in items)

    def pytest_xdist_node_collection_finished(self, node, ids):
        if not self.left:   # every worker collects the same tests
            self.expect(ids)

    def pytest_runtest_logreport(self, report):
        self.report(report)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(trylast=True)   # after the terminal reporter registered itself
def pytest_configure(config):
    terminal = config.pluginmanager.get_plugin("terminalreporter")
    if terminal is not None and not hasattr(config, "workerinput") and config.getoption("verbose") >= 0:
        config.pluginmanager.register(FileProgress(terminal), "file-progress")
