"""The ingestion driver's lifecycle, as a small explicit state machine. Pure: the clock is an argument.

Input: the observed driver Pod (`DriverPod`, or None), the desired spec hash (None while suspended), the
failure history the operator keeps for the table (`DriverHistory`), and `now`. Output (`DriverDecision`):
one action, the history to store, the Events to emit, the state to report in conditions, and when to
look again.

```
                 ┌──────── spec hash differs / suspended ────────┐
                 ▼                                               │
  (absent) ──Create──► Pending ──► Running ──────────────────────┤──Delete──► Terminating ──► (absent)
     ▲                    │           │ healthy 10 min: failures reset       │
     │                    └─────┬─────┘                                      │
     │                          ▼ Failed / Succeeded (exit)                  │
     │                 record failure n, Delete ─────────────────────────────┘
     └── Wait(backoff(n) = min(10 s · 2^(n-1), 5 min) since the failure) ◄── (absent, n > 0)
```

One method per observed state (`_absent`, `_terminating`, `_pending_or_running`, `_exited`, `_unknown`).
The pod uses `restartPolicy: Never`: the operator, not the kubelet, restarts the driver, so restarts are
visible (Events, conditions) and backed off per table. The pod's name is fixed, so a new pod is created only
once the old one is gone (`Wait` while it terminates).

Why deleting a driver mid-batch is safe (spec change, suspend, failure): the pod gets SIGTERM and its grace
period, so the batch in flight usually commits; if it does not, its data sits on a staging branch that was
never fast-forwarded onto `main`. The commit is a compare-and-swap on `main` that also stores the offsets,
so an abandoned batch changed nothing the next driver reads: it resumes from the offsets in the table and
sweeps the stale branch. A batch is in the table once or not at all.

Guarantees:
- Idempotent: deciding twice on the same observation gives the same action, and a failed pod is counted
  once (by its uid) even if the operator crashed between recording and deleting it.
- Backoff applies to failures under the current spec hash only: a new spec (or resuming from suspend)
  starts the driver at once; ten minutes of healthy running resets the count.
- Events are emitted on transitions only (a failure, a restart, a spec roll, a recovery), never on Keep or
  Wait, so a steady state emits nothing.
- An OOM kill (container reason OOMKilled) is a failure like any other, and its messages (the Event, the
  state message the conditions carry) name the container's memory limit and the field that raises it.

Not guaranteed: that a Pending pod ever starts (unschedulable, image pull errors): it is kept, and its
waiting reason is reported through `state_message`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from icefall.plan.names import LABEL_SPEC_HASH

INITIAL_BACKOFF_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 300.0
RESET_AFTER_SECONDS = 600.0
#: How soon to look again at a pod that is terminating.
TERMINATING_POLL_SECONDS = 5.0
#: The container status reason of a process the kernel killed at the container's memory limit.
OOM_KILLED = "OOMKilled"
#: Where a table sets its driver's memory limit (named in the message of an OOM kill).
DRIVER_MEMORY_FIELD = "spec.pods.driver.resources.limits.memory"
#: How much of a termination message is kept (Kubernetes allows 4096 bytes; the history is an annotation).
MAX_TERMINATION_MESSAGE = 1000


class PodPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class DriverPod:
    """What the operator observed of the driver Pod (see `driver_pod_from_object`)."""

    uid: str
    phase: PodPhase
    spec_hash: str | None = None  # the icefall.dev/spec-hash label
    deletion_timestamp: datetime | None = None
    exit_code: int | None = None  # of the terminated container
    reason: str | None = None  # terminated reason (OOMKilled, Error) or the pod's (Evicted)
    restart_count: int = 0  # in-place restarts; 0 with restartPolicy Never, reported in messages
    started_at: datetime | None = None  # when the container last started running
    finished_at: datetime | None = None  # when the container terminated
    waiting_reason: str | None = None  # e.g. ImagePullBackOff, CreateContainerConfigError
    memory_limit: str | None = None  # the container's resources.limits.memory, as written (e.g. 300Mi)
    message: str | None = None  # the terminated container's termination message (its last words)


@dataclass(frozen=True)
class DriverHistory:
    """Consecutive driver failures of one table; the operator stores it (to_dict/from_dict) between runs."""

    failures: int = 0
    last_failure_time: datetime | None = None
    last_failed_uid: str | None = None  # the pod already counted, so a failure is counted once
    spec_hash: str | None = None  # the hash the failures happened under
    last_exit_code: int | None = None
    last_reason: str | None = None
    last_memory_limit: str | None = None  # of the pod that failed last (named when it was OOM-killed)
    last_message: str | None = None  # its termination message (e.g. "CatalogCredentialsRefused: ...")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for an annotation or a status field."""
        return {
            "failures": self.failures,
            "lastFailureTime": self.last_failure_time.isoformat() if self.last_failure_time else None,
            "lastFailedUid": self.last_failed_uid,
            "specHash": self.spec_hash,
            "lastExitCode": self.last_exit_code,
            "lastReason": self.last_reason,
            "lastMemoryLimit": self.last_memory_limit,
            "lastMessage": self.last_message,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> DriverHistory:
        """Read `to_dict` output back; anything missing or malformed reads as no history."""
        if not data:
            return cls()
        try:
            when = data.get("lastFailureTime")
            return cls(
                failures=max(int(data.get("failures") or 0), 0),
                last_failure_time=datetime.fromisoformat(when) if when else None,
                last_failed_uid=data.get("lastFailedUid"),
                spec_hash=data.get("specHash"),
                last_exit_code=data.get("lastExitCode"),
                last_reason=data.get("lastReason"),
                last_memory_limit=data.get("lastMemoryLimit"),
                last_message=data.get("lastMessage"),
            )
        except (TypeError, ValueError):
            return cls()


class Action(StrEnum):
    CREATE = "Create"  # create `Children.driver_pod`
    KEEP = "Keep"  # nothing to do; look again after `requeue_seconds` if set
    DELETE = "Delete"  # delete the pod (graceful); it is recreated once gone
    WAIT = "Wait"  # do nothing for `requeue_seconds` (backoff, or a pod still terminating)


class DriverState(StrEnum):
    """The driver as conditions report it."""

    NOT_WANTED = "NotWanted"  # suspended: no driver should run
    STARTING = "Starting"  # being created, pending, or absent and about to be created
    RUNNING = "Running"
    RESTARTING = "Restarting"  # stopping to apply a new spec
    BACKING_OFF = "BackingOff"  # failed; waiting before the next attempt
    UNKNOWN = "Unknown"  # the pod's node stopped reporting


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(StrEnum):
    DRIVER_CREATED = "DriverCreated"
    DRIVER_RESTARTED = "DriverRestarted"
    DRIVER_FAILED = "DriverFailed"
    DRIVER_EXITED = "DriverExited"
    SPEC_CHANGED = "SpecChanged"
    SUSPENDED = "Suspended"
    DRIVER_RECOVERED = "DriverRecovered"
    TABLE_CLAIMED = "TableClaimedByOther"
    SECRET_NOT_ALLOWED = "SecretNotAllowed"
    # Degraded turned True or changed its reason, or cleared (plan.conditions.degraded_event).
    DEGRADED = "Degraded"
    DEGRADATION_CLEARED = "DegradationCleared"
    # Deletion (controller.deletion), not about the driver but from the same closed list.
    TABLE_RETAINED = "TableRetained"
    TABLE_DROPPED = "TableDropped"
    TABLE_DROP_FAILED = "TableDropFailed"
    TABLE_KEPT_FOR_OWNER = "TableKeptForOwner"
    TABLE_PURGE_STARTED = "TablePurgeStarted"
    # An offset reset request (`icefall.plan.offset_reset`), sent by the driver that acted on it.
    OFFSETS_RESET = "OffsetsReset"
    OFFSET_RESET_REFUSED = "OffsetResetRefused"


@dataclass(frozen=True)
class Event:
    reason: EventReason
    message: str
    type: EventType = EventType.NORMAL


@dataclass(frozen=True)
class DriverDecision:
    action: Action
    history: DriverHistory
    state: DriverState
    state_message: str = ""
    events: tuple[Event, ...] = ()
    requeue_seconds: float | None = None


def backoff_seconds(failures: int, cap: float = MAX_BACKOFF_SECONDS) -> float:
    """Delay before attempt `failures + 1`: 10 s, 20 s, 40 s, ... capped at `cap` (5 min); 0 without
    failures."""
    if failures <= 0:
        return 0.0
    return min(INITIAL_BACKOFF_SECONDS * float(2 ** min(failures - 1, 30)), cap)


def decide(
    observed: DriverPod | None,
    *,
    desired_hash: str | None,
    history: DriverHistory,
    now: datetime,
    hold: bool = False,
    claimed_by: str | None = None,
    refused: str | None = None,
    max_backoff_seconds: float = MAX_BACKOFF_SECONDS,
) -> DriverDecision:
    """What to do about the driver Pod. `desired_hash` is `Children.spec_hash`, or None when no driver
    should run (suspended).

    `hold=True` (the new spec has problems, `Children.problems`) keeps a pending or running driver on the
    spec it started with instead of rolling it. It cannot bring back one that exited: a new driver reads
    the current spec.

    `claimed_by` (another StreamingTable owns the same catalog table, `plan.claims`) means no driver, like
    suspend, with messages and the Event naming the owner; so does `refused` (why the table may not use
    a Secret it references, `icefall.plan.grants`). `max_backoff_seconds` caps the restart backoff
    (the operator's `ICEFALL_DRIVER_MAX_BACKOFF_SECONDS`; the chaos run restarts drivers hundreds of times).
    """
    if claimed_by is not None:
        why = f"the table is claimed by the older StreamingTable {claimed_by}"
        return _not_wanted(observed, history, why, EventReason.TABLE_CLAIMED, EventType.WARNING)
    if refused is not None:
        return _not_wanted(observed, history, refused, EventReason.SECRET_NOT_ALLOWED, EventType.WARNING)
    if desired_hash is None:
        return _not_wanted(
            observed, history, "suspended", EventReason.SUSPENDED, EventType.NORMAL, "spec.suspend is true"
        )
    if history.spec_hash is not None and history.spec_hash != desired_hash:
        # Failures under an older spec say nothing about this one: start afresh.
        history = DriverHistory(spec_hash=desired_hash)
    if observed is None:
        return _absent(desired_hash, history, now, max_backoff_seconds)
    if observed.deletion_timestamp is not None:
        return _terminating(observed, history)
    if observed.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED):
        return _exited(observed, desired_hash, history, now, max_backoff_seconds)
    if observed.phase is PodPhase.UNKNOWN:
        return DriverDecision(
            Action.KEEP,
            history,
            DriverState.UNKNOWN,
            "the driver pod's node stopped reporting; waiting for Kubernetes to settle its phase",
        )
    return _pending_or_running(observed, desired_hash, history, now, hold=hold)


