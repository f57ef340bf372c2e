"""Per-destination status and maintenance of a routed StreamingTable (pure parts, fake clocks).

Proves: each destination's lag counts from its own committed offsets (a partition it never committed from
spec.table's), its freshness is spec.table's while it holds as much, else from its own newest record;
`status.tables` is bounded (spec.table kept, then the most lagging), follows a recent report, keeps the
previous list without one and lists the spec's destinations before any; `tableCount` counts them all;
compaction is scaled on every destination's backlog; each route table has Leases of its own identity, which
the operator creates (no commit Lease) and the compaction Role names; the purge Job names each route
table's recorded uuid; the compaction pods take the tables in turn and one table's failure does not stop
the others.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from icefall.api import DestinationStatus, StreamingTable, StreamingTableStatus, WriterReport
from icefall.api.routes import MAX_ROUTES
from icefall.api.status import MAX_STATUS_TABLES
from icefall.commit.state import CommittedState, TopicState
from icefall.compact.runner import MaintenanceRunner, StepResult, TablesRunner
from icefall.plan.lease_objects import lease_children
from icefall.plan.metadata import ChildMeta
from icefall.plan.names import destination_leases, table_leases
from icefall.plan.purge import purge_command, route_table_uuids
from icefall.plan.rbac import compaction_rules
from icefall.plan.table_status import (
    TableFacts,
    bounded_tables,
    destination_status,
    reported_backlog,
    status_tables,
    topic_ends,
)

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)


def st(status: dict[str, Any] | None = None) -> StreamingTable:
    return StreamingTable.model_validate(
        {
            "metadata": {"name": "events"},
            "spec": {
                "source": {"topic": "events", "bootstrapServers": "k:9092"},
                "format": {"schema": [{"name": "kind", "type": "string"}]},
                "table": {"namespace": "shop", "name": "events"},
                "routes": [
                    {"table": {"name": "clicks"}, "when": "kind = 'click'"},
                    {"table": {"name": "views", "namespace": "web"}, "when": "kind = 'view'"},
                ],
            },
            **({"status": status} if status is not None else {}),
        }
    )


def test_a_destination_lags_from_its_own_offsets_and_is_as_fresh_as_the_table_when_level() -> None:
    end, table = {"events": {0: 10, 1: 4}}, {"events": {0: 8, 1: 4}}
    level = destination_status(
        "shop.clicks",
        TableFacts(offsets_by_topic={"events": {0: 8, 1: 4}}, max_produce_time_ms=NOW_MS - 999_000),
        table_uuid="u", end=end, table_offsets=table, table_freshness=3.0, now_ms=NOW_MS,
    )  # fmt: skip
    assert (level.lag_records, level.freshness_seconds, level.table_uuid) == (2, 3.0, "u")
    behind = destination_status(
        "web.views", TableFacts(offsets_by_topic={"events": {0: 5}}, max_produce_time_ms=NOW_MS - 60_000,
                                last_commit_ms=NOW_MS - 50_000, last_commit_snapshot_id=7),
        table_uuid=None, end=end, table_offsets=table, table_freshness=3.0, now_ms=NOW_MS,
    )  # fmt: skip
    # Partition 1 never committed by it: it starts where spec.table stands (nothing waits there).
    assert (behind.lag_records, behind.freshness_seconds, behind.snapshot_id) == (5, 60.0, 7)
    assert behind.last_commit_time == NOW - timedelta(seconds=50)


def facts_of(state: CommittedState, **figures: Any) -> TableFacts:
    """What the driver's meter reads of a table at `state` (`icefall.compact.measure.table_facts`)."""
    return TableFacts(offsets_by_topic={t: dict(h.offsets) for t, h in state.by_topic().items()}, **figures)


def one_topic(offsets: dict[int, int]) -> CommittedState:
    return CommittedState(snapshot_id=1, topic="events", offsets=offsets)


def several(**offsets: dict[int, int]) -> CommittedState:
    return CommittedState(snapshot_id=1, topics={t.replace("_", "-"): TopicState(offsets=o)
                                                 for t, o in offsets.items()})  # fmt: skip


