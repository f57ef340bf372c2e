"""Upkeep of the tables a dynamic route makes (`spec.dynamicRoute`): status, compaction Leases, purge (pure
parts, fake clocks).

Proves: the dynamic route's tables share one set of yield and work Leases, of an identity no table has
(spec.table's with a suffix a table name cannot hold), which the operator creates (no commit Lease) and the
compaction Role names (17 names more, not every Lease), while the driver's Role is unchanged; a StreamingTable
without a dynamic route has none; `status.tableCount` counts the tables the driver reported its dynamic route
made, whatever the report's age; the driver's report lists each dynamic table with the others and counts
them; the purge Job names the recorded uuid of each reported dynamic table but never one of a table the
route cannot have made; compaction finds the dynamic tables again at its interval, keeps the last list when
the catalog does not answer, and lets them take their turns after the static tables; a dynamic table's
item takes the shared work Lease its table and key hash to (the tables spread over the pool).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from icefall.api import DestinationStatus, StreamingTable, StreamingTableStatus, WriterReport
from icefall.compact.runner import DynamicRunners, MaintenanceRunner, StepResult, TablesRunner
from icefall.plan.lease_objects import lease_children
from icefall.plan.metadata import ChildMeta
from icefall.plan.names import (
    TableIdentity,
    TableLeases,
    destination_leases,
    dynamic_route_leases,
    maintained_leases,
)
from icefall.plan.purge import route_table_uuids
from icefall.plan.rbac import compaction_rules, driver_rules
from icefall.plan.routing import dynamic_candidate
from icefall.plan.table_status import TableFacts, table_count

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
DYNAMIC = {"from": "Field", "name": "kind", "nameTemplate": "ev_{value}"}


def st(
    status: dict[str, Any] | None = None, *, dynamic: bool = True, table: str = "events"
) -> StreamingTable:
    spec: dict[str, Any] = {
        "source": {"topic": "events", "bootstrapServers": "k:9092"},
        "format": {"schema": [{"name": "kind", "type": "string"}]},
        "table": {"namespace": "shop", "name": table},
        "routes": [{"table": {"name": "ev_clicks"}, "when": "kind = 'click'"}],
    }
    if dynamic:
        spec["dynamicRoute"] = DYNAMIC
    return StreamingTable.model_validate(
        {"metadata": {"name": "events"}, "spec": spec, **({"status": status} if status else {})}
    )


def names_in(rules: list[dict[str, Any]]) -> set[str]:
    return {n for rule in rules for n in rule.get("resourceNames", [])}


def test_the_dynamic_routes_tables_share_one_set_of_leases_of_an_identity_no_table_has() -> None:
    table = st()
    shared = dynamic_route_leases(table)
    assert shared is not None and dynamic_route_leases(st(dynamic=False)) is None
    assert shared == dynamic_route_leases(st())  # deterministic: every pod derives the same names
    assert dynamic_route_leases(st(table="orders")) != shared  # another owner, other Leases
    # No table, not even one named like the suffix, has the route's identity.
    look_alike = TableLeases(TableIdentity("", "", "shop", "events_dynamic"))
    taken = {
        n for leases in (*destination_leases(table), look_alike) for n in (*leases.work, leases.rewrite_yield)
    }
    assert not taken & {*shared.work, shared.rewrite_yield}
    assert maintained_leases(table) == (*destination_leases(table), shared)
    assert maintained_leases(st(dynamic=False)) == destination_leases(st(dynamic=False))


def test_the_operator_creates_them_and_only_the_compaction_role_names_them() -> None:
    table, shared = st(), dynamic_route_leases(st())
    assert shared is not None
    created = {c["metadata"]["name"] for c in lease_children(ChildMeta("events", "ns", "uid", 1, "h"), table)}
    assert {*shared.work, shared.rewrite_yield} <= created and shared.commit not in created
    named = names_in(compaction_rules(table))
    assert {*shared.work, shared.rewrite_yield} <= named and shared.commit not in named
    # 17 names more than without the route: never a rule over every Lease of the namespace.
    assert len(named) == len(names_in(compaction_rules(st(dynamic=False)))) + 17
    assert all(rule.get("resourceNames") for rule in compaction_rules(table))
    assert names_in(driver_rules(table, executors=False)) == names_in(
        driver_rules(st(dynamic=False), executors=False)
    )


def report(at: datetime, **more: Any) -> WriterReport:
    return WriterReport(reported_at=at, freshness_seconds=0, lag_records=0, **more)


def test_the_table_count_adds_the_tables_the_dynamic_route_made_whatever_the_reports_age() -> None:
    table = st()
    assert table_count(table, None) == 2  # spec.table and the route's table, before any report
    assert table_count(table, report(NOW, dynamic_tables=5)) == 7
    assert table_count(table, report(NOW - timedelta(days=1), dynamic_tables=5)) == 7  # tables stay
    assert table_count(st(dynamic=False), report(NOW, dynamic_tables=5)) == 2  # the route was removed


def test_the_operator_shows_the_count_and_the_reported_dynamic_tables() -> None:
    from icefall.controller.status import derive
    from icefall.plan.driver import Action, DriverDecision, DriverHistory, DriverState

    listed = [
        DestinationStatus(table=t, lag_records=0) for t in ("shop.events", "shop.ev_clicks", "shop.ev_buy")
    ]
    status = StreamingTableStatus(writer=report(NOW, tables=listed, dynamic_tables=1))
    decision = DriverDecision(Action.KEEP, DriverHistory(), DriverState.RUNNING)
    derived = derive(
        st(status.model_dump(mode="json", by_alias=True)), decision, problems=[], owner=None, now=NOW
    )
    assert derived.status.table_count == 3
    assert [t.table for t in derived.status.tables] == ["shop.events", "shop.ev_clicks", "shop.ev_buy"]


def test_the_purge_job_names_the_uuid_of_each_reported_dynamic_table_only() -> None:
    tables = [
        DestinationStatus(table="shop.events", table_uuid="main"),
        DestinationStatus(table="shop.ev_clicks", table_uuid="c"),  # the static route's
        DestinationStatus(table="shop.ev_buy", table_uuid="b"),  # the dynamic route's
        DestinationStatus(table="shop.other", table_uuid="o"),  # not its template: never named
        DestinationStatus(table="web.ev_view", table_uuid="v"),  # not its namespace
    ]
    status = StreamingTableStatus(writer=report(NOW, table_uuid="main", tables=tables))
    dumped = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert route_table_uuids(st(dumped)) == {"shop.ev_clicks": "c", "shop.ev_buy": "b"}
    assert route_table_uuids(st(dumped, dynamic=False)) == {"shop.ev_clicks": "c"}


def test_what_a_dynamic_route_may_have_made() -> None:
    table = st()
    assert dynamic_candidate(table, ("shop", "ev_buy"))
    assert not dynamic_candidate(table, ("shop", "ev_"))  # no value
    assert not dynamic_candidate(table, ("shop", "ev_clicks"))  # the static route's table
    assert not dynamic_candidate(table, ("shop", "events"))  # spec.table
    assert not dynamic_candidate(table, ("web", "ev_buy"))
    assert not dynamic_candidate(st(dynamic=False), ("shop", "ev_buy"))


def test_the_drivers_report_lists_and_counts_the_dynamic_tables() -> None:
    from icefall.api import TableStatus
    from icefall.controller.kube import Kube
    from icefall.ingest.report import BatchReport
    from icefall.ingest.table_meter import RouteReading, TableMeter, TableReading
    from icefall.ingest.writer_status import WriterStatusReporter

    held = TableFacts(offsets_by_topic={"events": {0: 8}})
    routes = (
        RouteReading("shop.ev_clicks", "c", held),
        RouteReading("shop.ev_buy", "b", TableFacts(offsets_by_topic={"events": {0: 6}}), dynamic=True),
        RouteReading("shop.ev_view", "v", held, dynamic=True),
    )

    class Meter:
        on_reading = None
        latest = TableReading("u", None, TableStatus(), 0, held, "shop.events", routes, dynamic_route=True)

    sent: list[dict[str, Any]] = []

    class Patches:
        def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
            sent.append(status)

    reporter = WriterStatusReporter(
        cast(Kube, Patches()), "ns", "events", interval=0, wall=lambda: NOW, meter=cast(TableMeter, Meter())
    )
    reporter(BatchReport(2, 2, 0, 1.0, 0.1, 9, {0: 8}, 3, 1.5, partition_lag={0: 3}))
    writer = WriterReport.model_validate(sent[-1]["writer"])
    assert writer.dynamic_tables == 2
    lags = {t.table: (t.lag_records, t.table_uuid) for t in writer.tables}
    assert lags == {
        "shop.events": (3, "u"), "shop.ev_clicks": (3, "c"), "shop.ev_buy": (5, "b"), "shop.ev_view": (3, "v")
    }  # fmt: skip


class Table:
    """A table's runner as `TablesRunner` sees it: a plan of `items`, one item a step."""

    def __init__(self, label: str, items: int) -> None:
        self.label, self.items, self.spark = label, items, None

    def step(self, now_ms: int | None = None) -> StepResult:
        if not self.items:
            return StepResult(0)
        self.items -= 1
        return StepResult(self.items + 1, item=cast(Any, self.label))


