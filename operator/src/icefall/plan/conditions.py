"""Conditions from observations, and when status is worth writing. Pure: the clock is an argument.

`derive_conditions` computes `Ingesting`, `FreshnessMet` and `Degraded` from what the operator observed,
then the summary:

    Ready = Ingesting ∧ FreshnessMet ∧ ¬Degraded

`Ready` is True only when all three hold, False as soon as one is bad (Ingesting False, FreshnessMet False,
Degraded True), Unknown otherwise. A False or Unknown Ready carries the reason and message of the condition
that made it so, picked in this order: a lifecycle reason (Deleting, Suspended), Degraded, Ingesting,
FreshnessMet. So `kubectl get st` shows why a table is not ready in one word.

- Ingesting: False with TableClaimedByOther or SecretNotAllowed whenever that issue is present (the loser
  of a contested table, or a table referencing a Secret not granted to StreamingTables, runs no driver on
  purpose); else True while the driver runs — CaughtUp (within target, or nothing to
  read) or CatchingUp;
  False when it does not (Starting, DriverFailed, Suspended, Deleting) or a blocking issue stops it
  (TableClaimedByOther, BadRecordHalted, DataLossHalted, KafkaCredentialsRefused, CatalogCredentialsRefused,
  KafkaUnavailable, CatalogUnavailable, LocalDiskFull, ClockBehind, ExecutorsLost,
  CommitConflict, WaitingForLease), or, while the
  driver is backed off or starting, the reason it stopped with (`DRIVER_REFUSALS`); Unknown when the
  driver's node stopped reporting.
- FreshnessMet: True (WithinTarget) when freshness <= spec.freshness.targetSeconds or the topic is empty;
  False when behind (BehindTarget) or records wait and nothing is committed (NoCommitsYet); Unknown before
  the first measurement (NoCommitsYet), when it cannot be measured (NotMeasured, with `unmeasured` as the
  message), while suspended and while deleting.
- Degraded: True with the most severe of DataLoss, DataLossHalted, TopicRecreated, OffsetsAheadOfTopic,
  BadRecordHalted, InvalidSpec, SecretNotAllowed, PodPolicyViolation, CatalogCredentialsRefused,
  KafkaCredentialsRefused (they outrank the driver failures they cause), DriverFailed (backing off),
  DeadLetterFailed, CompactionFailed (all messages joined); else False (Healthy, Deleting).

A spec that cannot be honoured (`spec_problems`) makes Degraded True with reason InvalidSpec, hence Ready
False: the driver keeps running what it started with, and the message says what to fix.

Guarantees:
- Every condition carries `observedGeneration` = `metadata.generation` and a reason valid for its type.
- `lastTransitionTime` changes only when a condition's `status` changes (`set_condition`); reason and
  message updates keep it. Conditions of other types are kept as they are, but for a Delta table's
  Compacting: on S3 True (Compacting) while the driver measures merges due, False (NoCompactionNeeded) when
  none, unchanged without a recent measure; elsewhere False, UpkeepNotAvailable (no compaction pods).
- `should_write_status` writes at once when a condition appears, disappears, flips status or changes
  reason, or when `observedGeneration` changes; figures and messages alone are written at most every
  `min_interval` seconds.
- `degraded_event` gives one Warning Event per Degraded episode and reason (what a person must act on), and
  a Normal one when it clears; DriverFailed is left to the driver's own Events.

- Text that comes from an endpoint a table names (a catalog's, a broker's or a registry's error, copied
  into an `Issue`, the driver's termination message, the `unmeasured` note) is cut to `MAX_ENDPOINT_TEXT`
  characters per piece (`endpoint_text`), so one hostile endpoint cannot fill a status or crowd out the
  other messages of a condition; a whole message is cut to `MAX_MESSAGE`.

Not guaranteed: that an issue is still current. Observations are taken as given: whoever reports an issue
(the driver's report, a lag probe) decides when it ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from icefall.api import (
    Condition,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    StreamingTable,
    StreamingTableStatus,
)
from icefall.plan.children import upkeep_in_pods
from icefall.plan.driver import DriverHistory, DriverState, Event, EventReason, EventType

_R = ConditionReason
_T, _F, _U = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN

#: Issues that stop ingestion (Ingesting False), most decisive first.
INGEST_BLOCKING: tuple[ConditionReason, ...] = (
    _R.TABLE_CLAIMED,
    _R.SECRET_NOT_ALLOWED,
    _R.BAD_RECORD_HALTED,
    _R.DATA_LOSS_HALTED,
    _R.KAFKA_CREDENTIALS_REFUSED,
    _R.CATALOG_CREDENTIALS_REFUSED,
    _R.KAFKA_UNAVAILABLE,
    _R.REGISTRY_UNAVAILABLE,
    _R.CATALOG_UNAVAILABLE,
    _R.LOCAL_DISK_FULL,
    _R.CLOCK_BEHIND,
    _R.EXECUTORS_LOST,
    _R.COMMIT_CONFLICT,
    _R.WAITING_FOR_LEASE,
)
#: Issues that mean the operator runs no driver for the table on purpose.
NO_DRIVER_ON_PURPOSE = (_R.TABLE_CLAIMED, _R.SECRET_NOT_ALLOWED)
#: Reasons that make the table Degraded, most severe first.
DEGRADING: tuple[ConditionReason, ...] = (
    _R.DATA_LOSS,
    _R.DATA_LOSS_HALTED,
    _R.TOPIC_RECREATED,
    _R.OFFSETS_AHEAD_OF_TOPIC,
    _R.BAD_RECORD_HALTED,
    _R.INVALID_SPEC,
    _R.SECRET_NOT_ALLOWED,
    _R.POD_POLICY_VIOLATION,
    # A configuration error a person must fix; it outranks the driver failures it causes.
    _R.CATALOG_CREDENTIALS_REFUSED,
    _R.KAFKA_CREDENTIALS_REFUSED,
    _R.DRIVER_FAILED,
    _R.DEAD_LETTER_FAILED,
    _R.SCHEMA_CHANGE_REFUSED,
    _R.COMPACTION_FAILED,
)
#: Reasons an `Issue` may carry (InvalidSpec and DriverFailed come from their own observations).
ISSUE_REASONS = frozenset(INGEST_BLOCKING) | (frozenset(DEGRADING) - {_R.INVALID_SPEC, _R.DRIVER_FAILED})
MAX_MESSAGE = 2000
#: The most of one endpoint's text (an error a catalog or broker sent) that reaches status.
MAX_ENDPOINT_TEXT = 512


def endpoint_text(text: str) -> str:
    """`text` cut to `MAX_ENDPOINT_TEXT` characters (an ellipsis says it was cut)."""
    return text if len(text) <= MAX_ENDPOINT_TEXT else text[: MAX_ENDPOINT_TEXT - 1] + "…"


@dataclass(frozen=True)
class Issue:
    """A current problem someone observed (the driver's report, the operator's probes)."""

    reason: ConditionReason
    message: str

    def __post_init__(self) -> None:
        if self.reason not in ISSUE_REASONS:
            allowed = ", ".join(sorted(r.value for r in ISSUE_REASONS))
            raise ValueError(f"{self.reason.value} is not an issue reason; use one of {allowed}")
        # Issues carry endpoints' error text: bounded here, wherever they were made.
        object.__setattr__(self, "message", endpoint_text(self.message))


#: Reasons a driver leaves as the first word of its termination message (icefall.cli), with a colon.
#: They stop ingestion: Ingesting False with that reason while the next driver is backed off or starting.
DRIVER_REFUSALS = (_R.DATA_LOSS_HALTED, _R.CATALOG_CREDENTIALS_REFUSED, _R.KAFKA_CREDENTIALS_REFUSED)
#: Every reason a driver's last words may carry: also a topic recreated or truncated (the operator reads
#: no topic itself), which degrades the table (Ingesting says DriverFailed).
DRIVER_LAST_WORDS = (*DRIVER_REFUSALS, _R.TOPIC_RECREATED, _R.OFFSETS_AHEAD_OF_TOPIC)


def driver_refusal(state: DriverState, history: DriverHistory) -> Issue | None:
    """The refusal the last failed driver named in its termination message (`<Reason>: <what to fix>`),
    while no driver has got past it (the next one is backed off or starting), else None."""
    message = history.last_message or ""
    reason, _, text = message.partition(": ")
    if history.failures == 0 or state not in (DriverState.BACKING_OFF, DriverState.STARTING):
        return None
    for refused in DRIVER_LAST_WORDS:
        if reason == refused.value and text:
            return Issue(refused, f"the driver stopped: {text}"[:MAX_MESSAGE])
    return None


@dataclass(frozen=True)
class Observations:
    """What the operator knows about one table right now."""

    driver: DriverState
    driver_message: str = ""
    freshness_seconds: float | None = None  # None: not measured (yet)
    lag_records: int | None = None  # None: not measured (yet)
    last_commit_time: datetime | None = None
    spec_problems: tuple[str, ...] = ()  # what in the spec cannot be honoured, with its path
    issues: tuple[Issue, ...] = ()
    suspended: bool = False  # in addition to spec.suspend (e.g. a pause annotation)
    unmeasured: str = ""  # why freshness could not be measured (e.g. a credential the operator lacks)
    deleting: bool = False
    compaction_backlog: int | None = None  # the driver's last measure (`reported_backlog`); None: none recent


def set_condition(
    conditions: Sequence[Condition],
    type: ConditionType,
    status: ConditionStatus,
    reason: ConditionReason,
    message: str,
    *,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """`conditions` with the one of `type` set; lastTransitionTime moves only when `status` changes.

    The input is not modified; the condition keeps its position, a new type is appended.
    """
    out = list(conditions)
    for i, current in enumerate(out):
        if current.type is type:
            since = current.last_transition_time if current.status is status else now
            out[i] = _condition(type, status, reason, message, generation=generation, since=since)
            return out
    out.append(_condition(type, status, reason, message, generation=generation, since=now))
    return out


def _condition(
    type: ConditionType,
    status: ConditionStatus,
    reason: ConditionReason,
    message: str,
    *,
    generation: int | None,
    since: datetime,
) -> Condition:
    return Condition(
        type=type,
        status=status,
        reason=reason,
        message=_clip(message),
        last_transition_time=since,
        observed_generation=generation,
    )


_Verdict = tuple[ConditionStatus, ConditionReason, str]

#: `Compacting` of a Delta table whose upkeep no compaction pod runs (`plan.children.upkeep_in_pods`).
DELTA_UPKEEP = (
    "upkeep of a Delta table that is not in an object store does not run in compaction pods: `icefall run` "
    "does it beside its batches; in a cluster set spec.table.location to s3://, gs:// or abfss://"
)


def _delta_compacting(obs: Observations, st: StreamingTable) -> _Verdict | None:
    """`Compacting` of a Delta table (None: not set): on S3 from the merges the driver measured due (the
    compaction pods run while there are some); elsewhere UpkeepNotAvailable."""
    if not upkeep_in_pods(st):
        return _F, _R.UPKEEP_NOT_AVAILABLE, DELTA_UPKEEP
    if _suspended(obs, st) or obs.deleting:
        return _F, _R.SUSPENDED if not obs.deleting else _R.DELETING, "compaction pods are stopped"
    backlog = obs.compaction_backlog
    if backlog is None:
        return None  # no recent measure: keep what the condition says
    if backlog == 0:
        return _F, _R.NO_COMPACTION_NEEDED, "no small files to merge; VACUUM runs when compaction pods run"
    return (
        _T,
        _R.COMPACTING,
        f"{backlog} merges of small files due; compaction pods merge them (Icefall's OPTIMIZE) and VACUUM",
    )


def derive_conditions(observations: Observations, st: StreamingTable, now: datetime) -> list[Condition]:
    """The table's conditions after `observations`, merged into its current ones (see the module doc)."""
    obs = replace(
        observations,
        driver_message=endpoint_text(observations.driver_message),
        unmeasured=endpoint_text(observations.unmeasured),
    )
    target = st.spec.freshness.target_seconds
    ingesting = _ingesting(obs, st, target)
    freshness = _freshness(obs, st, target)
    degraded = _degraded(obs)
    ready = _ready(ingesting, freshness, degraded, obs, target)
    conditions: list[Condition] = list(st.status.conditions) if st.status else []
    generation = st.metadata.generation
    for kind, (status, reason, message) in (
        (ConditionType.READY, ready),
        (ConditionType.INGESTING, ingesting),
        (ConditionType.FRESHNESS_MET, freshness),
        (ConditionType.DEGRADED, degraded),
    ):
        conditions = set_condition(conditions, kind, status, reason, message, generation=generation, now=now)
    verdict = _delta_compacting(obs, st) if st.spec.table.format.value == "delta" else None
    if verdict is not None and st.spec.compaction.enabled:
        conditions = set_condition(
            conditions, ConditionType.COMPACTING, *verdict, generation=generation, now=now
        )  # fmt: skip
    return conditions