def _not_wanted(  # noqa: PLR0917 (private; every caller passes all of them)
    observed: DriverPod | None,
    history: DriverHistory,
    why: str,
    reason: EventReason,
    kind: EventType,
    cause: str | None = None,
) -> DriverDecision:
    fresh = DriverHistory()  # resuming starts without backoff
    if observed is None:
        return DriverDecision(Action.KEEP, fresh, DriverState.NOT_WANTED, why)
    if observed.deletion_timestamp is not None:
        return DriverDecision(
            Action.WAIT,
            fresh,
            DriverState.NOT_WANTED,
            f"{why}; the driver is stopping",
            (),
            TERMINATING_POLL_SECONDS,
        )
    event = Event(reason, f"{cause or why}: stopping the ingestion driver", kind)
    return DriverDecision(Action.DELETE, fresh, DriverState.NOT_WANTED, why, (event,))


def _absent(desired_hash: str, history: DriverHistory, now: datetime, cap: float) -> DriverDecision:
    if history.failures == 0:
        event = Event(EventReason.DRIVER_CREATED, f"starting the ingestion driver (spec hash {desired_hash})")
        return DriverDecision(
            Action.CREATE,
            replace(history, spec_hash=desired_hash),
            DriverState.STARTING,
            "creating",
            (event,),
        )
    delay = backoff_seconds(history.failures, cap)
    # No failure time (a history written by hand): do not wait forever on a moving "now".
    since = history.last_failure_time
    remaining = 0.0 if since is None else delay - (now - since).total_seconds()
    if remaining > 0:
        return DriverDecision(
            Action.WAIT,
            history,
            DriverState.BACKING_OFF,
            f"{_failure_text(history)}; restarting in {remaining:.0f} s",
            (),
            remaining,
        )
    event = Event(
        EventReason.DRIVER_RESTARTED,
        f"restarting the ingestion driver after {_failure_text(history)} (waited {delay:.0f} s)",
    )
    return DriverDecision(
        Action.CREATE, history, DriverState.STARTING, "restarting after a failure", (event,)
    )


