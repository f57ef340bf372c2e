"""Freshness, lag, table figures and data-loss issues from what the table and Kafka say. Pure.

Inputs are plain facts the act layer read (`TableFacts` from the table's metadata, the topic's watermarks
from Kafka); the clock is an argument. `summarize` turns them into the status blocks (`FreshnessStatus`,
`TableStatus`, `dataLossRecords`) and the figures and issues `plan.conditions.Observations` takes.

Rules:
- Lag and freshness are `plan.lag`'s (lag per partition from the watermarks and the table's committed
  offsets; freshness from the lag and the produce time of the oldest waiting record when the act layer
  read it, else `icefall.max-produce-time-ms`; unmeasured while nothing was committed). The status map
  lists the `MAX_PARTITIONS` most lagging partitions. Without the watermarks (Kafka could not be read)
  there is no freshness block at all: "caught up" and "stalled" look the same, so the previous figures
  stay and a condition says why.
- A topic id other than the one the table's offsets belong to (`icefall.topic-id`: the topic was deleted
  and created again) is a `TopicRecreated` issue; ingestion stops until `icefall reset-offsets`.
- A committed offset above the high watermark (the topic was deleted and recreated, or truncated) is an
  `OffsetsAheadOfTopic` issue naming the partitions; that partition counts as lag 0.
- `icefall.lost-records` above the acknowledged count (annotation `icefall.dev/acknowledged-data-loss`) is a
  `DataLoss` issue: the table permanently misses those records; acknowledging the count clears it until
  more are lost.
- The driver reports the table's count too (`status.writer.lostRecords`, `lastLossTime`: from its own
  commits and its table meter's readings, `icefall.ingest.writer_status`): an operator that cannot read
  the table (no credentials) takes it from there (`with_writer_loss`, the one place a reported loss enters
  the summary), so the loss is shown and alerted on without the table's credentials; when both are known
  the larger wins (neither count ever goes down).
- The last ingestion commit is the newest `append` snapshot, and only once offsets were committed (the
  genesis snapshot of an empty table is not a commit of records).
- The operator holds no table credential and lends none of its own: a table that references one, or
  whose catalog or files its clients would reach with the operator's own identity (a REST catalog, an
  object store: `not_read_by_operator`), is never read by the operator, only by its own pods. When the
  operator could measure neither lag nor freshness itself (such a table, not read yet, or unreachable
  from the operator), the driver's own report
  (`status.writer`, at most `WRITER_REPORT_MAX_AGE_SECONDS` old) stands in for them, and for the table's
  figures and compaction backlog (`with_writer_report`, `reported_backlog`): a running driver always makes
  the table measured.

Not guaranteed: that the facts are current (they are as old as the read), or that freshness is exact for
records produced with timestamps from a skewed producer clock (the produce time is the producer's or the
broker's, per the topic's `message.timestamp.type`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from icefall.api import (
    CatalogType,
    ConditionReason,
    FreshnessStatus,
    StreamingTableSpec,
    TableStatus,
    WriterReport,
)
from icefall.plan.conditions import MAX_MESSAGE, Issue
from icefall.plan.env import credential_references
from icefall.plan.lag import freshness_seconds, partition_lag, partitions_ahead
from icefall.plan.offsets import RESET_COMMAND

MAX_PARTITIONS = 20
ANNOTATION_ACKNOWLEDGED_LOSS = "icefall.dev/acknowledged-data-loss"


@dataclass(frozen=True)
class TableFacts:
    """What the operator read from the table's metadata (no manifests, no data)."""

    committed_offsets: Mapping[int, int] = field(default_factory=dict)
    topic_id: str | None = None  # icefall.topic-id: the topic the offsets belong to
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
    data_loss_records: int | None  # None: the table could not be read
    freshness_seconds: float | None
    lag_records: int | None
    last_commit_time: datetime | None
    issues: tuple[Issue, ...] = ()


#: How old the driver's report may be and still stand in for the operator's own reading (it reports every
#: ~10 s while it runs; an older one belongs to a driver that stopped).
WRITER_REPORT_MAX_AGE_SECONDS = 60.0