def _suspended(obs: Observations, st: StreamingTable) -> bool:
    return obs.suspended or st.spec.suspend


def _ingesting(obs: Observations, st: StreamingTable, target: int) -> _Verdict:
    if obs.deleting:
        return _F, _R.DELETING, "the StreamingTable is being deleted"
    if _suspended(obs, st):
        return _F, _R.SUSPENDED, "ingestion is suspended (spec.suspend)"
    for idle in NO_DRIVER_ON_PURPOSE:
        if any(issue.reason is idle for issue in obs.issues):
            # The loser of a contested table, or one referencing a Secret not granted to it, runs no
            # driver on purpose: say why, not "starting".
            return _F, idle, _messages(obs.issues, idle)
    driver = obs.driver
    stopped_by = _first(obs.issues, DRIVER_REFUSALS)
    if driver in (DriverState.BACKING_OFF, DriverState.STARTING) and stopped_by is not None:
        # The driver exits on these (or would): name what stops it, not that it failed.
        return _F, stopped_by, _messages(obs.issues, stopped_by)
    if driver is DriverState.BACKING_OFF:
        return _F, _R.DRIVER_FAILED, obs.driver_message or "the driver failed"
    if driver is DriverState.UNKNOWN:
        return _U, _R.STARTING, obs.driver_message or "the driver's state is unknown"
    if driver is not DriverState.RUNNING:  # starting, restarting, or wanted but not yet created
        return _F, _R.STARTING, obs.driver_message or "the driver is starting"
    blocking = _first(obs.issues, INGEST_BLOCKING)
    if blocking is not None:
        # The most decisive reason; the messages of every blocking issue (e.g. Kafka and the catalog).
        ordered = sorted(
            (i for i in obs.issues if i.reason in INGEST_BLOCKING),
            key=lambda i: INGEST_BLOCKING.index(i.reason),
        )
        return _F, blocking, "; ".join(i.message for i in ordered)
    behind = obs.freshness_seconds is not None and obs.freshness_seconds > target
    if behind or (obs.freshness_seconds is None and (obs.lag_records or 0) > 0):
        return _T, _R.CATCHING_UP, f"catching up: {_lag_text(obs)}"
    return _T, _R.CAUGHT_UP, f"caught up: {_lag_text(obs)}"


