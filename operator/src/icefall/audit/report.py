"""What an audit found: `PartitionAudit` per partition, `AuditReport` for the table (`render` prints it,
`report_json` gives it as data)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from pydantic.alias_generators import to_camel


@dataclass(frozen=True)
class PartitionAudit:
    """The audit of one partition. Counts are offsets, except `in_table`, `in_dlq`, `duplicate_rows`
    and `before_reset`, which count rows."""

    partition: int
    start: int  # first offset of the audited range (where ingestion started, or the last offset reset)
    committed: int  # the committed next offset: the range's end
    low_watermark: int | None  # Kafka's earliest offset held; None if Kafka has no such partition
    high_watermark: int | None
    expected: int  # records Kafka holds in [max(start, low), committed)
    in_table: int  # rows of this partition in the main table (all of them)
    in_dlq: int  # rows of this partition in the dead-letter table
    # Offsets in both: by content, the row its record does not make is `wrong` (a spec changed between a
    # crash and the retry puts a record in both); by offsets only, each also counts as a duplicate.
    in_table_and_dlq: int
    duplicates: int  # offsets one table holds more than once (and, by offsets only, those in both)
    duplicate_rows: int  # rows beyond the first for each such offset
    missing: int  # in Kafka, in neither table, and not dropped by the spec's filter
    filtered: int  # in Kafka, in neither table, and dropped by the spec's filter (re-evaluated)
    unexpected: int  # offsets in a table outside the range, or inside it but not in Kafka
    lost_to_retention: int  # offsets in [start, low): deleted by Kafka, cannot be compared
    unverified: int  # offsets in a table inside [start, low): counted, not compared
    dlq_ahead: int = 0  # DLQ rows at or past the committed end (unexpected unless `ingesting`)
    duplicate_examples: tuple[int, ...] = ()
    missing_examples: tuple[int, ...] = ()  # missing, or with a filter configured, filtered offsets
    unexpected_examples: tuple[int, ...] = ()
    # Offsets whose rows are not what their Kafka record decodes to (by content audits only): a changed
    # value, a row in the table for a record that is a dead letter or filtered out, or the reverse.
    wrong: int = 0
    wrong_examples: tuple[int, ...] = ()
    dead_letters_elsewhere: int = 0  # dead letters with no dead-letter table (sent to the topic, or none)
    before_reset: int = 0  # rows committed before the last offset reset: of the old topic, not audited
    absent_below_low: int = 0  # offsets in [start, low) in neither table (lost-records cross-check)
    # A routed table (`icefall.audit.routed`): rows of records another destination takes, and how many
    # records of the range another destination takes.
    wrong_table: int = 0
    wrong_table_examples: tuple[int, ...] = ()
    routed_elsewhere: int = 0
    topic: str | None = None  # a table of several topics: the partition's topic

    @property
    def name(self) -> str:
        """`<partition>`, or `<topic>/<partition>` in a table of several topics."""
        return str(self.partition) if self.topic is None else f"{self.topic}/{self.partition}"

    @property
    def ok(self) -> bool:
        problems = (self.duplicates, self.unexpected, self.missing, self.wrong, self.wrong_table)
        return not any(problems)

    @property
    def result(self) -> str:
        """A few words for the report's last column."""
        problems = [
            f"{n} {what}"
            for n, what in (
                (self.duplicates, "duplicated"),
                (self.missing, "missing"),
                (self.unexpected, "unexpected"),
                (self.wrong, "wrong"),
                (self.wrong_table, "in the wrong table"),
            )
            if n
        ]
        notes = [
            f"{n} {what}"
            for n, what in (
                (self.filtered, "filtered"),
                (self.lost_to_retention, "lost to retention"),
                (self.before_reset, "rows before the offset reset"),
                (self.dead_letters_elsewhere, "dead letters not in a table"),
                (self.routed_elsewhere, "routed elsewhere"),
            )
            if n
        ]
        if problems:
            return "FAIL: " + ", ".join(problems + notes)
        return "ok" + (f" ({', '.join(notes)})" if notes else "")


