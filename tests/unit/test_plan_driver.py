"""The driver lifecycle state machine, driven by a fake clock and fake pod observations.

Proves: a missing driver is created at once; a running one with the desired spec hash is kept and emits
nothing; a spec change deletes the driver and recreates it without backoff once the old pod is gone; every
exit counts as one failure (once per pod, even when decided twice) and restarts follow 10 s, 20 s, 40 s, ...
capped at 5 min; ten minutes of healthy running resets the count; a new spec or a suspend clears the
backoff; suspend deletes the driver; `hold` keeps a running driver on its old spec; events come only on
transitions; Pod objects and the stored history are read back faithfully; an OOM kill's Event, state message
and conditions name OOMKilled, the container's memory limit and the field that raises it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from icefall.api import ConditionReason, ConditionStatus, ConditionType, StreamingTable
from icefall.controller.reconcile import Config
from icefall.plan.conditions import Observations, derive_conditions
from icefall.plan.driver import (
    DRIVER_MEMORY_FIELD,
    MAX_BACKOFF_SECONDS,
    RESET_AFTER_SECONDS,
    Action,
    DriverDecision,
    DriverHistory,
    DriverPod,
    DriverState,
    EventReason,
    EventType,
    PodPhase,
    backoff_seconds,
    decide,
    driver_pod_from_object,
)

pytestmark = pytest.mark.unit

HASH = "a1b2c3d4e5f60718"
NEW_HASH = "ffffeeeeddddcccc"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


class FakeClock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def running(uid: str = "pod-1", spec_hash: str = HASH, started_at: datetime = T0) -> DriverPod:
    return DriverPod(uid=uid, phase=PodPhase.RUNNING, spec_hash=spec_hash, started_at=started_at)


def failed(uid: str, spec_hash: str = HASH, exit_code: int = 1, reason: str = "Error") -> DriverPod:
    return DriverPod(uid=uid, phase=PodPhase.FAILED, spec_hash=spec_hash, exit_code=exit_code, reason=reason)


def terminating(pod: DriverPod, at: datetime = T0) -> DriverPod:
    return replace(pod, deletion_timestamp=at)


class Cluster:
    """Applies decisions the way the handler would: one driver pod, deleted or created on command."""

    def __init__(self, clock: FakeClock, desired_hash: str = HASH) -> None:
        self.clock = clock
        self.desired_hash: str | None = desired_hash
        self.pod: DriverPod | None = None
        self.history = DriverHistory()
        self.created = 0
        self.events: list[EventReason] = []

    def reconcile(self, *, hold: bool = False) -> DriverDecision:
        decision = decide(
            self.pod, desired_hash=self.desired_hash, history=self.history, now=self.clock.now, hold=hold
        )
        self.history = decision.history
        self.events += [event.reason for event in decision.events]
        if decision.action is Action.CREATE:
            self.created += 1
            assert self.desired_hash is not None
            self.pod = DriverPod(
                uid=f"pod-{self.created}", phase=PodPhase.PENDING, spec_hash=self.desired_hash
            )
        elif decision.action is Action.DELETE:
            assert self.pod is not None
            self.pod = terminating(self.pod, self.clock.now)
        return decision

    def start(self) -> None:
        assert self.pod is not None
        self.pod = replace(self.pod, phase=PodPhase.RUNNING, started_at=self.clock.now)

    def crash(self, exit_code: int = 1) -> None:
        assert self.pod is not None
        self.pod = replace(self.pod, phase=PodPhase.FAILED, exit_code=exit_code, finished_at=self.clock.now)

    def gone(self) -> None:
        self.pod = None


def test_a_missing_driver_is_created_at_once() -> None:
    decision = decide(None, desired_hash=HASH, history=DriverHistory(), now=T0)
    assert decision.action is Action.CREATE
    assert decision.state is DriverState.STARTING
    assert [e.reason for e in decision.events] == [EventReason.DRIVER_CREATED]
    assert decision.history.spec_hash == HASH


def test_a_running_driver_with_the_desired_spec_is_kept_silently() -> None:
    decision = decide(running(), desired_hash=HASH, history=DriverHistory(), now=T0 + timedelta(hours=5))
    assert decision.action is Action.KEEP
    assert decision.state is DriverState.RUNNING
    assert decision.events == ()
    pending = DriverPod(uid="p", phase=PodPhase.PENDING, spec_hash=HASH, waiting_reason="ImagePullBackOff")
    decision = decide(pending, desired_hash=HASH, history=DriverHistory(), now=T0)
    assert (decision.action, decision.state) == (Action.KEEP, DriverState.STARTING)
    assert "ImagePullBackOff" in decision.state_message


def test_a_spec_change_rolls_the_driver_without_backoff() -> None:
    clock = FakeClock()
    cluster = Cluster(clock)
    cluster.reconcile()
    cluster.start()
    assert cluster.reconcile().action is Action.KEEP
    cluster.desired_hash = NEW_HASH
    decision = cluster.reconcile()
    assert (decision.action, decision.state) == (Action.DELETE, DriverState.RESTARTING)
    assert decision.events[0].reason is EventReason.SPEC_CHANGED
    assert "abandoned" in decision.events[0].message
    clock.advance(1)
    decision = cluster.reconcile()  # still terminating: the fixed name is not free yet
    assert (decision.action, decision.state) == (Action.WAIT, DriverState.RESTARTING)
    assert decision.requeue_seconds is not None and decision.requeue_seconds > 0
    cluster.gone()
    decision = cluster.reconcile()
    assert decision.action is Action.CREATE
    assert cluster.pod is not None and cluster.pod.spec_hash == NEW_HASH
    assert cluster.events == [
        EventReason.DRIVER_CREATED,
        EventReason.SPEC_CHANGED,
        EventReason.DRIVER_CREATED,
    ]


def test_failures_back_off_exponentially_up_to_five_minutes() -> None:
    clock = FakeClock()
    cluster = Cluster(clock)
    cluster.reconcile()
    waits: list[float] = []
    for _ in range(8):
        cluster.start()
        clock.advance(3)  # dies quickly: never healthy long enough to reset
        cluster.crash(exit_code=137)
        decision = cluster.reconcile()
        assert (decision.action, decision.state) == (Action.DELETE, DriverState.BACKING_OFF)
        assert decision.events[0].type is EventType.WARNING
        cluster.gone()
        decision = cluster.reconcile()
        assert decision.action is Action.WAIT and decision.state is DriverState.BACKING_OFF
        assert decision.requeue_seconds is not None
        waits.append(decision.requeue_seconds)
        clock.advance(decision.requeue_seconds - 0.5)
        assert cluster.reconcile().action is Action.WAIT  # not a moment early
        clock.advance(0.5)
        decision = cluster.reconcile()
        assert decision.action is Action.CREATE
        assert decision.events[0].reason is EventReason.DRIVER_RESTARTED
    assert waits == [10, 20, 40, 80, 160, 300, 300, 300]
    assert cluster.history.failures == 8
    assert cluster.history.last_exit_code == 137
    assert backoff_seconds(0) == 0 and backoff_seconds(1000) == MAX_BACKOFF_SECONDS


def test_the_operator_can_cap_the_backoff_lower() -> None:
    """`ICEFALL_DRIVER_MAX_BACKOFF_SECONDS` (the chaos run restarts drivers hundreds of times)."""
    assert [backoff_seconds(n, cap=2) for n in (0, 1, 5, 50)] == [0, 2, 2, 2]
    history = DriverHistory(failures=6, spec_hash=HASH, last_failure_time=T0)
    waiting = decide(None, desired_hash=HASH, history=history, now=T0 + timedelta(seconds=1),
                     max_backoff_seconds=2)  # fmt: skip
    assert waiting.action is Action.WAIT and waiting.requeue_seconds == pytest.approx(1)
    later = T0 + timedelta(seconds=2)
    assert decide(None, desired_hash=HASH, history=history, now=later, max_backoff_seconds=2).action is (
        Action.CREATE
    )
    assert Config.from_env({"ICEFALL_DRIVER_MAX_BACKOFF_SECONDS": "2"}).driver_max_backoff_seconds == 2
    assert Config.from_env({}).driver_max_backoff_seconds == MAX_BACKOFF_SECONDS


def test_a_failed_pod_is_counted_once_even_when_decided_twice() -> None:
    pod = failed("pod-7")
    first = decide(pod, desired_hash=HASH, history=DriverHistory(spec_hash=HASH), now=T0)
    again = decide(pod, desired_hash=HASH, history=first.history, now=T0 + timedelta(seconds=2))
    assert first.history.failures == again.history.failures == 1
    assert again.action is Action.DELETE
    assert len(first.events) == 1 and again.events == ()
    # ... and while it terminates it is reported as backing off, not as a spec roll.
    gone = decide(terminating(pod), desired_hash=HASH, history=again.history, now=T0)
    assert (gone.action, gone.state) == (Action.WAIT, DriverState.BACKING_OFF)


def test_a_history_without_a_failure_time_does_not_block_forever() -> None:
    decision = decide(None, desired_hash=HASH, history=DriverHistory(failures=3, spec_hash=HASH), now=T0)
    assert decision.action is Action.CREATE


def test_a_clean_exit_is_a_failure_too() -> None:
    pod = DriverPod(uid="p", phase=PodPhase.SUCCEEDED, spec_hash=HASH, exit_code=0)
    decision = decide(pod, desired_hash=HASH, history=DriverHistory(), now=T0)
    assert decision.action is Action.DELETE
    assert decision.history.failures == 1
    assert decision.events[0].reason is EventReason.DRIVER_EXITED


def test_ten_minutes_of_healthy_running_resets_the_failure_count() -> None:
    history = DriverHistory(failures=4, last_failure_time=T0, last_failed_uid="old", spec_hash=HASH)
    started = T0 + timedelta(seconds=100)
    pod = running("pod-5", started_at=started)
    early = decide(pod, desired_hash=HASH, history=history, now=started + timedelta(seconds=599))
    assert early.action is Action.KEEP and early.history.failures == 4 and early.events == ()
    assert early.requeue_seconds == pytest.approx(1)
    later = decide(
        pod, desired_hash=HASH, history=history, now=started + timedelta(seconds=RESET_AFTER_SECONDS)
    )
    assert later.action is Action.KEEP and later.history.failures == 0
    assert [e.reason for e in later.events] == [EventReason.DRIVER_RECOVERED]
    # The next failure starts the sequence again at 10 s.
    crash = decide(
        failed("pod-5"), desired_hash=HASH, history=later.history, now=started + timedelta(hours=1)
    )
    assert crash.history.failures == 1
    assert backoff_seconds(crash.history.failures) == 10


def test_a_new_spec_clears_the_backoff() -> None:
    history = DriverHistory(failures=6, last_failure_time=T0, last_failed_uid="x", spec_hash=HASH)
    decision = decide(None, desired_hash=NEW_HASH, history=history, now=T0 + timedelta(seconds=1))
    assert decision.action is Action.CREATE
    assert decision.history.failures == 0 and decision.history.spec_hash == NEW_HASH
    # A pod of the old spec that fails meanwhile is not held against the new one.
    old = decide(failed("old-pod"), desired_hash=NEW_HASH, history=history, now=T0)
    assert old.action is Action.DELETE and old.history.failures == 0
    then = decide(None, desired_hash=NEW_HASH, history=old.history, now=T0)
    assert then.action is Action.CREATE


def test_suspend_deletes_the_driver_and_resuming_starts_without_backoff() -> None:
    history = DriverHistory(failures=3, last_failure_time=T0, spec_hash=HASH)
    decision = decide(running(), desired_hash=None, history=history, now=T0)
    assert (decision.action, decision.state) == (Action.DELETE, DriverState.NOT_WANTED)
    assert [e.reason for e in decision.events] == [EventReason.SUSPENDED]
    stopping = decide(terminating(running()), desired_hash=None, history=decision.history, now=T0)
    assert stopping.action is Action.WAIT and stopping.events == ()
    idle = decide(None, desired_hash=None, history=stopping.history, now=T0)
    assert (idle.action, idle.state, idle.events) == (Action.KEEP, DriverState.NOT_WANTED, ())
    resumed = decide(None, desired_hash=HASH, history=idle.history, now=T0 + timedelta(seconds=1))
    assert resumed.action is Action.CREATE


def test_hold_keeps_a_running_driver_on_its_spec() -> None:
    decision = decide(
        running(spec_hash=HASH), desired_hash=NEW_HASH, history=DriverHistory(), now=T0, hold=True
    )
    assert (decision.action, decision.state, decision.events) == (Action.KEEP, DriverState.RUNNING, ())


def test_a_lost_node_is_waited_out() -> None:
    pod = DriverPod(uid="p", phase=PodPhase.UNKNOWN, spec_hash=HASH)
    decision = decide(pod, desired_hash=HASH, history=DriverHistory(), now=T0)
    assert (decision.action, decision.state) == (Action.KEEP, DriverState.UNKNOWN)


def test_a_steady_state_emits_no_events() -> None:
    clock = FakeClock()
    cluster = Cluster(clock)
    cluster.reconcile()
    cluster.start()
    for _ in range(100):
        clock.advance(30)
        cluster.reconcile()
    assert cluster.events == [EventReason.DRIVER_CREATED]
    assert cluster.created == 1


# --- reading observations ---------------------------------------------------------------------------------


def test_a_failed_pod_object_is_read_with_its_exit() -> None:
    pod = driver_pod_from_object(
        {
            "metadata": {"uid": "u-1", "labels": {"icefall.dev/spec-hash": HASH}},
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "ingest",
                        "restartCount": 0,
                        "state": {
                            "terminated": {
                                "exitCode": 137,
                                "reason": "OOMKilled",
                                "finishedAt": "2024-05-01T12:03:00Z",
                            }
                        },
                    }
                ],
            },
        }
    )
    assert pod == DriverPod(
        uid="u-1",
        phase=PodPhase.FAILED,
        spec_hash=HASH,
        exit_code=137,
        reason="OOMKilled",
        finished_at=T0 + timedelta(minutes=3),
    )


def test_running_terminating_and_evicted_pod_objects_are_read() -> None:
    pod = driver_pod_from_object(
        {
            "metadata": {"uid": "u-2", "labels": {}, "deletionTimestamp": "2024-05-01T12:00:00Z"},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {"restartCount": 2, "state": {"running": {"startedAt": "2024-05-01T11:00:00+00:00"}}}
                ],
            },
        }
    )
    assert pod.phase is PodPhase.RUNNING and pod.spec_hash is None
    assert pod.deletion_timestamp == T0 and pod.started_at == T0 - timedelta(hours=1)
    assert pod.restart_count == 2
    evicted = driver_pod_from_object(
        {"metadata": {"uid": "u-3"}, "status": {"phase": "Failed", "reason": "Evicted"}}
    )
    assert evicted.reason == "Evicted" and evicted.exit_code is None
    assert driver_pod_from_object({"metadata": {"uid": "u-4"}}).phase is PodPhase.PENDING
    assert driver_pod_from_object({"metadata": {}, "status": {"phase": "Weird"}}).phase is PodPhase.UNKNOWN


def test_history_survives_a_round_trip_and_garbage_reads_as_none() -> None:
    history = DriverHistory(
        failures=3,
        last_failure_time=T0,
        last_failed_uid="u",
        spec_hash=HASH,
        last_exit_code=137,
        last_reason="OOMKilled",
        last_memory_limit="300Mi",
    )
    assert DriverHistory.from_dict(history.to_dict()) == history
    assert DriverHistory.from_dict(None) == DriverHistory()
    assert DriverHistory.from_dict({"failures": "many", "lastFailureTime": "yesterday"}) == DriverHistory()


def test_a_claimed_table_stops_its_driver_and_names_the_owner() -> None:
    decision = decide(running(), desired_hash=HASH, history=DriverHistory(), now=T0, claimed_by="ns/older")
    assert (decision.action, decision.state) == (Action.DELETE, DriverState.NOT_WANTED)
    (event,) = decision.events
    assert event.reason is EventReason.TABLE_CLAIMED and "ns/older" in event.message
    idle = decide(None, desired_hash=HASH, history=decision.history, now=T0, claimed_by="ns/older")
    assert (idle.action, idle.events) == (Action.KEEP, ())
    assert "ns/older" in idle.state_message


def test_an_oom_kill_names_the_memory_limit_and_the_field_that_raises_it() -> None:
    pod = driver_pod_from_object(
        {
            "metadata": {"uid": "u-oom", "labels": {"icefall.dev/spec-hash": HASH}},
            "spec": {"containers": [{"name": "ingest", "resources": {"limits": {"memory": "300Mi"}}}]},
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                              "finishedAt": "2024-05-01T12:00:00Z"}}}
                ],
            },
        }
    )  # fmt: skip
    assert (pod.memory_limit, pod.reason, pod.exit_code) == ("300Mi", "OOMKilled", 137)
    hint = f"out of memory at its limit of 300Mi (raise {DRIVER_MEMORY_FIELD})"
    failed_now = decide(pod, desired_hash=HASH, history=DriverHistory(spec_hash=HASH), now=T0)
    (event,) = failed_now.events
    assert event.reason is EventReason.DRIVER_FAILED and event.type is EventType.WARNING
    assert event.message.startswith(
        f"the ingestion driver failed (exit code 137, OOMKilled): {hint}; restarting"
    )
    assert failed_now.history.last_memory_limit == "300Mi"
    # Gone and backing off: the limit is remembered in the history, so the message still names it.
    waiting = decide(None, desired_hash=HASH, history=failed_now.history, now=T0 + timedelta(seconds=1))
    assert waiting.state is DriverState.BACKING_OFF
    assert (
        waiting.state_message
        == f"the driver failed once (exit code 137, OOMKilled): {hint}; restarting in 9 s"
    )
    # ... and so do the conditions: Ready False because Degraded, reason DriverFailed.
    st = StreamingTable.model_validate(
        {
            "metadata": {"name": "orders", "generation": 2},
            "spec": {
                "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
                "format": {"schema": [{"name": "id", "type": "long"}]},
            },
        }
    )
    observations = Observations(driver=waiting.state, driver_message=waiting.state_message)
    conditions = {c.type: c for c in derive_conditions(observations, st, T0)}
    for kind, status in (
        (ConditionType.READY, ConditionStatus.FALSE),
        (ConditionType.DEGRADED, ConditionStatus.TRUE),
    ):
        assert (conditions[kind].status, conditions[kind].reason) == (status, ConditionReason.DRIVER_FAILED)
        assert "OOMKilled" in conditions[kind].message and hint in conditions[kind].message
    # Without a limit of its own (the node ran out), the message says what to set; other failures say nothing.
    unlimited = decide(replace(pod, memory_limit=None), desired_hash=HASH, history=DriverHistory(), now=T0)
    assert (
        f"out of memory without a limit of its own (set {DRIVER_MEMORY_FIELD}" in unlimited.events[0].message
    )
    error = decide(failed("u-err"), desired_hash=HASH, history=DriverHistory(), now=T0)
    assert error.state_message == "the driver failed once (exit code 1, Error)"