def _terminating(observed: DriverPod, history: DriverHistory) -> DriverDecision:
    if history.failures and history.last_failed_uid == observed.uid:
        state, message = DriverState.BACKING_OFF, f"{_failure_text(history)}; the failed pod is being removed"
    else:
        state, message = DriverState.RESTARTING, "the driver pod is stopping"
    return DriverDecision(Action.WAIT, history, state, message, (), TERMINATING_POLL_SECONDS)


def _exited(
    observed: DriverPod, desired_hash: str, history: DriverHistory, now: datetime, cap: float
) -> DriverDecision:
    """A driver never finishes on its own: any exit is a failure, counted once per pod, then deleted."""
    if history.last_failed_uid == observed.uid:  # counted already; the delete did not happen yet
        return DriverDecision(Action.DELETE, history, DriverState.BACKING_OFF, _failure_text(history))
    reason = EventReason.DRIVER_FAILED if observed.phase is PodPhase.FAILED else EventReason.DRIVER_EXITED
    if observed.spec_hash != desired_hash:
        # It ran an older spec: its failure says nothing about the new one, which starts at once.
        event = Event(
            reason,
            f"the ingestion driver {_exit_text(observed)} while running an older spec; starting the new "
            "spec at once",
            EventType.WARNING,
        )
        return DriverDecision(
            Action.DELETE,
            replace(history, last_failed_uid=observed.uid),
            DriverState.RESTARTING,
            "restarting with the new spec",
            (event,),
        )
    history = DriverHistory(
        failures=history.failures + 1,
        last_failure_time=observed.finished_at or now,
        last_failed_uid=observed.uid,
        spec_hash=desired_hash,
        last_exit_code=observed.exit_code,
        last_reason=observed.reason,
        last_memory_limit=observed.memory_limit,
        last_message=observed.message,
    )
    event = Event(
        reason,
        f"the ingestion driver {_exit_text(observed)}; restarting in "
        f"{backoff_seconds(history.failures, cap):.0f} s (failure {history.failures})",
        EventType.WARNING,
    )
    return DriverDecision(Action.DELETE, history, DriverState.BACKING_OFF, _failure_text(history), (event,))


