"""`icefall.testing.timing.tree_cpu_seconds`: the CPU the test report bills to a test.

Proves, with real processes: a child's CPU counts while it runs and after it has ended and been reaped, and
a grandchild's too (what `icefall run` subprocesses and Spark's JVM are to a test).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from icefall.testing.timing import tree_cpu_seconds

pytestmark = pytest.mark.integration

BURN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"


def test_children_and_grandchildren_are_counted_alive_and_after_they_end() -> None:
    before = tree_cpu_seconds()
    child = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys\n{BURN}"
                              f"subprocess.run([sys.executable, '-c', {BURN!r}])\nsys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while tree_cpu_seconds() - before < 1.1 and time.monotonic() < deadline:
            time.sleep(0.05)
        while_alive = tree_cpu_seconds() - before  # both burns, the child still waiting on its input
        child.communicate(b"", timeout=30)
    finally:
        child.kill()
    assert while_alive >= 1.1
    assert tree_cpu_seconds() - before >= 1.2  # still counted once it ended: our own cutime