def test_compaction_finds_the_dynamic_tables_again_and_they_take_their_turns() -> None:
    catalog: list[tuple[str, ...]] = [("shop", "ev_buy")]
    down = False
    looks: list[float] = []
    now = [0.0]

    def find() -> list[tuple[str, ...]]:
        looks.append(now[0])
        if down:
            raise OSError("catalog down")
        return list(catalog)

    made: dict[tuple[str, ...], Table] = {}

    def make(identifier: tuple[str, ...]) -> MaintenanceRunner:
        made[identifier] = Table(".".join(identifier), 2)
        return cast(MaintenanceRunner, made[identifier])

    dynamic = DynamicRunners(find, make, refresh_seconds=60, clock=lambda: now[0])
    runner = TablesRunner(cast(list[MaintenanceRunner], [Table("shop.events", 1)]), dynamic)
    assert [runner.step().table for _ in range(3)] == ["shop.events", "shop.ev_buy", "shop.ev_buy"]
    assert looks == [0.0]  # one look a minute, not one a round
    catalog.append(("shop", "ev_view"))  # made by the driver meanwhile
    assert not runner.step().ran  # not seen before the next look
    now[0] = 61.0
    assert runner.step().table == "shop.ev_view" and looks == [0.0, 61.0]
    assert list(made) == [("shop", "ev_buy"), ("shop", "ev_view")]  # a known table keeps its runner
    down, now[0] = True, 130.0
    assert runner.step().table == "shop.ev_view"  # the catalog did not answer: the last list stays
    down, now[0] = False, 200.0
    catalog.remove(("shop", "ev_view"))
    assert not runner.step().ran and dynamic.current() == [made[("shop", "ev_buy")]]  # dropped: no runner