def _pending_or_running(
    observed: DriverPod, desired_hash: str, history: DriverHistory, now: datetime, *, hold: bool
) -> DriverDecision:
    if observed.spec_hash != desired_hash and hold:
        state = DriverState.RUNNING if observed.phase is PodPhase.RUNNING else DriverState.STARTING
        return DriverDecision(
            Action.KEEP, history, state, "kept on its current spec: the new spec cannot be honoured"
        )
    if observed.spec_hash != desired_hash:
        event = Event(
            EventReason.SPEC_CHANGED,
            f"spec hash {observed.spec_hash} -> {desired_hash}: stopping the driver to restart it with "
            "the new spec; the batch in flight commits or is abandoned without effect",
        )
        return DriverDecision(
            Action.DELETE,
            DriverHistory(spec_hash=desired_hash),
            DriverState.RESTARTING,
            "restarting to apply the new spec",
            (event,),
        )
    if observed.phase is PodPhase.PENDING:
        waiting = f": {observed.waiting_reason}" if observed.waiting_reason else ""
        return DriverDecision(
            Action.KEEP, history, DriverState.STARTING, f"the driver pod is pending{waiting}"
        )
    restarts = f" ({observed.restart_count} restarts in place)" if observed.restart_count else ""
    message = f"the driver is running{restarts}"
    if history.failures == 0 or observed.started_at is None:
        return DriverDecision(Action.KEEP, history, DriverState.RUNNING, message)
    healthy = (now - observed.started_at).total_seconds()
    if healthy >= RESET_AFTER_SECONDS:
        event = Event(
            EventReason.DRIVER_RECOVERED,
            f"the ingestion driver has run for {healthy / 60:.0f} min since its last failure; "
            f"failure count {history.failures} reset",
        )
        return DriverDecision(
            Action.KEEP, DriverHistory(spec_hash=desired_hash), DriverState.RUNNING, message, (event,)
        )
    # Look again when the failure count would reset.
    return DriverDecision(
        Action.KEEP, history, DriverState.RUNNING, message, (), RESET_AFTER_SECONDS - healthy
    )


