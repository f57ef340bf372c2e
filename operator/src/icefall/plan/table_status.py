"""Freshness, lag, table figures and data-loss issues from what the table's driver reported. Pure.

The operator reads no table and no topic itself: every address a StreamingTable names (a catalog's URI, a
SQLite path, bootstrap servers) is the tenant's choice, and the operator's own reads would lend the
tenant its network position (its namespace's databases, its disk) and identity. The table's driver, in the
tenant's namespace with the table's own credentials, measures instead and reports into `status.writer`
(`icefall.ingest.writer_status`: lag and freshness after each batch, the table's figures and compaction
backlog from its `TableMeter`, the records lost to retention). `summarize` turns that report into the
status blocks (`FreshnessStatus`, `TableStatus`, `dataLossRecords`) and the figures and issues
`plan.conditions.Observations` takes; `TableFacts` and `table_status` are what the driver's meter reads
from the table's metadata.

Rules:
- A report at most `WRITER_REPORT_MAX_AGE_SECONDS` old (the driver reports every ~10 s while it runs) gives
  freshness, lag (its partition map: the `MAX_PARTITIONS` most lagging), the last commit and the table's
  figures. Without one (no driver yet, or one that stopped) there is no freshness block and no table
  block: the previous figures stay in status and `Summary.unmeasured` says why.
- The records lost to retention (`status.writer.lostRecords`: the table's `icefall.lost-records` as the
  driver last saw it) count whatever the report's age: the count never goes down. Above the acknowledged
  count (annotation `icefall.dev/acknowledged-data-loss`) it is a `DataLoss` issue.
- The driver's own problems (`writer_issues`): a service it waits out (Kafka, the catalog, the object
  store, the schema registry) and schema changes the table cannot follow. Why it stopped (credentials
  refused, data loss halted, a recreated topic or offsets past its end) is its termination message
  (`plan.conditions.driver_refusal`).
- Compaction is scaled from the reported backlog (`reported_backlog`): of every table the StreamingTable
  writes (`status.writer.tables`), since one set of compaction pods tidies them all.
- Per destination (`status.tables`, spec.table first, then each route's table): the driver measures each
  table's lag from its own committed offsets against each topic's end at its last batch (summed over
  every topic and partition, in either form of the source), and its freshness
  (`destination_status`); at most `MAX_STATUS_TABLES` (`bounded_tables`). Without a recent report the
  previous list stays; before any, the destinations are listed without figures (`status_tables`).
  The tables a dynamic route made are destinations too: the driver finds them in the catalog (by their
  owner property) and lists them with the others, within the bound. `status.tableCount` is how many
  tables the spec names plus how many the dynamic route made as the last report says, whatever its age
  (`table_count`: a table once made stays).

Not guaranteed: that the figures are current (they are as old as the report, at most
`WRITER_REPORT_MAX_AGE_SECONDS`), or that freshness is exact (the driver measures it right after its
commit, from the produce time of the newest committed record: `plan.lag`). The report is the tenant's own
word about its own table (anyone who may patch the StreamingTable's status can write it): it moves only
that table's status and its compaction replicas, within its spec's bounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from icefall.api import (
    ConditionReason,
    DestinationStatus,
    FreshnessStatus,
    StreamingTable,
    TableStatus,
    WriterReport,
)
from icefall.api.status import MAX_STATUS_TABLES, REPORTED_PARTITIONS
from icefall.plan.conditions import MAX_MESSAGE, Issue
from icefall.plan.lag import freshness_seconds

MAX_PARTITIONS = REPORTED_PARTITIONS
ANNOTATION_ACKNOWLEDGED_LOSS = "icefall.dev/acknowledged-data-loss"
#: How old the driver's report may be and still count (it reports every ~10 s while it runs; an older one
#: belongs to a driver that stopped).
WRITER_REPORT_MAX_AGE_SECONDS = 60.0


@dataclass(frozen=True)
class TableFacts:
    """What a reader of the table's metadata sees (no manifests, no data): the driver's `TableMeter`."""

    #: Next offset to read per topic and partition, in either form (`CommittedState.by_topic()`: the
    #: one-topic form's under its topic's name).
    offsets_by_topic: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    topic_id: str | None = None  # icefall.topic-id: the topic the offsets belong to (the one-topic form)
    max_produce_time_ms: int | None = None
    lost_records: int = 0
    last_commit_ms: int | None = None  # newest append snapshot
    last_commit_snapshot_id: int | None = None
    data_files: int = 0
    total_file_bytes: int = 0
    records: int = 0
    snapshots: int = 0
    last_compaction_ms: int | None = None  # newest replace snapshot
    last_expiry_ms: int | None = None  # icefall.last-expiry-time-ms, when a maintenance run recorded it
    small_file_ratio: float | None = None
    compaction_backlog: int | None = None


@dataclass(frozen=True)
class Summary:
    freshness: FreshnessStatus | None
    table: TableStatus | None
    data_loss_records: int | None  # None: not reported
    freshness_seconds: float | None
    lag_records: int | None
    last_commit_time: datetime | None
    issues: tuple[Issue, ...] = ()
    unmeasured: str = ""  # why there are no figures ("" when there are)


def recent(
    report: WriterReport | None, now: datetime, max_age: float = WRITER_REPORT_MAX_AGE_SECONDS
) -> bool:
    """`report` is at most `max_age` seconds old (either way: a clock ahead of ours too)."""
    return report is not None and abs((now - report.reported_at).total_seconds()) <= max_age


def summarize(
    report: WriterReport | None,
    now: datetime,
    *,
    acknowledged_loss: int = 0,
    max_age: float = WRITER_REPORT_MAX_AGE_SECONDS,
) -> Summary:
    """Status blocks and observations from the driver's `report` (None: none yet), as the module doc says."""
    lost = report.lost_records if report is not None else None
    when = report.last_loss_time if report is not None else None
    issues = _loss(lost, acknowledged_loss, when) if lost is not None else ()
    if report is None or not recent(report, now, max_age):
        return Summary(None, None, lost, None, None, None, issues, _unmeasured(report, now))
    lag = {p.partition: p.records for p in report.partition_lag}
    freshness = FreshnessStatus(
        seconds=round(report.freshness_seconds, 1),
        lag_records=report.lag_records,
        partition_lag=_most_lagging(lag),
        last_commit_time=report.last_commit_time,
        snapshot_id=report.snapshot_id,
    )
    return Summary(
        freshness=freshness,
        table=report.table,
        data_loss_records=lost,
        freshness_seconds=report.freshness_seconds,
        lag_records=report.lag_records,
        last_commit_time=report.last_commit_time,
        issues=issues,
    )