def with_writer_report(
    summary: Summary,
    report: WriterReport | None,
    now: datetime,
    max_age: float = WRITER_REPORT_MAX_AGE_SECONDS,
) -> Summary | None:
    """`summary` with what the driver's recent `report` measured where the summary has nothing: lag and
    freshness when it has neither, the table's figures when the operator did not read the table; None
    when the report fills in nothing. (Its data-loss count: `with_writer_loss`.)"""
    if report is None or abs((now - report.reported_at).total_seconds()) > max_age:
        return None
    filled = summary
    if summary.freshness_seconds is None and summary.lag_records is None:
        freshness = FreshnessStatus(
            seconds=round(report.freshness_seconds, 1),
            lag_records=report.lag_records,
            last_commit_time=report.last_commit_time,
            snapshot_id=report.snapshot_id,
        )
        filled = replace(
            filled,
            freshness=freshness,
            freshness_seconds=report.freshness_seconds,
            lag_records=report.lag_records,
            last_commit_time=report.last_commit_time,
        )
    if summary.table is None and report.table is not None:
        filled = replace(filled, table=report.table)
    return None if filled is summary else filled


def reported_backlog(
    report: WriterReport | None, now: datetime, max_age: float = WRITER_REPORT_MAX_AGE_SECONDS
) -> int | None:
    """The compaction backlog the driver measured, from its recent `report`; None without one."""
    if report is None or report.table is None or abs((now - report.reported_at).total_seconds()) > max_age:
        return None
    return report.table.compaction_backlog


#: The services a driver waits out (`WriterReport.waiting_for`) whose outage the operator reports itself
#: when it reads the table and the topic, and from the driver's report when it does not.
_WAITED_OUT = {
    "kafka": (ConditionReason.KAFKA_UNAVAILABLE, "Kafka"),
    "catalog": (ConditionReason.CATALOG_UNAVAILABLE, "the catalog"),
    "object_store": (ConditionReason.CATALOG_UNAVAILABLE, "the object store"),
}


def with_writer_loss(summary: Summary, report: WriterReport | None, *, acknowledged: int = 0) -> Summary:
    """`summary` with the driver's count of records lost to retention (`report.lost_records`), and its
    DataLoss issue, when it is more than what the operator read itself (module doc)."""
    reported = report.lost_records if report is not None else None
    if reported is None or reported <= (summary.data_loss_records or 0):
        return summary
    kept = tuple(issue for issue in summary.issues if issue.reason is not ConditionReason.DATA_LOSS)
    when = report.last_loss_time if report is not None else None
    return replace(summary, data_loss_records=reported, issues=kept + _loss(reported, acknowledged, when))


def writer_issues(
    report: WriterReport | None,
    now: datetime,
    max_age: float = WRITER_REPORT_MAX_AGE_SECONDS,
    *,
    operator_reads: bool = True,
) -> list[Issue]:
    """The problems a recent driver report names: schema changes the table cannot follow, and a schema
    registry it cannot reach; also Kafka, the catalog or the object store when the operator does not
    read the table itself (`operator_reads` False), else its own probes say so."""
    if report is None or abs((now - report.reported_at).total_seconds()) > max_age:
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
    elif not operator_reads and report.waiting_for in _WAITED_OUT:
        reason, service = _WAITED_OUT[report.waiting_for]
        text = f"the driver cannot reach {service} and waits for it; ingestion goes on when it answers"
        issues.append(Issue(reason, text))
    if report.schema_refused:
        message = "the table cannot follow the records' schema: " + "; ".join(report.schema_refused)
        issues.append(Issue(ConditionReason.SCHEMA_CHANGE_REFUSED, message[:MAX_MESSAGE]))
    return issues