# Each form of the source: spec.table's state, a route table left behind by a crash, and the lag after the
# batch (per topic and partition, as the driver measures it); the route's lag is what it has not committed.
FORMS = {
    # spec.source.topic: the one-topic form, keyed by its topic's name.
    "topic": (one_topic({0: 8, 1: 4}), one_topic({0: 5}), {"events": {0: 2, 1: 0}}, 3 + 2),
    # spec.source.topics of one topic: the topics form.
    "topics of one": (several(orders={0: 8}), several(orders={0: 3}), {"orders": {0: 1}}, 5 + 1),
    # spec.source.topics of two: the route holds one of them only (the other from spec.table's offsets).
    "topics": (
        several(orders_eu={0: 10, 1: 7}, orders_us={0: 25}), several(orders_eu={0: 4, 1: 7}),
        {"orders-eu": {0: 0, 1: 0}, "orders-us": {0: 5}}, 6 + 5,
    ),
    # spec.source.topicPattern: a topic it matched later, never committed by the route, counts from
    # spec.table's offsets; one the route holds as much of as spec.table lags as much.
    "topicPattern": (
        several(orders_eu={0: 10}, orders_us={0: 25}, orders_apac={0: 3}),
        several(orders_eu={0: 9}, orders_us={0: 25}),
        {"orders-eu": {0: 2}, "orders-us": {0: 0}, "orders-apac": {0: 4}}, 3 + 0 + 4,
    ),
}  # fmt: skip


@pytest.mark.parametrize("form", FORMS)
def test_a_destination_lags_over_every_topic_and_partition_in_each_form_of_the_source(form: str) -> None:
    table, route, lag, behind = FORMS[form]
    held = facts_of(table).offsets_by_topic
    end = topic_ends(held, lag)  # as the driver's report gives it (`BatchReport.topic_ends`)
    assert sum(map(len, end.values())) == sum(map(len, held.values()))
    entry = destination_status(
        "shop.routed", facts_of(route, max_produce_time_ms=NOW_MS - 20_000), table_uuid=None, end=end,
        table_offsets=held, table_freshness=1.0, now_ms=NOW_MS,
    )  # fmt: skip
    assert (entry.lag_records, entry.freshness_seconds) == (behind, 20.0)  # behind: from its own record
    level = destination_status(
        "shop.level", facts_of(table), table_uuid=None, end=end, table_offsets=held, table_freshness=1.0,
        now_ms=NOW_MS,
    )  # fmt: skip
    waiting = sum(sum(max(n, 0) for n in by_partition.values()) for by_partition in lag.values())
    assert (level.lag_records, level.freshness_seconds) == (waiting, 1.0)  # spec.table's own lag


def test_status_lists_at_most_the_cap_keeping_the_table_and_the_most_lagging() -> None:
    assert MAX_STATUS_TABLES >= 1 + MAX_ROUTES  # every static destination fits
    entries = [DestinationStatus(table=f"t{i}", lag_records=i % 7) for i in range(MAX_STATUS_TABLES + 50)]
    kept = bounded_tables(entries)
    assert len(kept) == MAX_STATUS_TABLES and kept[0].table == "t0"
    assert min(e.lag_records or 0 for e in kept[1:]) >= max(
        e.lag_records or 0 for e in entries if e not in kept
    )
    assert [e.table for e in kept] == [e.table for e in entries if e in kept]  # in their order
    assert bounded_tables(entries[:3]) == entries[:3]


def report(at: datetime, **more: Any) -> WriterReport:
    return WriterReport(reported_at=at, freshness_seconds=0, lag_records=0, **more)


