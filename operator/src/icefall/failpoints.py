"""Named failpoints: places in the code where a test can make the process crash, fail or stall on purpose.

Crash tests must be deterministic, not timing luck. Code calls `failpoint("before-commit")` at the
risky places; nothing happens unless that point is armed, either

- from the environment, read once at import: `ICEFALL_FAILPOINTS="after-commit=exit,before-commit=sleep:2"`
  (for child processes: drivers, pods, `icefall run`), or
- programmatically, for in-process tests: `with armed("before-commit", "raise"): ...`, or with a callable
  that runs at the point (to inject a competing commit exactly there).

Actions: `exit` ends the process at once with status 137, like SIGKILL (no `finally`, no `atexit`, no
flushing); `raise` raises `FailpointError`; `sleep:<seconds>` stalls (a paused process).

Guarantees: a disarmed failpoint costs one dict truthiness check; names are checked against `POINTS`
when armed, so a typo in `ICEFALL_FAILPOINTS` fails loudly instead of silently testing nothing.
Not guaranteed: thread isolation — the armed set is process-wide.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

ENV_VAR = "ICEFALL_FAILPOINTS"
EXIT_STATUS = 137  # what a SIGKILLed process reports: the crash the exit action stands for

# Every failpoint in the code base, with where it is. Add a name here when you add a point.
POINTS: Mapping[str, str] = {
    "after-prepare": "commit: the staging branch exists at the planned head; no data written yet",
    "after-stage": "commit: the batch is written to its staging branch; main is untouched",
    "before-commit": "commit: all checks passed; the compare-and-swap of main is next",
    "after-commit": "commit: main points at the batch; the caller has not updated status yet",
    "mid-rewrite": "compaction: rewritten files are written but not committed",
}

Action = Callable[[str], None]

log = logging.getLogger(__name__)

_ARMED: dict[str, Action] = {}


class FailpointError(RuntimeError):
    """Raised by a failpoint armed with `raise`."""

    def __init__(self, name: str) -> None:
        super().__init__(f"failpoint {name!r} triggered")
        self.name = name


def failpoint(name: str) -> None:
    """Run the action armed at `name`, if any."""
    if not _ARMED:
        return
    action = _ARMED.get(name)
    if action is not None:
        log.warning("failpoint %s triggered", name)
        action(name)


def _exit(name: str) -> None:
    os._exit(EXIT_STATUS)


def _raise(name: str) -> None:
    raise FailpointError(name)


def _sleeper(seconds: float) -> Action:
    def sleep(name: str) -> None:
        time.sleep(seconds)

    return sleep


def parse_action(spec: str) -> Action:
    """`exit`, `raise` or `sleep:<seconds>` → the action."""
    kind, _, argument = spec.strip().partition(":")
    if kind == "exit" and not argument:
        return _exit
    if kind == "raise" and not argument:
        return _raise
    if kind == "sleep":
        try:
            seconds = float(argument)
        except ValueError:
            seconds = -1.0
        if seconds >= 0:
            return _sleeper(seconds)
    raise ValueError(f"unknown failpoint action {spec!r}: use exit, raise or sleep:<seconds>")


def parse(spec: str) -> dict[str, Action]:
    """`"a=exit,b=sleep:1.5"` → {name: action}; empty entries are ignored."""
    points: dict[str, Action] = {}
    for entry in spec.split(","):
        if not entry.strip():
            continue
        name, sep, action = entry.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"failpoint entry {entry!r} must be <name>=<action>")
        _check_name(name)
        points[name] = parse_action(action)
    return points


def _check_name(name: str) -> None:
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(sorted(POINTS))}")


def arm(name: str, action: str | Action) -> None:
    """Arm one failpoint with an action spec (`"raise"`) or a callable taking the point's name."""
    _check_name(name)
    _ARMED[name] = parse_action(action) if isinstance(action, str) else action


def disarm(name: str) -> None:
    _ARMED.pop(name, None)


def disarm_all() -> None:
    _ARMED.clear()


@contextmanager
def armed(name: str, action: str | Action) -> Iterator[None]:
    """Arm `name` for the duration of the block, then restore what was there before."""
    previous = _ARMED.get(name)
    arm(name, action)
    try:
        yield
    finally:
        if previous is None:
            disarm(name)
        else:
            _ARMED[name] = previous


def load_env(environ: Mapping[str, str] = os.environ) -> None:
    """Replace the armed set with what `ICEFALL_FAILPOINTS` says (done once at import)."""
    points = parse(environ.get(ENV_VAR, ""))
    _ARMED.clear()
    _ARMED.update(points)


load_env()
