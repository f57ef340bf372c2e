"""`icefall verify` and `icefall read` for the tables a dynamic route creates: the pure parts.

Proves: each name the records compute has one fate, with the writer's own reason texts (the same
`icefall.plan.routing.dynamic_names` gives a batch): a name that is not an identifier or names another table
of the StreamingTable is always a dead letter; a created table's name goes to it from its start offsets on
and is a dead letter past `maxTables` before them; a table the route did not create is a dead letter saying
so until `maxTables` created tables existed (`cap_full_from`, per partition), past the cap after; a created
table none of whose audited records goes to it fails the report naming it, one never committed is only a
note; the report and its JSON carry both; `read --table` accepts a table the dynamic route created and names
the created tables among the choices.
Not proved here: computing names from real records and auditing real tables
(tests/integration/test_routes_audit.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from icefall.api import StreamingTable
from icefall.audit import AuditReport, PartitionAudit
from icefall.audit.dynamic import DynamicTable, NameFate, cap_full_from, name_fates
from icefall.audit.report import report_json
from icefall.audit.routed import DestinationAudit, RoutedAuditReport, unexplained
from icefall.ingest.union_read import ReadError, read_identifier
from icefall.plan.routing import dynamic_names, not_created_reason

pytestmark = pytest.mark.unit

RESERVED = {"events": "spec.table", "events_dlq": "the dead-letter table"}
TABLES = (DynamicTable("e_a", 2, {0: 10, 1: 4}), DynamicTable("e_b", 3, {0: 30}))


def st() -> StreamingTable:
    spec = {
        "source": {"topic": "events", "bootstrapServers": "k:9092"},
        "format": {"schema": [{"name": "kind", "type": "string"}]},
        "table": {"namespace": "shop", "name": "events"},
        "dynamicRoute": {"from": "Field", "name": "kind", "nameTemplate": "e_{value}", "maxTables": 2},
    }
    return StreamingTable.model_validate({"metadata": {"name": "events"}, "spec": spec})


def test_each_name_has_one_fate_with_the_writers_reason() -> None:
    fates = {
        f.name: f
        for f in name_fates(
            ["e_a", "e_b", "e_c", "e_x", "bad-name", "events", "e_a"], TABLES, {"e_x"}, RESERVED, max_tables=2
        )
    }
    assert sorted(fates) == ["bad-name", "e_a", "e_b", "e_c", "e_x", "events"]
    # A batch of a writer with both tables made refuses the same names with the same texts.
    writer = dynamic_names(["bad-name", "events", "e_c"], ["e_a", "e_b"], RESERVED, max_tables=2).refused
    for name in ("bad-name", "events", "e_c"):
        assert fates[name] == NameFate(name, writer[name]), name
    assert "would be table 3, past maxTables 2" in fates["e_c"].refused
    a = fates["e_a"]
    assert (a.table, a.since, a.unowned) == (2, {0: 10, 1: 4}, None)
    assert a.refused == writer["e_c"].replace("'e_c'", "'e_a'")  # before its creation: past the cap
    x = fates["e_x"]
    assert x.table is None and x.unowned == not_created_reason("e_x") and x.refused.endswith("maxTables 2")
    assert "is a table the route did not create" in x.unowned


def test_the_cap_is_full_from_the_offset_the_last_allowed_table_started_at() -> None:
    assert cap_full_from(TABLES, 2) == {0: 30}  # partition 1: only one table ever started there
    assert cap_full_from(TABLES, 1) == {0: 10, 1: 4}
    assert cap_full_from(TABLES, 3) == {}


def partition(start: int, committed: int, low: int | None = 0) -> PartitionAudit:
    return PartitionAudit(
        partition=0, start=start, committed=committed, low_watermark=low, high_watermark=committed,
        expected=committed - start, in_table=committed - start, in_dlq=0, in_table_and_dlq=0, duplicates=0,
        duplicate_rows=0, missing=0, filtered=0, unexpected=0, lost_to_retention=0, unverified=0,
    )  # fmt: skip


def destination(name: str, *partitions: PartitionAudit) -> DestinationAudit:
    report = AuditReport(
        table=f"shop.{name}", dlq_table=None, topic="events", snapshot_id=7, filter_configured=False,
        ingesting=False, partitions=partitions, content_checked=True,
    )  # fmt: skip
    return DestinationAudit(f"dynamicRoute:{name}", report)


def test_a_created_table_no_record_goes_to_fails_the_report_and_one_never_committed_is_a_note() -> None:
    made = [DynamicTable("e_a", 1, {0: 10}), DynamicTable("e_b", 2, {0: 10}), DynamicTable("e_c", 3, {})]
    audits = [
        destination("e_a", partition(10, 20)),
        destination("e_b", partition(10, 20)),
        destination("e_c"),
    ]
    asked: list[tuple[int, Mapping[int, tuple[int, int]], str | None]] = []

    def taken(index: int, ranges: Mapping[int, tuple[int, int]], topic: str | None) -> int:
        asked.append((index, ranges, topic))
        return 5 if index == 1 else 0

    problems, notes = unexplained(taken, audits, made)
    assert asked == [(1, {0: (10, 20)}, None), (2, {0: (10, 20)}, None)]
    assert len(problems) == 1 and problems[0].startswith("shop.e_b has icefall.dynamic-route-of")
    assert "computes the name 'e_b'" in problems[0]
    assert len(notes) == 1 and notes[0].startswith("shop.e_c ")
    report = RoutedAuditReport(tuple(audits), problems, notes)
    assert not report.ok and all(a.report.ok for a in audits)
    text = report.render()
    assert f"[dynamicRoute] {problems[0]}" in text and f"[dynamicRoute] {notes[0]}" in text
    assert text.endswith("routed table, 3 destinations: FAILED: dynamicRoute")
    data = report_json(report)
    assert (data["ok"], data["problems"], data["notes"]) == (False, list(problems), list(notes))
    assert RoutedAuditReport(tuple(audits), (), notes).ok  # a note alone does not fail
    # Records Kafka no longer holds (below its low watermark) cannot explain a table either way.
    assert unexplained(taken, [destination("e_b", partition(10, 20, low=25))], made[1:2])[0] == ()


def test_a_created_table_of_several_topics_is_explained_by_the_records_of_any_topic() -> None:
    from dataclasses import replace

    made = [DynamicTable("e_a", 1, {}, {"eu": {0: 10}, "us": {0: 3, 1: 0}})]
    assert made[0].of_topic("us").since == {0: 3, 1: 0} and made[0].of_topic("asia").since == {}
    ranges = (replace(partition(10, 20), topic="eu"), replace(partition(3, 9), topic="us"))
    asked: list[tuple[Mapping[int, tuple[int, int]], str | None]] = []

    def taken(index: int, ranges: Mapping[int, tuple[int, int]], topic: str | None) -> int:
        asked.append((ranges, topic))
        return 2 if topic == "us" else 0

    assert unexplained(taken, [destination("e_a", *ranges)], made) == ((), ())
    assert asked == [({0: (10, 20)}, "eu"), ({0: (3, 9)}, "us")]
    problems, _ = unexplained(lambda *_: 0, [destination("e_a", *ranges)], made)
    assert "{'eu/0': (10, 20), 'us/0': (3, 9)}" in problems[0]


def test_read_table_is_also_a_table_the_dynamic_route_created() -> None:
    table = st()
    made = [("shop", "e_a"), ("shop", "e_b")]
    assert read_identifier(table, "shop.e_b", made) == ("shop", "e_b")
    assert read_identifier(table, "shop.events", made) == ("shop", "events")
    with pytest.raises(ReadError, match=r"choose one of shop.events, shop.e_a, shop.e_b$"):
        read_identifier(table, "shop.e_c", made)