def test_status_tables_follow_a_recent_report_else_keep_the_last_else_name_the_destinations() -> None:
    table = st()
    named = status_tables(table, None, [], NOW)
    assert [t.table for t in named] == ["shop.events", "shop.clicks", "web.views"]
    assert all(t.lag_records is None for t in named)
    measured = [DestinationStatus(table="shop.events", lag_records=1)]
    assert status_tables(table, report(NOW, tables=measured), named, NOW) == measured
    stale = report(NOW - timedelta(minutes=5), tables=[DestinationStatus(table="old", lag_records=9)])
    assert status_tables(table, stale, measured, NOW) == measured


def test_compaction_scales_on_every_destinations_backlog() -> None:
    tables = [
        DestinationStatus(table="shop.events", compaction_backlog=2),
        DestinationStatus(table="shop.clicks", compaction_backlog=3),
        DestinationStatus(table="web.views"),
    ]
    assert reported_backlog(report(NOW, tables=tables), NOW) == 5
    assert reported_backlog(report(NOW - timedelta(minutes=5), tables=tables), NOW) is None


def test_the_operator_counts_the_tables_it_writes() -> None:
    from icefall.controller.status import derive
    from icefall.plan.driver import Action, DriverDecision, DriverHistory, DriverState

    decision = DriverDecision(Action.KEEP, DriverHistory(), DriverState.STARTING)
    derived = derive(st(), decision, problems=[], owner=None, now=NOW)
    assert derived.status.table_count == 3 and len(derived.status.tables) == 3


def test_each_route_table_has_leases_of_its_own_identity_that_compaction_may_use() -> None:
    table = st()
    leases = destination_leases(table)
    assert leases[0] == table_leases(table) and len({lease.commit for lease in leases}) == 3
    assert "clicks" in leases[1].rewrite_yield and "views" in leases[2].rewrite_yield
    created = {c["metadata"]["name"] for c in lease_children(ChildMeta("events", "ns", "uid", 1, "h"), table)}
    for route in leases[1:]:
        assert {*route.work, route.rewrite_yield} <= created and route.commit not in created
    assert leases[0].commit in created
    named = {n for rule in compaction_rules(table) for n in rule.get("resourceNames", [])}
    assert all({*lease.work, lease.rewrite_yield} <= named for lease in leases)
    assert not any(lease.commit in named for lease in leases)  # compaction never takes a commit Lease


def test_the_purge_job_names_each_route_tables_recorded_uuid() -> None:
    status = StreamingTableStatus(
        writer=report(
            NOW,
            table_uuid="main",
            tables=[
                DestinationStatus(table="shop.events", table_uuid="main"),
                DestinationStatus(table="shop.clicks", table_uuid="c"),
                DestinationStatus(table="web.views"),  # never read: kept
            ],
        )
    )
    table = st(status.model_dump(mode="json", by_alias=True, exclude_none=True))
    assert route_table_uuids(table) == {"shop.clicks": "c"}
    command = purge_command("ns", "events", "main", None, route_table_uuids(table))
    assert command[-2:] == ["--route-table-uuid", "shop.clicks=c"]


class Table:
    """A table's runner as `TablesRunner` sees it: a plan of `items` (or a failure), one item a step."""

    def __init__(self, label: str, items: int, *, fails: bool = False) -> None:
        self.label, self.items, self.fails, self.spark = label, items, fails, None

    def step(self, now_ms: int | None = None) -> StepResult:
        if self.fails:
            raise OSError("catalog down")
        if not self.items:
            return StepResult(0)
        self.items -= 1
        return StepResult(self.items + 1, item=cast(Any, self.label))


def test_the_compaction_pods_take_the_tables_in_turn_past_a_failing_one() -> None:
    tables = [Table("a", 3), Table("b", 0), Table("c", 2, fails=True), Table("d", 2)]
    runner = TablesRunner(cast(list[MaintenanceRunner], tables))
    ran = [runner.step(NOW_MS).table for _ in range(5)]
    assert ran == ["a", "d", "a", "d", "a"]  # b has nothing to do, c cannot be planned
    idle = runner.step(NOW_MS)
    assert not idle.ran and idle.error is None
    down = TablesRunner(cast(list[MaintenanceRunner], [Table("x", 1, fails=True)]))
    assert down.step(NOW_MS).error == "planning failed"  # every table failed: the loop backs off


