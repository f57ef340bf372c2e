"""Conditions derived from observations, their transition times, and the status write rate.

Proves: `set_condition` keeps lastTransitionTime while the status holds (even when reason and message
change), moves it when the status flips, and leaves other conditions alone; `derive_conditions` reports a
healthy table as Ready/Running, and for a slow, failing, suspended, deleting, blocked or misconfigured
table gives the documented reasons; over every combination of observations every condition is valid
for its type and Ready = Ingesting ∧ FreshnessMet ∧ ¬Degraded holds; `should_write_status` writes flips,
reason changes and new generations at once and everything else at most every `min_interval`;
`degraded_event` gives one Warning per Degraded episode and reason, a Normal one when it clears, and none for
DriverFailed (the driver's own Events cover it); an endpoint's text (issues, the driver's message) reaches
status cut to `MAX_ENDPOINT_TEXT` per piece.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from icefall.api import (
    Condition,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    FreshnessStatus,
    StreamingTable,
    StreamingTableStatus,
)
from icefall.plan.conditions import (
    MAX_ENDPOINT_TEXT,
    Issue,
    Observations,
    degraded_event,
    degraded_reason,
    derive_conditions,
    driver_refusal,
    set_condition,
    should_write_status,
)
from icefall.plan.driver import DriverHistory, DriverState, EventReason, EventType, driver_pod_from_object

pytestmark = pytest.mark.unit

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
R = ConditionReason
S = ConditionStatus
C = ConditionType


def table(
    *, suspend: bool = False, conditions: list[Condition] | None = None, generation: int = 4
) -> StreamingTable:
    body: dict[str, Any] = {
        "metadata": {"name": "orders", "generation": generation},
        "spec": {
            "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
            "format": {"schema": [{"name": "id", "type": "long"}]},
            "freshness": {"targetSeconds": 10},
            "suspend": suspend,
        },
    }
    st = StreamingTable.model_validate(body)
    if conditions is not None:
        st = st.model_copy(update={"status": StreamingTableStatus(conditions=conditions)})
    return st


def healthy(**changes: Any) -> Observations:
    values: dict[str, Any] = {
        "driver": DriverState.RUNNING,
        "freshness_seconds": 3.0,
        "lag_records": 120,
        "last_commit_time": T0 - timedelta(seconds=2),
    }
    values.update(changes)
    return Observations(**values)


def by_type(conditions: list[Condition]) -> dict[ConditionType, tuple[ConditionStatus, ConditionReason]]:
    return {c.type: (c.status, c.reason) for c in conditions}


# --- set_condition ----------------------------------------------------------------------------------------


def test_last_transition_time_holds_until_the_status_flips() -> None:
    first = set_condition([], C.INGESTING, S.TRUE, R.CATCHING_UP, "behind", generation=1, now=T0)
    later = T0 + timedelta(minutes=5)
    same = set_condition(first, C.INGESTING, S.TRUE, R.CAUGHT_UP, "caught up", generation=2, now=later)
    assert same[0].last_transition_time == T0
    assert (same[0].reason, same[0].message, same[0].observed_generation) == (R.CAUGHT_UP, "caught up", 2)
    flipped = set_condition(
        same, C.INGESTING, S.FALSE, R.KAFKA_UNAVAILABLE, "no brokers", generation=2, now=later
    )
    assert flipped[0].last_transition_time == later
    assert first[0].reason is R.CATCHING_UP  # the input is not modified


def test_other_conditions_are_kept_in_place() -> None:
    compacting = set_condition([], C.COMPACTING, S.TRUE, R.COMPACTING, "", generation=1, now=T0)
    both = set_condition(compacting, C.READY, S.TRUE, R.RUNNING, "", generation=1, now=T0)
    assert [c.type for c in both] == [C.COMPACTING, C.READY]
    again = set_condition(both, C.COMPACTING, S.FALSE, R.NO_COMPACTION_NEEDED, "", generation=1, now=T0)
    assert [c.type for c in again] == [C.COMPACTING, C.READY]


# --- derive_conditions ------------------------------------------------------------------------------------


def test_a_healthy_table_is_ready() -> None:
    conditions = derive_conditions(healthy(), table(), T0)
    assert by_type(conditions) == {
        C.READY: (S.TRUE, R.RUNNING),
        C.INGESTING: (S.TRUE, R.CAUGHT_UP),
        C.FRESHNESS_MET: (S.TRUE, R.WITHIN_TARGET),
        C.DEGRADED: (S.FALSE, R.HEALTHY),
    }
    assert [c.type for c in conditions] == [C.READY, C.INGESTING, C.FRESHNESS_MET, C.DEGRADED]
    assert all(c.observed_generation == 4 and c.last_transition_time == T0 for c in conditions)
    assert "3.0 s behind" in conditions[0].message


def test_a_table_behind_its_target_is_catching_up_and_not_ready() -> None:
    conditions = by_type(derive_conditions(healthy(freshness_seconds=45.0, lag_records=90_000), table(), T0))
    assert conditions[C.INGESTING] == (S.TRUE, R.CATCHING_UP)
    assert conditions[C.FRESHNESS_MET] == (S.FALSE, R.BEHIND_TARGET)
    assert conditions[C.READY] == (S.FALSE, R.BEHIND_TARGET)


def test_a_failing_driver_is_degraded_and_not_ingesting() -> None:
    obs = healthy(driver=DriverState.BACKING_OFF, driver_message="the driver failed 3 times in a row")
    conditions = derive_conditions(obs, table(), T0)
    assert by_type(conditions)[C.INGESTING] == (S.FALSE, R.DRIVER_FAILED)
    assert by_type(conditions)[C.DEGRADED] == (S.TRUE, R.DRIVER_FAILED)
    ready = conditions[0]
    assert (ready.status, ready.reason) == (S.FALSE, R.DRIVER_FAILED)
    assert "3 times" in ready.message


def test_a_starting_driver_is_not_ingesting_yet() -> None:
    conditions = by_type(derive_conditions(Observations(driver=DriverState.STARTING), table(), T0))
    assert conditions[C.INGESTING] == (S.FALSE, R.STARTING)
    assert conditions[C.FRESHNESS_MET] == (S.UNKNOWN, R.NO_COMMITS_YET)
    assert conditions[C.READY] == (S.FALSE, R.STARTING)


def test_suspended_and_deleting_tables_say_so_everywhere_it_matters() -> None:
    suspended = by_type(
        derive_conditions(Observations(driver=DriverState.NOT_WANTED), table(suspend=True), T0)
    )
    assert suspended[C.READY] == (S.FALSE, R.SUSPENDED)
    assert suspended[C.INGESTING] == (S.FALSE, R.SUSPENDED)
    assert suspended[C.FRESHNESS_MET] == (S.UNKNOWN, R.SUSPENDED)
    paused = by_type(derive_conditions(healthy(suspended=True), table(), T0))
    assert paused[C.READY] == (S.FALSE, R.SUSPENDED)
    deleting = by_type(derive_conditions(healthy(deleting=True), table(), T0))
    assert deleting == {
        C.READY: (S.FALSE, R.DELETING),
        C.INGESTING: (S.FALSE, R.DELETING),
        C.FRESHNESS_MET: (S.UNKNOWN, R.DELETING),
        C.DEGRADED: (S.FALSE, R.DELETING),
    }


def test_a_spec_that_cannot_be_honoured_makes_the_table_degraded_but_keeps_it_ingesting() -> None:
    obs = healthy(spec_problems=("spec.source.security.password: env references work only with icefall run",))
    conditions = derive_conditions(obs, table(), T0)
    assert by_type(conditions)[C.INGESTING] == (S.TRUE, R.CAUGHT_UP)
    assert by_type(conditions)[C.DEGRADED] == (S.TRUE, R.INVALID_SPEC)
    ready = conditions[0]
    assert (ready.status, ready.reason) == (S.FALSE, R.INVALID_SPEC)
    assert "spec.source.security.password" in ready.message


def test_issues_block_ingestion_or_degrade_the_table_most_severe_first() -> None:
    obs = healthy(
        issues=(
            Issue(R.DEAD_LETTER_FAILED, "dead-letter table unavailable"),
            Issue(R.DATA_LOSS, "120 records deleted by retention before ingestion"),
            Issue(R.KAFKA_UNAVAILABLE, "no broker answered"),
        )
    )
    conditions = derive_conditions(obs, table(), T0)
    states = by_type(conditions)
    assert states[C.INGESTING] == (S.FALSE, R.KAFKA_UNAVAILABLE)
    assert states[C.DEGRADED] == (S.TRUE, R.DATA_LOSS)
    assert states[C.READY] == (S.FALSE, R.DATA_LOSS)
    degraded = next(c for c in conditions if c.type is C.DEGRADED)
    assert degraded.message.index("120 records") < degraded.message.index("dead-letter")
    halted = by_type(
        derive_conditions(healthy(issues=(Issue(R.BAD_RECORD_HALTED, "bad record"),)), table(), T0)
    )
    assert halted[C.INGESTING] == (S.FALSE, R.BAD_RECORD_HALTED)
    assert halted[C.DEGRADED] == (S.TRUE, R.BAD_RECORD_HALTED)
    with pytest.raises(ValueError, match="not an issue reason"):
        Issue(R.RUNNING, "fine")


def test_degraded_transitions_give_one_event_each() -> None:
    loss = derive_conditions(healthy(issues=(Issue(R.DATA_LOSS, "120 records deleted"),)), table(), T0)
    fine = derive_conditions(healthy(), table(), T0)
    assert (degraded_reason(loss), degraded_reason(fine)) == (R.DATA_LOSS, None)
    event = degraded_event(None, loss)
    assert event is not None and event.reason is EventReason.DEGRADED and event.type is EventType.WARNING
    assert event.message == "DataLoss: 120 records deleted"
    assert degraded_event(R.DATA_LOSS, loss) is None, "once per episode, not once per pass"
    halted = derive_conditions(healthy(issues=(Issue(R.BAD_RECORD_HALTED, "bad record"),)), table(), T0)
    changed = degraded_event(R.DATA_LOSS, halted)
    assert changed is not None and changed.message.startswith("BadRecordHalted: ")
    cleared = degraded_event(R.BAD_RECORD_HALTED, fine)
    assert cleared is not None and cleared.reason is EventReason.DEGRADATION_CLEARED
    assert cleared.type is EventType.NORMAL and "BadRecordHalted" in cleared.message
    assert degraded_event(None, fine) is None
    failing = derive_conditions(healthy(driver=DriverState.BACKING_OFF), table(), T0)
    assert degraded_reason(failing) == R.DRIVER_FAILED
    assert degraded_event(None, failing) is None and degraded_event(R.DRIVER_FAILED, fine) is None


def test_freshness_before_the_first_commit() -> None:
    def freshness(lag: int | None) -> tuple[ConditionStatus, ConditionReason]:
        obs = healthy(freshness_seconds=None, last_commit_time=None, lag_records=lag)
        return by_type(derive_conditions(obs, table(), T0))[C.FRESHNESS_MET]

    assert freshness(0) == (S.TRUE, R.WITHIN_TARGET)  # an empty topic is as fresh as it gets
    assert freshness(500) == (S.FALSE, R.NO_COMMITS_YET)
    assert freshness(None) == (S.UNKNOWN, R.NO_COMMITS_YET)
    unknown = by_type(derive_conditions(healthy(freshness_seconds=None, lag_records=None), table(), T0))
    assert unknown[C.READY] == (S.UNKNOWN, R.NO_COMMITS_YET)


def test_every_combination_gives_valid_conditions_and_ready_is_the_conjunction() -> None:
    issue_sets = [
        (),
        (Issue(R.WAITING_FOR_LEASE, "w"),),
        (Issue(R.COMPACTION_FAILED, "c"),),
        (Issue(R.TABLE_CLAIMED, "t"),),
    ]
    combos = itertools.product(
        list(DriverState),
        [None, 2.0, 60.0],
        [None, 0, 50],
        issue_sets,
        [(), ("p",)],
        [False, True],
        [False, True],
    )
    for driver, fresh, lag, issues, problems, suspend, deleting in combos:
        obs = Observations(
            driver=driver,
            freshness_seconds=fresh,
            lag_records=lag,
            last_commit_time=T0 if fresh is not None else None,
            spec_problems=problems,
            issues=issues,
            deleting=deleting,
        )
        states = by_type(derive_conditions(obs, table(suspend=suspend), T0))  # Condition validates reasons
        ready = states[C.READY][0]
        good = (
            states[C.INGESTING][0] is S.TRUE
            and states[C.FRESHNESS_MET][0] is S.TRUE
            and states[C.DEGRADED][0] is S.FALSE
        )
        bad = (
            states[C.INGESTING][0] is S.FALSE
            or states[C.FRESHNESS_MET][0] is S.FALSE
            or states[C.DEGRADED][0] is S.TRUE
        )
        assert (ready is S.TRUE) == good, obs
        assert (ready is S.FALSE) == bad, obs


def test_transition_times_survive_repeated_derivation() -> None:
    first = derive_conditions(healthy(), table(), T0)
    later = T0 + timedelta(minutes=1)
    second = derive_conditions(
        healthy(freshness_seconds=5.0, lag_records=300), table(conditions=first), later
    )
    assert all(c.last_transition_time == T0 for c in second)
    third = derive_conditions(healthy(freshness_seconds=40.0), table(conditions=second), later)
    times = {c.type: c.last_transition_time for c in third}
    assert times[C.FRESHNESS_MET] == times[C.READY] == later
    assert times[C.INGESTING] == times[C.DEGRADED] == T0


def test_conditions_of_other_types_are_kept() -> None:
    compacting = set_condition([], C.COMPACTING, S.TRUE, R.COMPACTING, "rewriting", generation=3, now=T0)
    conditions = derive_conditions(healthy(), table(conditions=compacting), T0 + timedelta(minutes=1))
    assert conditions[0] == compacting[0]
    assert len(conditions) == 5


# --- should_write_status ----------------------------------------------------------------------------------


def status(conditions: list[Condition], *, seconds: float = 3.0, generation: int = 4) -> StreamingTableStatus:
    return StreamingTableStatus(
        observed_generation=generation,
        conditions=conditions,
        freshness=FreshnessStatus(seconds=seconds, lag_records=int(seconds * 10)),
    )


def test_status_writes_are_rate_limited_unless_a_condition_changes() -> None:
    interval = 30.0
    base = derive_conditions(healthy(), table(), T0)
    written = status(base)
    assert should_write_status(None, written, None, T0, interval)
    assert not should_write_status(written, status(base), T0, T0 + timedelta(hours=1), interval)
    figures = status(
        derive_conditions(healthy(freshness_seconds=4.0), table(conditions=base), T0), seconds=4.0
    )
    assert not should_write_status(written, figures, T0, T0 + timedelta(seconds=29), interval)
    assert should_write_status(written, figures, T0, T0 + timedelta(seconds=30), interval)
    flipped = status(
        derive_conditions(healthy(freshness_seconds=50.0), table(conditions=base), T0), seconds=50.0
    )
    assert should_write_status(written, flipped, T0, T0 + timedelta(seconds=1), interval)
    kafka_down = status(
        derive_conditions(healthy(issues=(Issue(R.KAFKA_UNAVAILABLE, "x"),)), table(conditions=base), T0)
    )
    assert should_write_status(written, kafka_down, T0, T0 + timedelta(seconds=1), interval)
    newer = status(base, generation=5)
    assert should_write_status(written, newer, T0, T0 + timedelta(seconds=1), interval)


def test_a_reason_change_without_a_flip_is_written_at_once() -> None:
    catching_up = derive_conditions(healthy(freshness_seconds=12.0), table(), T0)
    written = status(catching_up, seconds=12.0)
    ingesting = next(c for c in catching_up if c.type is C.INGESTING)
    assert ingesting.reason is R.CATCHING_UP
    caught_up = set_condition(
        catching_up, C.INGESTING, S.TRUE, R.CAUGHT_UP, "caught up", generation=4, now=T0
    )
    assert should_write_status(written, status(caught_up, seconds=12.0), T0, T0 + timedelta(seconds=1), 30)


def test_a_claimed_table_is_not_ready_and_says_who_owns_it() -> None:
    obs = healthy(driver=DriverState.NOT_WANTED, issues=(Issue(R.TABLE_CLAIMED, "claimed by ns/older"),))
    states = {c.type: c for c in derive_conditions(obs, table(), T0)}
    assert (states[C.READY].status, states[C.READY].reason) == (S.FALSE, R.TABLE_CLAIMED)
    assert states[C.READY].message == "claimed by ns/older"
    assert (states[C.INGESTING].status, states[C.INGESTING].reason) == (S.FALSE, R.TABLE_CLAIMED)


def test_freshness_that_cannot_be_measured_is_unknown_with_the_reason() -> None:
    obs = healthy(freshness_seconds=None, lag_records=None, last_commit_time=T0, unmeasured="no Kafka secret")
    states = {c.type: c for c in derive_conditions(obs, table(), T0)}
    fresh = states[C.FRESHNESS_MET]
    assert (fresh.status, fresh.reason, fresh.message) == (S.UNKNOWN, R.NOT_MEASURED, "no Kafka secret")
    assert (states[C.READY].status, states[C.READY].reason) == (S.UNKNOWN, R.NOT_MEASURED)


@pytest.mark.parametrize("refused", [R.CATALOG_CREDENTIALS_REFUSED, R.KAFKA_CREDENTIALS_REFUSED])
def test_refused_credentials_name_themselves_over_an_outage(refused: ConditionReason) -> None:
    """A service that answered and refused the credentials is what a person must fix: Ingesting and Ready
    say so, even when the other service is down at the same time."""
    issues = (
        Issue(R.CATALOG_UNAVAILABLE, "down"),
        Issue(R.KAFKA_UNAVAILABLE, "down"),
        Issue(refused, "fix it"),
    )
    states = by_type(derive_conditions(healthy(issues=issues), table(), T0))
    assert states[C.INGESTING] == (S.FALSE, refused)
    assert states[C.DEGRADED] == (S.TRUE, refused)
    assert states[C.READY] == (S.FALSE, refused)
    # A driver that exits on the refusal and is backed off does not hide it.
    failed = healthy(issues=issues, driver=DriverState.BACKING_OFF, driver_message="exited 1")
    states = by_type(derive_conditions(failed, table(), T0))
    assert states[C.READY] == (S.FALSE, refused)


LAST_WORDS = (
    "CatalogCredentialsRefused: catalog 'lake' at https://c refused the credentials (OAuthError: "
    "invalid_client): check spec.table.catalog.secretProperties[credential]\n"
)


def test_a_driver_stopped_by_refused_credentials_names_them() -> None:
    """The driver's CLI leaves `<Reason>: <line>` as its termination message; the history keeps it, and the
    conditions say it while the next driver is backed off or starting, not once one runs."""
    pod = driver_pod_from_object(
        {
            "metadata": {"uid": "p1"},
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "state": {
                            "terminated": {
                                "exitCode": 1,
                                "message": LAST_WORDS,
                            }
                        }
                    }
                ],
            },
        }
    )
    assert pod.message is not None and pod.message.endswith("secretProperties[credential]")
    history = DriverHistory(failures=2, last_message=pod.message)
    assert DriverHistory.from_dict(history.to_dict()) == history
    issue = driver_refusal(DriverState.BACKING_OFF, history)
    assert issue is not None and issue.reason is R.CATALOG_CREDENTIALS_REFUSED
    assert issue.message.startswith("the driver stopped: catalog 'lake' at https://c refused the credentials")
    states = by_type(derive_conditions(healthy(issues=(issue,), driver=DriverState.BACKING_OFF), table(), T0))
    assert states[C.READY] == (S.FALSE, R.CATALOG_CREDENTIALS_REFUSED)
    assert driver_refusal(DriverState.RUNNING, history) is None
    assert (
        driver_refusal(DriverState.BACKING_OFF, DriverHistory(failures=1, last_message="Error: boom")) is None
    )
    kafka = DriverHistory(
        failures=1, last_message="KafkaCredentialsRefused: Kafka at b:9093 refused the credentials"
    )
    refused = driver_refusal(DriverState.STARTING, kafka)
    assert refused is not None and refused.reason is R.KAFKA_CREDENTIALS_REFUSED


HALTED_LAST_WORDS = (
    "DataLossHalted: topic 'orders': partition 0 offsets 20..34 (15 records) were deleted by Kafka's "
    "retention before they were ingested; ingestion halted without skipping them (...)"
)


@pytest.mark.parametrize("state", [DriverState.BACKING_OFF, DriverState.STARTING])
def test_a_driver_halted_on_lost_records_says_so_in_ingesting_ready_and_degraded(state: DriverState) -> None:
    """spec.source.onDataLoss: Halt: the driver exits with `DataLossHalted: <line>`; while the next one is
    backed off or starting, Ingesting, Ready and Degraded name the reason and the line, not DriverFailed."""
    history = DriverHistory(failures=1, last_message=HALTED_LAST_WORDS)
    issue = driver_refusal(state, history)
    assert issue is not None and issue.reason is R.DATA_LOSS_HALTED
    assert "partition 0 offsets 20..34" in issue.message
    observed = healthy(issues=(issue,), driver=state, driver_message="the driver failed once (exit code 5)")
    states = by_type(derive_conditions(observed, table(), T0))
    assert states[C.INGESTING] == (S.FALSE, R.DATA_LOSS_HALTED)
    assert states[C.READY] == (S.FALSE, R.DATA_LOSS_HALTED)
    assert states[C.DEGRADED] == (S.TRUE, R.DATA_LOSS_HALTED)
    assert driver_refusal(DriverState.RUNNING, history) is None  # a driver that got past it


@pytest.mark.parametrize(
    ("reason", "line"),
    [
        (R.TOPIC_RECREATED, "topic 'orders' was deleted and created again (its id was a, now b): ..."),
        (R.OFFSETS_AHEAD_OF_TOPIC, "the table has committed offsets past the end of topic 'orders' (...)"),
    ],
)
def test_a_driver_stopped_by_a_changed_topic_says_so_in_degraded_and_ready(reason: R, line: str) -> None:
    """The operator reads no topic: a driver that found it recreated or truncated (`SourceChangedError`)
    leaves `<reason>: <line>` as its last words: Degraded and Ready say that reason and the line."""
    history = DriverHistory(failures=1, last_message=f"{reason.value}: orders: {line}")
    issue = driver_refusal(DriverState.BACKING_OFF, history)
    assert issue is not None and issue.reason is reason and line in issue.message
    observed = healthy(issues=(issue,), driver=DriverState.BACKING_OFF, driver_message="exit code 4")
    states = by_type(derive_conditions(observed, table(), T0))
    assert states[C.INGESTING] == (S.FALSE, R.DRIVER_FAILED)
    assert states[C.DEGRADED] == (S.TRUE, reason)
    assert states[C.READY] == (S.FALSE, reason)


# --- endpoint text ---------------------------------------------------------------------------------------


def test_endpoint_text_in_status_is_cut_to_a_bound_per_piece() -> None:
    """A catalog and a broker that answer with megabytes of text: each piece reaches status cut to
    MAX_ENDPOINT_TEXT, so both still show, and the condition stays under MAX_MESSAGE."""
    catalog = Issue(R.CATALOG_UNAVAILABLE, "cannot read the table: " + "C" * 1_000_000)
    broker = Issue(R.KAFKA_UNAVAILABLE, "cannot reach Kafka: " + "K" * 1_000_000)
    assert len(catalog.message) == MAX_ENDPOINT_TEXT and catalog.message.endswith("…")
    assert catalog.message.startswith("cannot read the table: CCC")
    assert Issue(R.CATALOG_UNAVAILABLE, "short").message == "short"
    conditions = {
        c.type: c
        for c in derive_conditions(healthy(issues=(broker, catalog), unmeasured="U" * 100_000), table(), T0)
    }
    ingesting = conditions[C.INGESTING]
    assert ingesting.reason is R.KAFKA_UNAVAILABLE
    assert (
        "cannot reach Kafka: KKK" in ingesting.message and "cannot read the table: CCC" in ingesting.message
    )
    assert len(ingesting.message) <= 2 * MAX_ENDPOINT_TEXT + 2
    failed = derive_conditions(
        healthy(driver=DriverState.BACKING_OFF, driver_message="Error: " + "x" * 50_000), table(), T0
    )
    degraded = next(c for c in failed if c.type is C.DEGRADED)
    assert degraded.reason is R.DRIVER_FAILED and len(degraded.message) == MAX_ENDPOINT_TEXT