def _freshness(obs: Observations, st: StreamingTable, target: int) -> _Verdict:
    if obs.deleting:
        return _U, _R.DELETING, "the StreamingTable is being deleted"
    if _suspended(obs, st):
        return _U, _R.SUSPENDED, "freshness is not tracked while suspended"
    if obs.freshness_seconds is not None:
        if obs.freshness_seconds <= target:
            return _T, _R.WITHIN_TARGET, f"{_lag_text(obs)} (target {target} s)"
        return _F, _R.BEHIND_TARGET, f"{_lag_text(obs)} (target {target} s)"
    if obs.last_commit_time is None:
        if obs.lag_records == 0:
            return _T, _R.WITHIN_TARGET, "nothing to ingest yet: the topic holds no records"
        if obs.lag_records is not None:
            return _F, _R.NO_COMMITS_YET, f"{obs.lag_records} records waiting; nothing committed yet"
    if obs.unmeasured:
        return _U, _R.NOT_MEASURED, obs.unmeasured
    return _U, _R.NO_COMMITS_YET, "freshness not measured yet"


def _degraded(obs: Observations) -> _Verdict:
    if obs.deleting:
        return _F, _R.DELETING, "the StreamingTable is being deleted"
    found: list[tuple[ConditionReason, str]] = [(i.reason, i.message) for i in obs.issues]
    if obs.spec_problems:
        found.append((_R.INVALID_SPEC, "the spec cannot be honoured: " + "; ".join(obs.spec_problems)))
    if obs.driver is DriverState.BACKING_OFF:
        found.append((_R.DRIVER_FAILED, obs.driver_message or "the driver failed"))
    degrading = [(reason, message) for reason, message in found if reason in DEGRADING]
    if not degrading:
        return _F, _R.HEALTHY, "no problems observed"
    degrading.sort(key=lambda item: DEGRADING.index(item[0]))
    return _T, degrading[0][0], "; ".join(message for _, message in degrading)


