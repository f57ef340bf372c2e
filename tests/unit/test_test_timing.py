"""`icefall.testing.timing.render`: the test report `make test` writes (build/test-report.md).

Proves: the totals add every test's wall and CPU time; modules and tests come slowest first; each test row
names its outcome, worker and the components it started.
"""

from __future__ import annotations

import pytest

from icefall.testing.timing import Timing, render

pytestmark = pytest.mark.unit


def test_the_report_totals_and_orders_modules_and_tests_slowest_first() -> None:
    results = [
        Timing("tests/a.py::fast", "passed", 1.0, 0.5, (), "gw0"),
        Timing("tests/b.py::slow", "failed", 30.0, 12.0, ("kafka", "spark"), "gw1"),
        Timing("tests/a.py::middle", "passed", 5.0, 4.5, (), "gw0"),
    ]
    text = render(results, elapsed=20.0)
    assert "3 tests on 2 worker(s) in 20 s: tests' wall time 36 s, CPU 17 s (0.85 cores busy" in text
    modules = [line for line in text.splitlines() if line.startswith("| tests/") and ".py |" in line]
    assert modules == ["| tests/b.py | 1 | 30.0 | 12.0 |", "| tests/a.py | 2 | 6.0 | 5.0 |"]
    tests = [line for line in text.splitlines() if line.startswith("| tests/") and "::" in line]
    assert tests[0] == "| tests/b.py::slow | failed | 30.0 | 12.0 | gw1 | kafka, spark |"
    assert [line.split(" | ")[0] for line in tests[1:]] == ["| tests/a.py::middle", "| tests/a.py::fast"]
