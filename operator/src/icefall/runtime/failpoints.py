"""Named failpoints: places in the code where a test can make the process crash, fail or stall on purpose.

Crash tests must be deterministic, not timing luck. Code calls `failpoint("main.before-commit")` at the
risky places; nothing happens unless that point is armed, either

- from the environment, read once at import, for child processes (drivers, pods, `icefall run`):
  `ICEFALL_FAILPOINTS="main.after-commit=exit@3,dlq.before-commit=sleep:2"`, or
- programmatically, for in-process tests: `with armed("main.before-commit", "raise"): ...`, or with a
  callable that runs at the point (to inject a competing commit exactly there).

Names are `<scope>.<point>`. The scope says which table or resource the crash is about: `main` (the
table), `dlq` (the dead-letter table; the commit protocol runs once per table, so `main.before-commit`
and `dlq.before-commit` are two points), `dlq-topic` (the dead-letter Kafka topic) and `lease` (the
ingestion writer's commit lease). `POINTS` lists every name, `DESCRIPTIONS` says where each one is.

Entry syntax: `<name>=<action>[@<hit>]`. Actions: `exit` ends the process at once with status 137, like
SIGKILL (no `finally`, no `atexit`, no flushing); `raise` raises `FailpointError`; `sleep:<seconds>`
stalls (a paused process). `@<hit>` fires on that hit of the point only (`@3`: the third time the code
passes it, counted from arming; for the environment, from the start of the process); without it, every
hit fires. Every pass is counted, armed or not: `hits(name)` tells a test how often a point was reached.
Each firing logs `failpoint <name> triggered (hit <n>)` at WARNING, before its action; `exit` also writes
`failpoint <name> triggered` to the container's termination-message file (`TERMINATION_MESSAGE_FILE`,
Kubernetes' default `terminationMessagePath`) when that file exists, so the Pod's status
(`state.terminated.message`) says which point ended the container.

Random arming, one draw per process (chaos runs, where a kubelet hook per container start is not at hand):
`ICEFALL_FAILPOINTS_CHAOS="<seed>:<chance>:<point>[@<most>],..."` (a point may be `all`: every point in
`POINTS`). At import, with probability `<chance>` the process arms ONE of the listed points, drawn
uniformly, with `exit@<hit>`, `<hit>` drawn from 1..`<most>` (default 1); it logs what it drew, at WARNING:
`failpoints: ICEFALL_FAILPOINTS_CHAOS drew <point>=exit@<hit>` or `... drew nothing`. The draw is seeded by
the seed, the pod (`ICEFALL_POD_NAME`, else the host name), the pid and the start time, so each container
start of one pod draws anew: the seed varies the draws between runs, it does not make them reproducible.
The process takes the variable out of its environment, so its children (Spark's JVM and Python workers)
do not draw again. A drawn point replaces an `ICEFALL_FAILPOINTS` entry for the same point.

Guarantees: an unknown name fails loudly with ValueError — in `ICEFALL_FAILPOINTS`,
`ICEFALL_FAILPOINTS_CHAOS` or `arm` (a typo never silently tests nothing) and at a call site (a point
missing from `POINTS` breaks its first test run); a malformed entry, chance or hit count fails the same
way. A disarmed point costs a lock and a counter increment.
Not guaranteed: thread isolation — the armed set and the counters are process-wide.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Literal

ENV_VAR = "ICEFALL_FAILPOINTS"
CHAOS_ENV_VAR = "ICEFALL_FAILPOINTS_CHAOS"
EXIT_STATUS = 137  # what a SIGKILLed process reports: the crash the exit action stands for
#: Where a container's last words go (Kubernetes' default terminationMessagePath): `exit` writes its line
#: there when the file exists (the kubelet creates it, writable by any user); it never creates it.
TERMINATION_MESSAGE_FILE = "/dev/termination-log"

# Every failpoint in the code base and where it is. Add a name here when you add a point: call sites, the
# environment and `arm` refuse names that are not listed.
DESCRIPTIONS: Mapping[str, str] = {
    # Creating a new table (catalog/tables.py `ensure_tables`) and starting a writer (ingest/engine.py).
    "main.after-create": "ensure_tables: the table exists (its dead-letter table not yet); nothing committed",
    "dlq.after-create": "ensure_tables: the dead-letter table was created, nothing committed to it",
    "main.after-genesis": "the empty first snapshot of a new table is on main (its first commit)",
    "dlq.after-genesis": "the empty first snapshot of a new dead-letter table is on main",
    "main.after-claim": "start: the writer's epoch is claimed in the table (dead-letter table already)",
    "dlq.after-claim": "start: the writer's epoch is claimed in the dead-letter table, not in the table yet",
    "main.before-sweep": "start: leftover staging branches found; the commit dropping them is next",
    "dlq.before-sweep": "start: leftover staging branches of the dead-letter table found; their drop is next",
    # The commit protocol (commit/protocol.py), once per table.
    "main.after-prepare": "commit: the staging branch exists at the planned head; no data written yet",
    "dlq.after-prepare": "dead letters: the staging branch exists at the planned head; no row written yet",
    "main.after-ensure-staged": "an empty batch: its empty snapshot is on the staging branch, main untouched",
    "main.after-stage": "commit: the batch is written to its staging branch; main is untouched",
    "dlq.after-stage": "dead letters: the rows are on their staging branch; main of the dlq table untouched",
    "main.before-commit": "commit: all checks passed; the compare-and-swap of main is next",
    "dlq.before-commit": "dead letters: all checks passed; the compare-and-swap is next",
    "main.after-commit": "commit: main points at the batch; the caller has not updated status yet",
    "dlq.after-commit": "dead letters committed, the dead-letter topic not produced, the table not committed",
    "main.before-abandon": "a failed attempt: its staging branch is found; the commit dropping it is next",
    "dlq.before-abandon": "a failed dead-letter attempt: the commit dropping its staging branch is next",
    "main.after-schema-change": "a batch's new fields are in the table's schema; the batch is not written",
    # The dead-letter topic (kafka/dead_letters.py): at least once.
    "dlq-topic.mid-produce": "a dead letter went to the producer (not acknowledged yet); more may follow",
    "dlq-topic.after-produce": "every dead letter of the batch is acknowledged; the table's commit is next",
    # The ingestion writer's commit lease (ingest/engine.py LeaseKeeper).
    "lease.renew": "the commit lease is renewed next (background thread, or the check before a commit)",
    # Maintenance (compact/worker.py), each between its re-check and its commit or delete.
    "main.mid-rewrite": "compaction: rewritten files are written but not committed",
    "main.before-expire": "expiry: the planned snapshots still exist; the expire_snapshots call is next",
    "main.before-orphan-delete": "orphans: a file is referenced by nothing (re-checked); its delete is next",
    "main.before-rewrite-commit": "a Delta merge's inputs are live at the latest version; its PUT is next",
    "main.after-rewrite": "a Delta table's merge (compaction pods) is committed; the pod has not reported it",
    "main.after-checkpoint": "a Delta checkpoint is written; `_last_checkpoint` and log cleanup are next",
    # A route's table (`spec.routes`; ingest/routes.py): the commit protocol once per route table, each
    # route committed before the dead letters and the table (hit n: the n-th route commit since start).
    "route.after-create": "ensure_tables: a route's table was created, nothing committed to it",
    "route.after-genesis": "the empty first snapshot of a new route table is on main",
    "route.after-claim": "start: the writer's epoch is claimed in a route table, not in the table yet",
    "route.before-sweep": "start: leftover staging branches of a route table found; their drop is next",
    "route.after-prepare": "a route table's staging branch exists at its head; no row written yet",
    "route.after-stage": "a route's rows are on its staging branch; its main untouched",
    "route.before-commit": "a route table's checks passed; its compare-and-swap is next",
    "route.after-commit": "a route table committed; the next route, the dead letters and the table are next",
    "route.before-abandon": "a failed attempt: the commit dropping a route table's staging branch is next",
}
POINTS: tuple[str, ...] = tuple(DESCRIPTIONS)

Action = Callable[[str], None]
# The scope of a per-table point: the table a StreamingTable fills, or its dead-letter table. Code that runs
# for either (the commit protocol) takes one and calls `failpoint(f"{table}.<point>")`.
TableRole = Literal["main", "dlq", "route"]

log = logging.getLogger(__name__)


@dataclass
class _Armed:
    action: Action
    on_hit: int | None = None  # fire on this hit only (1-based, counted from arming); None: on every hit
    seen: int = 0


_LOCK = threading.Lock()
_ARMED: dict[str, _Armed] = {}
_HITS: Counter[str] = Counter()


class FailpointError(RuntimeError):
    """Raised by a failpoint armed with `raise`."""

    def __init__(self, name: str) -> None:
        super().__init__(f"failpoint {name!r} triggered")
        self.name = name


def failpoint(name: str) -> None:
    """Count a pass at `name` and run the action armed there, if this hit is the one it waits for."""
    with _LOCK:
        if name not in DESCRIPTIONS:
            raise ValueError(f"unknown failpoint {name!r}: add it to icefall.runtime.failpoints.DESCRIPTIONS")
        _HITS[name] += 1
        armed = _ARMED.get(name)
        if armed is None:
            return
        armed.seen += 1
        if armed.on_hit is not None and armed.seen != armed.on_hit:
            return
        hit = _HITS[name]
    thread = threading.current_thread()
    where = "" if thread is threading.main_thread() else f" on thread {thread.name}"
    log.warning("failpoint %s triggered (hit %d)%s", name, hit, where)
    armed.action(name)


def hits(name: str) -> int:
    """How often the code passed `name` in this process (since the last `reset_hits`)."""
    _check_name(name)
    return _HITS[name]


def hit_counts() -> dict[str, int]:
    """{name: passes} of every point passed at least once."""
    with _LOCK:
        return dict(_HITS)


def reset_hits() -> None:
    with _LOCK:
        _HITS.clear()


def last_words(line: str) -> None:
    """`line` into the container's termination message, when there is one (in a pod): the Pod's status
    then says why the container ended (`TERMINATION_MESSAGE_FILE`, never created here)."""
    with suppress(OSError):
        out = os.open(TERMINATION_MESSAGE_FILE, os.O_WRONLY | os.O_TRUNC)  # no O_CREAT: only if it exists
        try:
            os.write(out, (line[:3900] + "\n").encode())
        finally:
            os.close(out)


def _exit(name: str) -> None:
    last_words(f"failpoint {name} triggered")
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


def parse_hit(spec: str) -> int:
    """The `<hit>` of `@<hit>`: a positive integer."""
    if not spec.strip().isdigit() or int(spec) < 1:
        raise ValueError(f"failpoint hit {spec!r} must be a positive integer (1 is the first hit)")
    return int(spec)


def _parse_armed(spec: str) -> _Armed:
    action, at, hit = spec.partition("@")
    return _Armed(parse_action(action), parse_hit(hit) if at else None)


def parse(spec: str) -> dict[str, _Armed]:
    """`"a.x=exit@2,b.y=sleep:1.5"` → {name: armed action}; empty entries are ignored."""
    points: dict[str, _Armed] = {}
    for entry in spec.split(","):
        if not entry.strip():
            continue
        name, sep, action = entry.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"failpoint entry {entry!r} must be <name>=<action>[@<hit>]")
        _check_name(name)
        if name in points:
            raise ValueError(f"failpoint {name!r} is armed twice in {spec!r}")
        points[name] = _parse_armed(action)
    return points


def _check_name(name: str) -> None:
    if name not in DESCRIPTIONS:
        raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(sorted(DESCRIPTIONS))}")


def arm(name: str, action: str | Action, *, hit: int | None = None) -> None:
    """Arm one failpoint with an action spec (`"raise"`, `"exit@2"`) or a callable taking the point's name.

    `hit`: fire on that hit only, counted from now (an `@<hit>` in the spec says the same).
    """
    _check_name(name)
    armed = _parse_armed(action) if isinstance(action, str) else _Armed(action)
    if hit is not None:
        armed.on_hit = parse_hit(str(hit))
    with _LOCK:
        _ARMED[name] = armed


def disarm(name: str) -> None:
    with _LOCK:
        _ARMED.pop(name, None)


def disarm_all() -> None:
    with _LOCK:
        _ARMED.clear()


@contextmanager
def armed(name: str, action: str | Action, *, hit: int | None = None) -> Iterator[None]:
    """Arm `name` for the duration of the block, then restore what was there before."""
    previous = _ARMED.get(name)
    arm(name, action, hit=hit)
    try:
        yield
    finally:
        with _LOCK:
            if previous is None:
                _ARMED.pop(name, None)
            else:
                _ARMED[name] = previous


@dataclass(frozen=True)
class ChaosSpec:
    """`ICEFALL_FAILPOINTS_CHAOS`, parsed: the seed, the chance of arming, (point, most hits) to draw from."""

    seed: str
    chance: float
    choices: tuple[tuple[str, int], ...]


def parse_chaos(spec: str) -> ChaosSpec:
    """`"<seed>:<chance>:<point>[@<most>],..."` (`all`: every point) → the spec; ValueError if malformed."""
    seed, sep1, rest = spec.strip().partition(":")
    chance_text, sep2, listed = rest.partition(":")
    if not (sep1 and sep2 and seed.strip()):
        raise ValueError(f"{CHAOS_ENV_VAR}={spec!r} must be <seed>:<chance>:<point>[@<most>],...")
    try:
        chance = float(chance_text)
    except ValueError:
        chance = -1.0
    if not 0.0 <= chance <= 1.0:
        raise ValueError(f"{CHAOS_ENV_VAR}: chance {chance_text!r} must be a number from 0 to 1")
    choices: dict[str, int] = {}
    for entry in listed.split(","):
        if not entry.strip():
            continue
        name, at, most = entry.strip().partition("@")
        hits = parse_hit(most) if at else 1
        names = POINTS if name == "all" else (name,)
        for one in names:
            _check_name(one)
            if one in choices:
                raise ValueError(f"{CHAOS_ENV_VAR}: failpoint {one!r} is listed twice in {spec!r}")
            choices[one] = hits
    if not choices:
        raise ValueError(f"{CHAOS_ENV_VAR}={spec!r} lists no failpoint")
    return ChaosSpec(seed.strip(), chance, tuple(choices.items()))


def chaos_draw(spec: ChaosSpec, identity: str) -> tuple[str, int] | None:
    """(point, hit) that the process `identity` arms with `exit`, or None (a chance of `1 - spec.chance`).
    The same seed and identity always draw the same."""
    rng = random.Random(f"{spec.seed}/{identity}")
    if rng.random() >= spec.chance:
        return None
    point, most = rng.choice(spec.choices)
    return point, rng.randint(1, most)


def _process_identity(environ: Mapping[str, str]) -> str:
    pod = environ.get("ICEFALL_POD_NAME") or socket.gethostname()
    return f"{pod}/{os.getpid()}/{time.time_ns()}"


def load_env(environ: Mapping[str, str] = os.environ) -> None:
    """Replace the armed set with what `ICEFALL_FAILPOINTS` says, plus this process's draw from
    `ICEFALL_FAILPOINTS_CHAOS` if set (done once at import)."""
    points = parse(environ.get(ENV_VAR, ""))
    chaos = environ.get(CHAOS_ENV_VAR, "")
    if chaos.strip():
        drawn = chaos_draw(parse_chaos(chaos), _process_identity(environ))
        if drawn is None:
            log.warning("failpoints: %s drew nothing", CHAOS_ENV_VAR)
        else:
            name, hit = drawn
            points[name] = _Armed(_exit, hit)
            log.warning("failpoints: %s drew %s=exit@%d", CHAOS_ENV_VAR, name, hit)
    with _LOCK:
        _ARMED.clear()
        _ARMED.update(points)


load_env()
# The draw is this process's: its children (Spark's JVM, its Python workers) must not draw again.
os.environ.pop(CHAOS_ENV_VAR, None)
