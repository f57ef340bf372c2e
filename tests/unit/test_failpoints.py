"""Failpoints do nothing until armed, then exactly what they were armed with.

Proves: `ICEFALL_FAILPOINTS` parsing (several points, `exit`, `raise`, `sleep:<s>`) and its loud refusal of
unknown names and actions; in-process arming with a spec or a callable, restored after an `armed` block; and
that `exit` really ends a process at once with status 137, skipping `finally` and `atexit` (in a child).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

from icefall import failpoints
from icefall.failpoints import FailpointError, failpoint

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    failpoints.disarm_all()
    yield
    failpoints.disarm_all()


def test_disarmed_points_do_nothing() -> None:
    for name in failpoints.POINTS:
        failpoint(name)
    failpoint("not-even-a-known-name")  # never checked on the hot path


def test_env_parsing() -> None:
    failpoints.load_env({failpoints.ENV_VAR: " after-commit=raise , before-commit=sleep:0.05,"})
    with pytest.raises(FailpointError, match="after-commit") as raised:
        failpoint("after-commit")
    assert raised.value.name == "after-commit"

    started = time.monotonic()
    failpoint("before-commit")
    assert time.monotonic() - started >= 0.05
    failpoint("after-stage")  # not armed

    failpoints.load_env({})  # replaces, does not add
    failpoint("after-commit")


@pytest.mark.parametrize(
    "spec",
    [
        "no-such-point=exit",
        "after-commit",
        "after-commit=explode",
        "after-commit=sleep:",
        "after-commit=sleep:-1",
        "after-commit=exit:3",
    ],
)
def test_bad_specs_fail_loudly(spec: str) -> None:
    with pytest.raises(ValueError):
        failpoints.parse(spec)


def test_arming_in_process_with_a_callable_and_restoring() -> None:
    calls: list[str] = []
    failpoints.arm("after-stage", "raise")
    with failpoints.armed("after-stage", calls.append):
        failpoint("after-stage")
    assert calls == ["after-stage"]
    with pytest.raises(FailpointError):  # the earlier arming is back
        failpoint("after-stage")
    failpoints.disarm("after-stage")
    failpoint("after-stage")
    with pytest.raises(ValueError):
        failpoints.arm("typo", "raise")


CHILD = textwrap.dedent(
    """
    import atexit
    from icefall.failpoints import failpoint
    atexit.register(lambda: print("atexit ran"))
    try:
        print("before", flush=True)
        failpoint("after-commit")
        print("after")
    finally:
        print("finally ran")
    """
)


@pytest.mark.parametrize(
    ("spec", "status", "reached_end"),
    [("after-commit=exit", failpoints.EXIT_STATUS, False), ("after-stage=exit", 0, True)],
)
def test_exit_kills_the_process_at_the_point(spec: str, status: int, reached_end: bool) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        check=False,
        env={"PATH": "/usr/bin:/bin", failpoints.ENV_VAR: spec},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == status, child.stderr
    lines = child.stdout.splitlines()
    assert lines[0] == "before"
    assert ("after" in lines) is reached_end
    assert ("finally ran" in lines) is reached_end
    assert ("atexit ran" in lines) is reached_end