def _ready(
    ingesting: _Verdict, freshness: _Verdict, degraded: _Verdict, obs: Observations, target: int
) -> _Verdict:
    lifecycle = {_R.DELETING, _R.SUSPENDED}
    if ingesting[1] in lifecycle:
        return _F, ingesting[1], ingesting[2]
    bad = [v for v, is_bad in ((degraded, degraded[0] is _T), (ingesting, ingesting[0] is _F)) if is_bad]
    bad += [freshness] if freshness[0] is _F else []
    if bad:
        return _F, bad[0][1], bad[0][2]
    unknown = [v for v in (ingesting, freshness) if v[0] is _U]
    if unknown:
        return _U, unknown[0][1], unknown[0][2]
    return _T, _R.RUNNING, f"ingesting; {_lag_text(obs)} (target {target} s)"


def _first(issues: Sequence[Issue], order: Sequence[ConditionReason]) -> ConditionReason | None:
    present = {issue.reason for issue in issues}
    return next((reason for reason in order if reason in present), None)


def _messages(issues: Sequence[Issue], reason: ConditionReason) -> str:
    return "; ".join(issue.message for issue in issues if issue.reason is reason)


def _lag_text(obs: Observations) -> str:
    parts = []
    if obs.freshness_seconds is not None:
        parts.append(f"{obs.freshness_seconds:.1f} s behind")
    if obs.lag_records is not None:
        parts.append(f"lag {obs.lag_records} records")
    return ", ".join(parts) or "freshness not measured yet"


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"


