"""Where the test suite's time goes: seconds per test FILE (setup + call + teardown of its tests), slowest first.

    python labs/bench_suite.py -n auto                       # the whole suite, as the README's command runs it
    python labs/bench_suite.py tests/test_notebooks.py -x    # any pytest arguments: files, -k, -x, ...

Module- and session-scoped fixtures count where pytest runs them: in the setup of the first test that
asks for them. With ``-n`` the seconds are summed over the workers, so they exceed the wall time. The goal
is the whole suite in at most 300 s on an idle 2-core machine. Timing belongs here, not in tests (a loaded
CI machine must not fail a test for being slow).
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


class FileDurations:
    """A pytest plugin summing every test report's duration under the file its test lives in."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.tests: dict[str, set] = defaultdict(set)

    def pytest_runtest_logreport(self, report):
        path = report.nodeid.split("::")[0]
        self.seconds[path] += report.duration
        self.tests[path].add(report.nodeid)


def main(args: list[str]) -> int:
    durations = FileDurations()
    start = time.perf_counter()
    exit_code = pytest.main(["-p", "no:cacheprovider", "-q", *args], plugins=[durations])
    wall = time.perf_counter() - start
    print(f"\n{'seconds':>9}  {'tests':>5}  file")
    for path, seconds in sorted(durations.seconds.items(), key=lambda item: -item[1]):
        print(f"{seconds:9.1f}  {len(durations.tests[path]):5d}  {path}")
    print(f"{sum(durations.seconds.values()):9.1f}  {sum(map(len, durations.tests.values())):5d}  "
          f"total of the tests ({wall:.1f} s wall, collection included; pytest exit {int(exit_code)})")
    return int(exit_code)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