def _exit_text(pod: DriverPod) -> str:
    how = "failed" if pod.phase is PodPhase.FAILED else "exited"
    return how + _detail(pod.exit_code, pod.reason, pod.memory_limit)


def _failure_text(history: DriverHistory) -> str:
    times = "once" if history.failures == 1 else f"{history.failures} times in a row"
    detail = _detail(history.last_exit_code, history.last_reason, history.last_memory_limit)
    return f"the driver failed {times}{detail}"


def _detail(exit_code: int | None, reason: str | None, memory_limit: str | None) -> str:
    """` (exit code 1, Error)`; for an OOM kill, also the limit and the field that raises it."""
    parts = []
    if exit_code is not None:
        parts.append(f"exit code {exit_code}")
    if reason:
        parts.append(reason)
    text = f" ({', '.join(parts)})" if parts else ""
    if reason == OOM_KILLED and memory_limit:
        text += f": out of memory at its limit of {memory_limit} (raise {DRIVER_MEMORY_FIELD})"
    elif reason == OOM_KILLED:
        text += f": out of memory without a limit of its own (set {DRIVER_MEMORY_FIELD} and requests)"
    return text


# --- reading a Pod object ---------------------------------------------------------------------------------


def driver_pod_from_object(pod: Mapping[str, Any]) -> DriverPod:
    """Extract a `DriverPod` from a Pod as the API returns it (a dict, camelCase). Missing parts read as
    unknown; the first container is the driver."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    container = statuses[0] if statuses else {}
    state = container.get("state") or {}
    terminated = state.get("terminated") or (container.get("lastState") or {}).get("terminated") or {}
    running = state.get("running") or {}
    waiting = state.get("waiting") or {}
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    limits = (containers[0].get("resources") or {}).get("limits") or {}
    phase_text = status.get("phase") or "Pending"
    try:
        phase = PodPhase(phase_text)
    except ValueError:
        phase = PodPhase.UNKNOWN
    return DriverPod(
        uid=str(metadata.get("uid") or ""),
        phase=phase,
        spec_hash=(metadata.get("labels") or {}).get(LABEL_SPEC_HASH),
        deletion_timestamp=_time(metadata.get("deletionTimestamp")),
        exit_code=terminated.get("exitCode"),
        reason=terminated.get("reason") or status.get("reason"),
        restart_count=int(container.get("restartCount") or 0),
        started_at=_time(running.get("startedAt")),
        finished_at=_time(terminated.get("finishedAt")),
        waiting_reason=waiting.get("reason"),
        memory_limit=str(limits["memory"]) if limits.get("memory") is not None else None,
        message=(str(terminated["message"]).strip()[:MAX_TERMINATION_MESSAGE] or None)
        if terminated.get("message")
        else None,
    )


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