#: Where a catalog's clients reach storage with whatever identity the reading process has (a cloud
#: identity, an SDK's default chain): object-store locations and the properties that configure them.
_OBJECT_STORE_SCHEMES = ("s3", "s3a", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs")
_AMBIENT_PREFIXES = ("s3.", "gcs.", "adls.", "client.", "rest.", "glue.", "dynamodb.")


def not_read_by_operator(spec: StreamingTableSpec) -> str:
    """Why the operator does not read this table and its topic itself; empty when it does. It never uses a
    credential for a table: not one the table references (any `secretKeyRef` or `{env: NAME}`), nor one
    of its own the clients would pick up by default (its cloud identity, for an object store or a REST
    catalog, whose tables may live anywhere). Such a table is measured by its own driver."""
    paths = [path for path, _ in credential_references(spec)]
    then = "its figures appear once the driver reports them (status.writer)"
    if paths:
        return (
            f"measured by the table's driver only: the table references credentials ({', '.join(paths)}) "
            f"and the operator holds none; {then}"
        )
    catalog = spec.table.catalog
    if catalog is None:
        return ""
    scheme = (catalog.warehouse or "").partition("://")[0].lower()
    ambient = (
        catalog.type is CatalogType.REST
        or scheme in _OBJECT_STORE_SCHEMES
        or any(key.startswith(_AMBIENT_PREFIXES) for key in catalog.properties)
    )
    if not ambient:
        return ""
    return (
        "measured by the table's driver only: its catalog or files are reached with the reader's own "
        f"identity (a REST catalog, an object store), and the operator lends none of its own; {then}"
    )


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


def summarize(
    facts: TableFacts | None,
    watermarks: Mapping[int, tuple[int, int]] | None,
    now: datetime,
    *,
    acknowledged_loss: int = 0,
    topic_id: str | None = None,
    oldest_waiting_ms: int | None = None,
) -> Summary:
    """Status blocks and observations from `facts` (None: table not read) and `watermarks` (None: Kafka
    not read), as the module docstring says."""
    committed = facts.committed_offsets if facts is not None else {}
    issues, lag_map = _source_issues(facts, watermarks, topic_id)
    if facts is None:
        # Without the table, lag would count everything as waiting: report nothing rather than a guess.
        return Summary(None, None, None, None, None, None, tuple(issues))
    if watermarks is None:
        # Without Kafka, lag and freshness are unknown: keep the table figures, leave freshness alone.
        return Summary(
            None,
            table_status(facts),
            facts.lost_records,
            None,
            None,
            None,
            tuple(issues) + _loss(facts.lost_records, acknowledged_loss),
        )
    issues += _loss(facts.lost_records, acknowledged_loss)
    total = sum(lag_map.values()) if lag_map is not None else None
    last_commit = _time(facts.last_commit_ms) if committed else None
    seconds: float | None = None
    if total is not None:
        newest = facts.max_produce_time_ms if committed else None
        seconds = freshness_seconds(total, newest, now.timestamp(), oldest_waiting_ms=oldest_waiting_ms)
    freshness = FreshnessStatus(
        seconds=None if seconds is None else round(seconds, 1),
        lag_records=total or 0,
        partition_lag=_most_lagging(lag_map or {}),
        last_commit_time=last_commit,
        snapshot_id=facts.last_commit_snapshot_id if committed else None,
    )
    return Summary(
        freshness=freshness,
        table=table_status(facts),
        data_loss_records=facts.lost_records,
        freshness_seconds=seconds,
        lag_records=total,
        last_commit_time=last_commit,
        issues=tuple(issues),
    )


def _source_issues(
    facts: TableFacts | None, watermarks: Mapping[int, tuple[int, int]] | None, topic_id: str | None
) -> tuple[list[Issue], dict[int, int] | None]:
    """A recreated topic or offsets past the topic's end (issues), else the lag per partition (None: Kafka
    not read, or the topic was recreated)."""
    committed = facts.committed_offsets if facts is not None else {}
    recreated = facts is not None and None not in (facts.topic_id, topic_id) and facts.topic_id != topic_id
    if recreated:
        return [
            Issue(
                ConditionReason.TOPIC_RECREATED,
                f"the topic was deleted and created again (the table's offsets belong to topic id "
                f"{facts.topic_id if facts else None}, the topic's id is now {topic_id}); ingestion stopped "
                f"and skipped nothing. To go on with the new topic, run `{RESET_COMMAND} -f <manifest>`",
            )
        ], None
    if watermarks is None:
        return [], None
    lag_map, ahead = partition_lag(committed, watermarks), partitions_ahead(committed, watermarks)
    if not ahead:
        return [], lag_map
    detail = ", ".join(f"{p} (committed {committed[p]}, high {watermarks[p][1]})" for p in ahead)
    return [
        Issue(
            ConditionReason.OFFSETS_AHEAD_OF_TOPIC,
            f"the table's committed offsets are past the topic's end in partition(s) {detail}: "
            "the topic was recreated or truncated; ingestion stopped and skipped nothing. To go "
            f"on from the topic's current records, run `{RESET_COMMAND} -f <manifest>`",
        )
    ], lag_map


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