@dataclass(frozen=True)
class AuditReport:
    table: str
    dlq_table: str | None
    topic: str | None  # the table's icefall.topic (several topics: their names, comma-separated)
    snapshot_id: int | None  # main's head the audit read
    filter_configured: bool
    ingesting: bool
    partitions: tuple[PartitionAudit, ...]
    rows_without_offset: int = 0  # rows whose partition or offset is null (in either table)
    # Why the table cannot be compared with the topic at all (it was recreated): a failed audit.
    source_changed: str | None = None
    content_checked: bool = False  # rows compared with their records by content, not only by offset
    lost_records: int = 0  # the table's `icefall.lost-records`
    lost_records_problem: str | None = None  # the cross-check of `lost_records` failed: why
    reset_note: str | None = None  # how rows from before the last offset reset were told apart

    @property
    def ok(self) -> bool:
        return (
            self.source_changed is None
            and self.lost_records_problem is None
            and self.rows_without_offset == 0
            and all(p.ok for p in self.partitions)
        )

    @property
    def wrong(self) -> int:
        return sum(p.wrong for p in self.partitions)

    @property
    def wrong_table(self) -> int:
        return sum(p.wrong_table for p in self.partitions)

    @property
    def duplicates(self) -> int:
        return sum(p.duplicates for p in self.partitions)

    @property
    def missing(self) -> int:
        return sum(p.missing for p in self.partitions)

    @property
    def filtered(self) -> int:
        return sum(p.filtered for p in self.partitions)

    @property
    def unexpected(self) -> int:
        return sum(p.unexpected for p in self.partitions)

    def partition(self, partition: int, topic: str | None = None) -> PartitionAudit:
        for audit in self.partitions:
            if audit.partition == partition and audit.topic == topic:
                return audit
        raise KeyError(partition)

    def render(self) -> str:
        """A short human-readable report: one line per partition, then examples of what went wrong."""
        dlq = f" + {self.dlq_table}" if self.dlq_table else " (no DLQ table)"
        how = "by content" if self.content_checked else "by offset only"
        lines = [
            f"{self.table}{dlq} vs topic {self.topic or '?'} at snapshot {self.snapshot_id}, {how}: "
            + ("OK" if self.ok else "FAILED")
        ]
        header = ("partition", "committed", "kafka", "table", "dlq", "dup", "missing", "result")
        rows = [
            (
                p.name,
                str(p.committed),
                str(p.expected),
                str(p.in_table),
                str(p.in_dlq),
                str(p.duplicates),
                str(p.missing),
                p.result,
            )
            for p in self.partitions
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
        for row in [header, *rows]:
            cells = [cell.rjust(width) for cell, width in zip(row[:-1], widths, strict=True)]
            lines.append("  ".join([*cells, row[-1]]))
        for p in self.partitions:
            for what, examples in (
                ("duplicated offsets", p.duplicate_examples),
                (
                    "filtered offsets"
                    if self.filter_configured and not self.content_checked
                    else "missing offsets",
                    p.missing_examples,
                ),
                ("unexpected offsets", p.unexpected_examples),
                ("wrong rows (content differs from the Kafka record) at offsets", p.wrong_examples),
                ("rows of records another destination takes, at offsets", p.wrong_table_examples),
            ):
                if examples:
                    lines.append(f"partition {p.name}: {what} {', '.join(map(str, examples))}")
            if self.ingesting and p.dlq_ahead:
                lines.append(
                    f"partition {p.name}: {p.dlq_ahead} dead-letter rows past the committed end "
                    "(a batch whose main commit has not landed)"
                )
        if self.rows_without_offset:
            lines.append(f"{self.rows_without_offset} rows have no Kafka partition or offset")
        if self.lost_records:
            lines.append(
                f"icefall.lost-records: {self.lost_records} records deleted by retention before ingestion"
            )
        if self.lost_records_problem:
            lines.append(self.lost_records_problem)
        if self.reset_note:
            lines.append(self.reset_note)
        if self.source_changed:
            lines.append(self.source_changed)
        return "\n".join(lines)


def report_json(report: Any) -> dict[str, Any]:
    """An audit report (`AuditReport`, `audit.keyed.KeyedAuditReport`, `audit.routed.RoutedAuditReport`: a
    list of `destinations`, each with its report) as JSON-ready data: its fields
    in camelCase, each partition with its own `ok`, and `ok` on top, as `icefall verify --output json`
    prints it."""
    destinations = getattr(report, "destinations", None)
    if destinations is not None:  # a routed table (`icefall.audit.routed`): each destination's report
        each = [{"destination": d.destination, **report_json(d.report)} for d in destinations]
        notes = {"problems": list(report.problems), "notes": list(report.notes)}
        return {"ok": bool(report.ok), "destinations": each, **notes}
    data: dict[str, Any] = {"ok": bool(report.ok), **_plain(report)}
    for partition, audit in zip(data.get("partitions", ()), getattr(report, "partitions", ()), strict=True):
        partition["ok"] = audit.ok
    return data


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {to_camel(f.name): _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