class Patches:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.sent.append(status)


def test_the_driver_reports_each_table_against_the_topics_end_at_its_last_batch() -> None:
    """The report's `tables`: spec.table's from the batch, each route's from its own offsets against the
    batch's end (offsets + lag); caught up (no batch due), spec.table's offsets are the end."""
    from icefall.api import TableStatus
    from icefall.controller.kube import Kube
    from icefall.ingest.report import BatchReport
    from icefall.ingest.table_meter import RouteReading, TableMeter, TableReading
    from icefall.ingest.writer_status import WriterStatusReporter

    class Meter:
        on_reading = None
        latest = TableReading(
            "u", None, TableStatus(compaction_backlog=1), 0,
            TableFacts(offsets_by_topic={"events": {0: 8}}), "shop.events",
            (RouteReading("shop.clicks", "c",
                          TableFacts(offsets_by_topic={"events": {0: 6}}, compaction_backlog=4)),),
        )  # fmt: skip

    kube = Patches()
    reporter = WriterStatusReporter(
        cast(Kube, kube), "ns", "events", interval=0, wall=lambda: NOW, meter=cast(TableMeter, Meter())
    )
    reporter(BatchReport(2, 2, 0, 1.0, 0.1, 9, {0: 8}, 3, 1.5, partition_lag={0: 3}))
    tables = {t["table"]: t for t in kube.sent[-1]["writer"]["tables"]}
    assert (tables["shop.events"]["lagRecords"], tables["shop.events"]["snapshotId"]) == (3, 9)
    assert (tables["shop.clicks"]["lagRecords"], tables["shop.clicks"]["tableUuid"]) == (5, "c")
    assert reported_backlog(WriterReport.model_validate(kube.sent[-1]["writer"]), NOW) == 5
    reporter(None)  # caught up: spec.table's offsets are the topic's end
    tables = {t["table"]: t for t in kube.sent[-1]["writer"]["tables"]}
    assert (tables["shop.events"]["lagRecords"], tables["shop.clicks"]["lagRecords"]) == (0, 2)


def test_the_driver_reports_a_route_of_several_topics_against_each_topics_end() -> None:
    """A table of several topics (`spec.source.topics` or `topicPattern`): its report gives no partition
    offsets, each topic's end instead (`BatchReport.topic_ends`), and a route table's lag counts them all."""
    from icefall.api import TableStatus
    from icefall.controller.kube import Kube
    from icefall.ingest.report import BatchReport
    from icefall.ingest.table_meter import RouteReading, TableMeter, TableReading
    from icefall.ingest.writer_status import WriterStatusReporter

    class Meter:
        on_reading = None
        latest = TableReading(
            "u", None, TableStatus(), 0, TableFacts(offsets_by_topic={"a": {0: 8}, "b": {0: 4, 1: 2}}),
            "shop.events", (RouteReading("shop.clicks", "c", TableFacts(offsets_by_topic={"a": {0: 6}})),),
        )  # fmt: skip

    kube = Patches()
    reporter = WriterStatusReporter(
        cast(Kube, kube), "ns", "events", interval=0, wall=lambda: NOW, meter=cast(TableMeter, Meter())
    )
    reporter(BatchReport(2, 2, 0, 1.0, 0.1, 9, {}, 6, 1.5, topic_ends={"a": {0: 10}, "b": {0: 7, 1: 3}}))
    tables = {t["table"]: t["lagRecords"] for t in kube.sent[-1]["writer"]["tables"]}
    # a: 10 - 6; b, never committed by the route, from spec.table's offsets: 7 - 4 and 3 - 2.
    assert tables == {"shop.events": 6, "shop.clicks": 4 + 3 + 1}
    reporter(None)  # caught up: spec.table's offsets are each topic's end
    tables = {t["table"]: t["lagRecords"] for t in kube.sent[-1]["writer"]["tables"]}
    assert tables == {"shop.events": 0, "shop.clicks": 2}