def test_a_dynamic_tables_item_takes_the_shared_work_lease_of_its_table_and_key() -> None:
    from pathlib import Path

    from icefall.catalog import CatalogConfig
    from icefall.compact.worker import ItemResult, Outcome
    from icefall.plan.maintenance import work_key
    from icefall.plan.maintenance_items import ExpireSnapshots, MaintenancePolicy, WorkItem

    shared = dynamic_route_leases(st())
    assert shared is not None
    item = ExpireSnapshots(older_than_ms=0, retain_last=1, keep_ids=(2,), expire_ids=(1,))
    claimed: list[str] = []

    class Lease:
        def __init__(self, name: str) -> None:
            self.name = name

        def acquire(self, timeout: float | None = None) -> int:
            claimed.append(self.name)
            return 1

        def renew(self) -> None:
            pass

        def release(self, *, forget: bool = False) -> None:
            pass

    class Planned(MaintenanceRunner):
        def plan(self, now_ms: int | None = None) -> tuple[WorkItem, ...]:
            return (item,)

    def done(spark: Any, catalog: Any, identifier: Any, item: WorkItem) -> ItemResult:
        return ItemResult("ExpireSnapshots", Outcome.DONE, "ok", 0.1)

    tables, catalog = [f"ev_{i}" for i in range(8)], CatalogConfig.embedded(Path("/nonexistent"))
    for name in tables:
        Planned(
            cast(Any, None), catalog, ("shop", name), MaintenancePolicy(), cast(Any, Lease),
            table_leases=shared, runner=done, work_scope=f"shop.{name}/",
        ).step()  # fmt: skip
    assert claimed == [shared.work_for(f"shop.{name}/{work_key(item)}") for name in tables]
    assert set(claimed) <= set(shared.work) and len(set(claimed)) > 1  # the tables spread over the pool