def _unmeasured(report: WriterReport | None, now: datetime) -> str:
    measured = "measured by the table's driver only (the operator reads no table and no topic itself)"
    if report is None:
        return f"{measured}: it has not reported yet (status.writer)"
    age = abs((now - report.reported_at).total_seconds())
    return (
        f"{measured}: its last report is {age:.0f} s old (status.writer.reportedAt); the figures shown are "
        "from then"
    )


def reported_backlog(
    report: WriterReport | None, now: datetime, max_age: float = WRITER_REPORT_MAX_AGE_SECONDS
) -> int | None:
    """The compaction backlog the driver measured, of every table it writes, from its recent `report`;
    None without one."""
    if report is None or not recent(report, now, max_age):
        return None
    measured = [t.compaction_backlog for t in report.tables if t.compaction_backlog is not None]
    if measured:  # spec.table's entry included
        return sum(measured)
    return report.table.compaction_backlog if report.table is not None else None


# --- per destination (status.tables) -----------------------------------------------------------------------


def destination_status(
    table: str,
    facts: TableFacts,
    *,
    table_uuid: str | None,
    end: Mapping[str, Mapping[int, int]],
    table_offsets: Mapping[str, Mapping[int, int]],
    table_freshness: float | None,
    now_ms: int,
) -> DestinationStatus:
    """A route table's entry, from its `facts` (as the driver's meter read them). `end`: each topic's end
    offsets at the driver's last batch (`topic_ends`); `table_offsets`/`table_freshness`: spec.table's
    committed offsets and freshness then; all by topic, in either form. Lag: the records past its own
    offsets, summed over every (topic, partition) (one it never committed counts from spec.table's, where
    its next batch starts it: `plan.routing.destination_take`). Freshness: spec.table's when it holds at
    least what spec.table holds (both took the same batches), else from the newest record it holds
    (`plan.lag`)."""
    lag, level = 0, True
    for topic in {*end, *table_offsets}:
        ends, ours = end.get(topic, {}), table_offsets.get(topic, {})
        held = facts.offsets_by_topic.get(topic, {})
        position = {p: held.get(p, ours.get(p, 0)) for p in {*ends, *ours}}
        lag += sum(max(ends.get(p, 0) - position[p], 0) for p in position)
        level = level and all(position[p] >= offset for p, offset in ours.items())
    fresh = table_freshness if level else freshness_seconds(lag, facts.max_produce_time_ms, now_ms / 1000)
    return DestinationStatus(
        table=table,
        lag_records=lag,
        freshness_seconds=None if fresh is None else round(fresh, 1),
        last_commit_time=_time(facts.last_commit_ms),
        snapshot_id=facts.last_commit_snapshot_id,
        compaction_backlog=facts.compaction_backlog,
        table_uuid=table_uuid,
    )


