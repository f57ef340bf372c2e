"""Failpoints do nothing until armed, then exactly what they were armed with.

Proves: `ICEFALL_FAILPOINTS` parsing (several points, `exit`, `raise`, `sleep:<s>`, `@<hit>`) and its loud
refusal of unknown names (unqualified ones of old too), actions and hit counts; that main-table and
dead-letter points are distinct; hit counting (armed or not, `@<hit>` counted from arming) and the
"triggered" log line; that a call site with an unknown name fails; in-process arming with a spec or a
callable, restored after an `armed` block; and that `exit` really ends a process at once with status 137,
skipping `finally` and `atexit` (in a child), writing its line to the termination-message file only when
that file exists. `ICEFALL_FAILPOINTS_CHAOS`: its parsing (`all`, `@<most>`) and loud refusals; that a draw
is a function of seed and identity, arms with the stated chance one listed point at a hit in range; and,
in a child, that the process logs its draw, dies at the drawn point, and leaves the variable out of its
children's environment. Which test reaches each point: test_failpoint_coverage.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from icefall.runtime import failpoints
from icefall.runtime.failpoints import FailpointError, failpoint

pytestmark = pytest.mark.unit

SOURCE = Path(failpoints.__file__).resolve().parents[2]  # operator/src of this checkout


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    failpoints.disarm_all()
    yield
    failpoints.disarm_all()


def test_disarmed_points_do_nothing_but_count() -> None:
    failpoints.reset_hits()
    for name in failpoints.POINTS:
        failpoint(name)
    failpoint("main.after-commit")
    assert failpoints.hits("main.after-commit") == 2
    assert failpoints.hits("dlq.after-commit") == 1
    assert failpoints.hit_counts() == {
        name: 2 if name == "main.after-commit" else 1 for name in failpoints.POINTS
    }
    failpoints.reset_hits()
    assert failpoints.hits("main.after-commit") == 0


def test_an_unknown_name_fails_at_the_call_site_too() -> None:
    with pytest.raises(ValueError, match="unknown failpoint 'after-commit'"):
        failpoint("after-commit")  # the unqualified names of old: a table scope is required now
    with pytest.raises(ValueError):
        failpoints.hits("nope")


def test_the_registry_names_scope_dot_point() -> None:
    assert len(set(failpoints.POINTS)) == len(failpoints.POINTS)
    scopes = {name.partition(".")[0] for name in failpoints.POINTS}
    assert scopes == {"main", "dlq", "dlq-topic", "lease", "route"}
    # Both tables go through the commit protocol: each of its points exists once per table.
    for point in ("after-prepare", "after-stage", "before-commit", "after-commit", "before-abandon"):
        assert {f"main.{point}", f"dlq.{point}"} <= set(failpoints.POINTS)


def test_env_parsing() -> None:
    spec = " main.after-commit=raise , dlq.before-commit=sleep:0.05,"
    failpoints.load_env({failpoints.ENV_VAR: spec})
    with pytest.raises(FailpointError, match=r"main\.after-commit") as raised:
        failpoint("main.after-commit")
    assert raised.value.name == "main.after-commit"
    failpoint("dlq.after-commit")  # the other table's point is another point

    started = time.monotonic()
    failpoint("dlq.before-commit")
    assert time.monotonic() - started >= 0.05
    failpoint("main.before-commit")  # not armed

    failpoints.load_env({})  # replaces, does not add
    failpoint("main.after-commit")


def test_a_hit_count_fires_on_that_hit_only() -> None:
    failpoints.load_env({failpoints.ENV_VAR: "main.after-commit=raise@3,dlq.after-commit=raise@1"})
    failpoint("main.after-commit")
    failpoint("main.after-commit")
    with pytest.raises(FailpointError):
        failpoint("main.after-commit")
    failpoint("main.after-commit")  # the 4th: past it
    with pytest.raises(FailpointError):
        failpoint("dlq.after-commit")
    failpoint("dlq.after-commit")


def test_hits_are_counted_from_arming_in_process() -> None:
    calls: list[str] = []
    failpoint("lease.renew")  # before arming: counted, but not towards the armed hit
    with failpoints.armed("lease.renew", calls.append, hit=2):
        failpoint("lease.renew")
        assert calls == []
        failpoint("lease.renew")
        assert calls == ["lease.renew"]
        failpoint("lease.renew")
    assert calls == ["lease.renew"]
    failpoints.arm("main.mid-rewrite", "raise@2")
    failpoint("main.mid-rewrite")
    with pytest.raises(FailpointError):
        failpoint("main.mid-rewrite")


def test_the_triggered_line_names_the_point_and_its_hit(caplog: pytest.LogCaptureFixture) -> None:
    failpoints.reset_hits()
    failpoint("dlq.after-claim")
    with failpoints.armed("dlq.after-claim", lambda name: None):
        failpoint("dlq.after-claim")
    assert "failpoint dlq.after-claim triggered (hit 2)" in caplog.text


@pytest.mark.parametrize(
    "spec",
    [
        "no-such-point=exit",
        "after-commit=exit",  # unqualified: which table?
        "main.after-commit",
        "main.after-commit=explode",
        "main.after-commit=sleep:",
        "main.after-commit=sleep:-1",
        "main.after-commit=exit:3",
        "main.after-commit=exit@",
        "main.after-commit=exit@0",
        "main.after-commit=exit@-1",
        "main.after-commit=exit@two",
        "main.after-commit=exit@1@2",
        "main.after-commit=exit,main.after-commit=raise",
    ],
)
def test_bad_specs_fail_loudly(spec: str) -> None:
    with pytest.raises(ValueError):
        failpoints.parse(spec)


def test_arming_in_process_with_a_callable_and_restoring() -> None:
    calls: list[str] = []
    failpoints.arm("main.after-stage", "raise")
    with failpoints.armed("main.after-stage", calls.append):
        failpoint("main.after-stage")
    assert calls == ["main.after-stage"]
    with pytest.raises(FailpointError):  # the earlier arming is back
        failpoint("main.after-stage")
    failpoints.disarm("main.after-stage")
    failpoint("main.after-stage")
    with pytest.raises(ValueError):
        failpoints.arm("typo", "raise")
    with pytest.raises(ValueError):
        failpoints.arm("main.after-stage", "raise", hit=0)


CHILD = textwrap.dedent(
    """
    import atexit
    from icefall.runtime.failpoints import failpoint
    atexit.register(lambda: print("atexit ran"))
    try:
        print("before", flush=True)
        failpoint("main.after-commit")
        print("after")
    finally:
        print("finally ran")
    """
)


@pytest.mark.parametrize(
    ("spec", "status", "reached_end"),
    [
        ("main.after-commit=exit", failpoints.EXIT_STATUS, False),
        ("main.after-commit=exit@2", 0, True),  # passed once only
        ("dlq.after-commit=exit", 0, True),  # the other table's point
    ],
)
def test_exit_kills_the_process_at_the_point(spec: str, status: int, reached_end: bool) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        check=False,
        # This checkout's code, not the one the virtualenv's editable install points at.
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SOURCE), failpoints.ENV_VAR: spec},
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


CHAOS_CHILD = textwrap.dedent(
    """
    import os, sys
    from icefall.runtime import failpoints
    from icefall.runtime.failpoints import failpoint
    failpoints.TERMINATION_MESSAGE_FILE = sys.argv[1]
    print("children see", os.environ.get(failpoints.CHAOS_ENV_VAR), flush=True)
    failpoint("main.after-commit")
    print("after", flush=True)
    """
)


def _chaos_child(spec: str, message_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHAOS_CHILD, str(message_file)],
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SOURCE), failpoints.CHAOS_ENV_VAR: spec},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_chaos_draw_arms_the_process_and_names_the_point_in_its_termination_message(
    tmp_path: Path,
) -> None:
    message = tmp_path / "termination-log"
    message.write_text("")  # the kubelet creates it; failpoints never does
    child = _chaos_child("7:1:main.after-commit", message)
    assert child.returncode == failpoints.EXIT_STATUS, child.stderr
    assert child.stdout.splitlines() == ["children see None"]  # taken out of the environment at import
    assert "failpoints: ICEFALL_FAILPOINTS_CHAOS drew main.after-commit=exit@1" in child.stderr
    assert "failpoint main.after-commit triggered (hit 1)" in child.stderr
    assert message.read_text() == "failpoint main.after-commit triggered\n"


def test_a_chaos_draw_of_nothing_and_no_termination_file(tmp_path: Path) -> None:
    child = _chaos_child("7:0:main.after-commit", tmp_path / "absent")
    assert child.returncode == 0, child.stderr
    assert "failpoints: ICEFALL_FAILPOINTS_CHAOS drew nothing" in child.stderr
    assert child.stdout.splitlines()[-1] == "after"
    # Armed, but the container has no termination-message file: exit does not create one.
    child = _chaos_child("7:1:main.after-commit", tmp_path / "absent")
    assert child.returncode == failpoints.EXIT_STATUS, child.stderr
    assert not (tmp_path / "absent").exists()


def test_chaos_specs() -> None:
    spec = failpoints.parse_chaos(" 42:0.7:main.before-commit@3, main.mid-rewrite ,")
    assert spec == failpoints.ChaosSpec("42", 0.7, (("main.before-commit", 3), ("main.mid-rewrite", 1)))
    every = failpoints.parse_chaos("1:1:all@2")
    assert every.choices == tuple((name, 2) for name in failpoints.POINTS)


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "1:0.5",  # no points
        "1:0.5:",
        ":0.5:main.after-commit",  # no seed
        "1:1.5:main.after-commit",
        "1:-0.1:main.after-commit",
        "1:half:main.after-commit",
        "1:0.5:after-commit",  # unqualified
        "1:0.5:main.after-commit@0",
        "1:0.5:main.after-commit@x",
        "1:0.5:main.after-commit,main.after-commit@2",
        "1:0.5:all,main.after-commit",
    ],
)
def test_bad_chaos_specs_fail_loudly(spec: str) -> None:
    with pytest.raises(ValueError):
        failpoints.parse_chaos(spec)


def test_a_chaos_draw_is_seeded_by_identity_and_keeps_to_its_chance_points_and_hits() -> None:
    spec = failpoints.parse_chaos("5:0.7:main.before-commit@3,lease.renew")
    assert failpoints.chaos_draw(spec, "pod-a/7/1") == failpoints.chaos_draw(spec, "pod-a/7/1")
    draws = [failpoints.chaos_draw(spec, f"pod/{i}") for i in range(2000)]
    armed = [d for d in draws if d is not None]
    assert 0.65 < len(armed) / len(draws) < 0.75
    hits = {hit for point, hit in armed if point == "main.before-commit"}
    assert hits == {1, 2, 3}
    assert {d for d in armed if d[0] == "lease.renew"} == {("lease.renew", 1)}
    other_seed = failpoints.parse_chaos("6:0.7:main.before-commit@3,lease.renew")
    assert [failpoints.chaos_draw(other_seed, f"pod/{i}") for i in range(2000)] != draws
    never = failpoints.parse_chaos("5:0:all")
    assert all(failpoints.chaos_draw(never, f"pod/{i}") is None for i in range(200))
    always = failpoints.parse_chaos("5:1:all")
    assert all(failpoints.chaos_draw(always, f"pod/{i}") is not None for i in range(200))


def test_load_env_logs_a_draw_of_nothing(caplog: pytest.LogCaptureFixture) -> None:
    failpoints.load_env({failpoints.CHAOS_ENV_VAR: "3:0:all", failpoints.ENV_VAR: "main.after-stage=raise"})
    assert "ICEFALL_FAILPOINTS_CHAOS drew nothing" in caplog.text
    with pytest.raises(FailpointError):  # the plain form still applies
        failpoint("main.after-stage")
    with pytest.raises(ValueError, match="unknown failpoint"):
        failpoints.load_env({failpoints.CHAOS_ENV_VAR: "3:1:main.nope"})