#: Degraded reasons that already have an Event of their own (plan.driver: DriverFailed, DriverRecovered).
_EVENTED_ELSEWHERE = frozenset({_R.DRIVER_FAILED})


def degraded_reason(conditions: Sequence[Condition]) -> ConditionReason | None:
    """The reason of a True Degraded condition among `conditions`, else None."""
    found = next((c for c in conditions if c.type is ConditionType.DEGRADED), None)
    return found.reason if found is not None and found.status is _T else None


def degraded_event(previous: ConditionReason | None, conditions: Sequence[Condition]) -> Event | None:
    """The Event for Degraded now, given the reason last evented (`previous`; None: not degraded): a
    Warning when it turns True or changes reason, a Normal one when it clears, else None."""
    current = degraded_reason(conditions)
    if current == previous:
        return None
    if current is None:
        if previous in _EVENTED_ELSEWHERE:
            return None
        return Event(EventReason.DEGRADATION_CLEARED, f"no longer degraded ({previous})")
    if current in _EVENTED_ELSEWHERE:
        return None
    condition = next(c for c in conditions if c.type is ConditionType.DEGRADED)
    return Event(EventReason.DEGRADED, f"{current}: {condition.message}", EventType.WARNING)


def should_write_status(
    previous: StreamingTableStatus | None,
    new: StreamingTableStatus,
    last_write: datetime | None,
    now: datetime,
    min_interval: float,
) -> bool:
    """Whether to write `new` now, given what was last written (`previous`, at `last_write`)."""
    if previous is None or last_write is None:
        return True
    if new == previous:
        return False
    if _signature(previous) != _signature(new) or previous.observed_generation != new.observed_generation:
        return True
    return (now - last_write).total_seconds() >= min_interval


def _signature(status: StreamingTableStatus) -> dict[ConditionType, tuple[ConditionStatus, ConditionReason]]:
    return {c.type: (c.status, c.reason) for c in status.conditions}