def topic_ends(
    offsets: Mapping[str, Mapping[int, int]], lag: Mapping[str, Mapping[int, int]]
) -> dict[str, dict[int, int]]:
    """Each topic's end offsets by partition, from the offsets a batch committed and the lag left past
    them (a negative lag, offsets past a truncated topic's end, counts as none)."""
    return {
        topic: {p: o + max(lag.get(topic, {}).get(p, 0), 0) for p, o in by_partition.items()}
        for topic, by_partition in offsets.items()
    }


def bounded_tables(
    entries: Sequence[DestinationStatus], limit: int = MAX_STATUS_TABLES
) -> list[DestinationStatus]:
    """At most `limit` of `entries` (spec.table's first): the first, then the most lagging (an unmeasured
    lag counts as none), in their given order."""
    if len(entries) <= limit:
        return list(entries)
    rest = sorted(range(1, len(entries)), key=lambda i: (-(entries[i].lag_records or 0), i))
    keep = {0, *rest[: limit - 1]}
    return [entry for i, entry in enumerate(entries) if i in keep]


def status_tables(
    st: StreamingTable,
    report: WriterReport | None,
    previous: Sequence[DestinationStatus],
    now: datetime,
    max_age: float = WRITER_REPORT_MAX_AGE_SECONDS,
) -> list[DestinationStatus]:
    """`status.tables` (module doc): the recent report's, else the `previous` list, else the spec's
    destinations without figures."""
    if report is not None and report.tables and recent(report, now, max_age):
        return list(report.tables)
    if previous:
        return list(previous)
    return bounded_tables([DestinationStatus(table=".".join(i)) for i in st.destination_identifiers])


def table_count(st: StreamingTable, report: WriterReport | None) -> int:
    """`status.tableCount`: the tables the spec names (spec.table, each route's) and the tables its dynamic
    route made, as the last `report` counted them (none before one)."""
    made = report.dynamic_tables if report is not None and st.spec.dynamic_route is not None else None
    return len(st.destination_identifiers) + (made or 0)


#: The services a driver waits out (`WriterReport.waiting_for`), as the issues they are.
_WAITED_OUT = {
    "kafka": (ConditionReason.KAFKA_UNAVAILABLE, "Kafka"),
    "catalog": (ConditionReason.CATALOG_UNAVAILABLE, "the catalog"),
    "object_store": (ConditionReason.CATALOG_UNAVAILABLE, "the object store"),
    # The commit Lease cannot be renewed: no commit until it can. Seen once the server answers again and
    # the driver is still in its backoff (while it is down, no report gets through).
    "kube_apiserver": (ConditionReason.WAITING_FOR_LEASE, "the Kubernetes API server (its commit Lease)"),
}


def writer_issues(
    report: WriterReport | None, now: datetime, max_age: float = WRITER_REPORT_MAX_AGE_SECONDS
) -> list[Issue]:
    """The problems a recent driver report names: a service it waits out (Kafka, the catalog, the object
    store, the schema registry), and schema changes the table cannot follow."""
    if report is None or not recent(report, now, max_age):
        return []
    issues = []
    if report.waiting_for == "registry":
        issues.append(
            Issue(
                ConditionReason.REGISTRY_UNAVAILABLE,
                "the driver cannot reach the schema registry (spec.format.registry.url) and waits for it; "
                "records stay in Kafka until it answers",
            )
        )
    elif report.waiting_for == "local_disk":
        issues.append(
            Issue(
                ConditionReason.LOCAL_DISK_FULL,
                "the driver's local disk (Spark's local dirs: shuffle and spill files) is full and it waits "
                "for space; nothing is lost, ingestion goes on when space is freed (its log names the dir)",
            )
        )
    elif report.waiting_for == "clock":
        issues.append(
            Issue(
                ConditionReason.CLOCK_BEHIND,
                "the driver's clock is over a minute behind the table's last update (Iceberg Java refuses "
                "metadata stamped earlier); it waits until its clock passes it; fix the node's clock (NTP)",
            )
        )
    elif report.waiting_for == "executors":
        issues.append(
            Issue(
                ConditionReason.EXECUTORS_LOST,
                "the driver lost its Spark executors (no heartbeat within spark.network.timeout: a network "
                "partition between them, or their nodes stalled) and reads the batch again once executors "
                "answer; nothing is lost; check the network between the driver and executor pods",
            )
        )
    elif report.waiting_for in _WAITED_OUT:
        reason, service = _WAITED_OUT[report.waiting_for]
        text = f"the driver cannot reach {service} and waits for it; ingestion goes on when it answers"
        issues.append(Issue(reason, text))
    if report.schema_refused:
        message = "the table cannot follow the records' schema: " + "; ".join(report.schema_refused)
        issues.append(Issue(ConditionReason.SCHEMA_CHANGE_REFUSED, message[:MAX_MESSAGE]))
    return issues


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def table_status(facts: TableFacts) -> TableStatus:
    files = facts.data_files
    return TableStatus(
        files=files,
        avg_file_size_bytes=facts.total_file_bytes // files if files else 0,
        snapshots=facts.snapshots,
        records=facts.records,
        small_file_ratio=facts.small_file_ratio,
        compaction_backlog=facts.compaction_backlog,
        last_compaction_time=_time(facts.last_compaction_ms),
        last_expiry_time=_time(facts.last_expiry_ms),
    )


def _loss(lost: int, acknowledged: int, last: datetime | None = None) -> tuple[Issue, ...]:
    if lost <= acknowledged:
        return ()
    when = f", the last at {last.isoformat(timespec='seconds')}" if last is not None else ""
    return (
        Issue(
            ConditionReason.DATA_LOSS,
            f"{lost} records were deleted by Kafka retention before they were ingested (table property "
            f"icefall.lost-records{when}); the table does not hold them. Raise the topic's retention, or "
            f"set spec.source.onDataLoss: Halt to stop instead of skipping. To acknowledge, annotate the "
            f"StreamingTable {ANNOTATION_ACKNOWLEDGED_LOSS}={lost}",
        ),
    )


def _most_lagging(lag: Mapping[int, int]) -> dict[int, int]:
    if len(lag) <= MAX_PARTITIONS:
        return dict(lag)
    top = sorted(lag, key=lambda p: (-lag[p], p))[:MAX_PARTITIONS]
    return {p: lag[p] for p in sorted(top)}


def acknowledged_loss(annotations: Mapping[str, str]) -> int:
    """The data-loss count a user acknowledged (0 when absent or not a non-negative integer)."""
    text = annotations.get(ANNOTATION_ACKNOWLEDGED_LOSS, "")
    return int(text) if text.strip().isdigit() else 0
