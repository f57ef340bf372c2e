"""Static routes: the spec (`spec.routes`, `spec.unrouted`) and the pure planning of what each destination
takes of a batch (`icefall.plan.routing`).

Proves: routes are accepted with their tables' identifiers in order; a condition that is not record-local,
a table that clashes, a layout on a missing column, unrouted without routes, DeadLetter without a
dead-letter destination are refused naming the field and the fix. Keyed routes (mode upsert, cdc with
sequenceBy) are accepted, each route table keyed by spec.key; a keyed dynamic route, a keyed table over
several topics, a format keyed tables do not read, are refused naming the field and the fix.
A destination at the batch's start takes the whole batch; one ahead takes the rest of each partition and
skips the rows it holds; one that holds everything takes nothing; one behind raises instead of losing
records; retention gaps carry over; the driver's one job filters by one condition per distinct take.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from icefall.api import StreamingTable, Unrouted
from icefall.ingest.routes import whole_batch
from icefall.plan.routing import (
    DestinationBehindError,
    Take,
    TopicRange,
    destination_take,
    reads_headers,
    same_takes,
)

pytestmark = pytest.mark.unit

BUCKETED = [{"field": "n", "transform": "bucket[4]"}]
ROUTES = [
    {"table": {"name": "clicks", "partitioning": BUCKETED}, "when": "kind = 'click'"},
    {"table": {"name": "views", "namespace": "web"}, "when": "_kafka.headers['kind'] = 'view'"},
]


KEYED_SCHEMA = {
    "schema": [{"name": "kind", "type": "string"}, {"name": "n", "type": "long", "required": True}]
}


def st(**spec: Any) -> StreamingTable:
    base: dict[str, Any] = {
        "source": {"topic": "events", "bootstrapServers": "k:9092"},
        "format": {"schema": [{"name": "kind", "type": "string"}, {"name": "n", "type": "long"}]},
        "table": {"namespace": "shop", "name": "events"},
        "routes": ROUTES,
    }
    return StreamingTable.model_validate({"metadata": {"name": "events"}, "spec": {**base, **spec}})


def refused(**spec: Any) -> str:
    with pytest.raises(ValidationError) as error:
        st(**spec)
    return str(error.value)


def test_routes_name_their_tables_in_order_and_default_to_the_table() -> None:
    table = st()
    assert table.route_identifiers == (("shop", "clicks"), ("web", "views"))
    assert table.spec.unrouted_to is Unrouted.TABLE
    assert st(unrouted="DeadLetter").spec.unrouted_to is Unrouted.DEAD_LETTER


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"routes": [{"table": {"name": "x"}, "when": "reflect('java.lang.Runtime', 'exit', 1)"}]},
         ["routes.0.when", "reflect"]),
        ({"routes": [{"table": {"name": "x"}, "when": "kind IN (SELECT kind FROM other)"}]},
         ["routes.0.when", "SELECT"]),
        ({"routes": [{"table": {"name": "x", "sortOrder": [{"field": "nope"}]}, "when": "true"}]},
         ["routes[0].table.sortOrder[0].field", "nope"]),
        ({"routes": [{"table": {"name": "x", "properties": {"icefall.offsets": "{}"}}, "when": "true"}]},
         ["icefall.offsets", "remove it"]),
        ({"routes": [], "unrouted": "DeadLetter"}, ["unrouted", "add routes"]),
        ({"unrouted": "DeadLetter", "deadLetter": {"table": {"enabled": False}}}, ["unrouted", "use Table"]),
        ({"mode": "upsert", "key": ["n"], "format": KEYED_SCHEMA, "routes": [],
          "dynamicRoute": {"from": "Key"}},
         ["dynamicRoute:", "needs mode append (not upsert)", "list the tables in routes"]),
        ({"mode": "cdc", "key": ["n"], "format": KEYED_SCHEMA, "routes": [],
          "source": {"topics": ["a", "b"], "bootstrapServers": "k:9092"}},
         ["key:", "reads one topic", "use source.topic", "or routes"]),
        ({"mode": "upsert", "key": ["n"], "format": {"type": "protobuf", "registry": {"url": "http://r:8081"},
          "schema": [{"name": "kind", "type": "string"}, {"name": "n", "type": "long", "required": True}]}},
         ["mode:", "not supported with format protobuf", "use mode: append"]),
    ],
)  # fmt: skip
def test_what_routes_refuse_names_the_field_and_the_fix(spec: dict[str, Any], words: list[str]) -> None:
    message = refused(**spec)
    for word in words:
        assert word in message


KEYED_SCHEMA = {
    "schema": [{"name": "kind", "type": "string"}, {"name": "n", "type": "long", "required": True}]
}


@pytest.mark.parametrize(
    "keyed",
    [{"mode": "upsert"}, {"mode": "cdc"}, {"mode": "cdc", "sequenceBy": ["source.lsn"]}],
    ids=["upsert", "cdc", "cdc-sequenceBy"],
)
def test_keyed_routes_are_accepted_each_table_keyed_like_the_table(keyed: dict[str, Any]) -> None:
    table = st(key=["n"], format=KEYED_SCHEMA, unrouted="DeadLetter", **keyed)
    assert table.spec.routed and table.spec.key == ["n"]
    assert table.route_identifiers == (("shop", "clicks"), ("web", "views"))


def test_a_route_table_must_be_a_table_of_its_own() -> None:
    message = refused(routes=[{"table": {"name": "events"}, "when": "true"}])
    assert "spec.routes[0].table.name" in message and "already spec.table" in message
    message = refused(routes=[{"table": {"name": "events_dlq"}, "when": "true"}])
    assert "already the dead-letter table" in message
    twice = [{"table": {"name": "x"}, "when": "true"}, {"table": {"name": "x"}, "when": "false"}]
    assert "already routes[0].table" in refused(routes=twice)


def test_a_destination_at_the_start_takes_the_whole_batch() -> None:
    take = destination_take({0: 10, 1: 5}, {0: 20, 1: 5}, {}, {0: 10, 1: 5}, name="t")
    assert take == Take({0: 10, 1: 5}, {0: 20, 1: 5})
    assert destination_take({0: 10}, {0: 20}, {}, {}, name="new") == Take({0: 10}, {0: 20})


def test_a_destination_ahead_takes_the_rest_and_skips_what_it_holds() -> None:
    # Partition 0: 15 of [10, 20) is held; partition 1: all of [5, 9) is held.
    take = destination_take({0: 10, 1: 5}, {0: 20, 1: 9}, {}, {0: 15, 1: 9}, name="t")
    assert take == Take({0: 15}, {0: 20}, skip_below={0: 15})
    assert destination_take({0: 10}, {0: 20}, {}, {0: 20}, name="t") is None
    assert destination_take({0: 10}, {0: 20}, {}, {0: 25}, name="t") is None


def test_a_destination_behind_the_batch_raises_instead_of_losing_records() -> None:
    with pytest.raises(DestinationBehindError, match="partition 0 is committed up to 3, behind"):
        destination_take({0: 10}, {0: 20}, {}, {0: 3}, name="t")


def test_retention_gaps_carry_over_to_each_destination() -> None:
    # The batch was planned from 4; Kafka holds records from 10 on.
    assert destination_take({0: 10}, {0: 20}, {0: 4}, {0: 4}, name="t") == Take({0: 10}, {0: 20}, {0: 4})
    # A destination at 7 (inside the gap) loses [7, 10) too, and says so.
    assert destination_take({0: 10}, {0: 20}, {0: 4}, {0: 7}, name="t") == Take({0: 10}, {0: 20}, {0: 7})


def test_headers_are_read_only_when_a_condition_names_them() -> None:
    assert reads_headers(["kind = 'a'", "_kafka.headers['k'] = 'v'"])
    assert not reads_headers(["kind = 'a'"])


def test_the_driver_filters_its_one_job_by_one_condition_per_distinct_take() -> None:
    whole = {"t": Take(start={0: 10, 1: 4}, end={0: 20, 1: 9})}
    ahead = {"t": Take(start={0: 15, 1: 4}, end={0: 20, 1: 9}, skip_below={0: 15})}
    # The steady state: every destination takes the whole batch, one condition.
    assert same_takes([(0, whole), (1, dict(whole)), (2, whole)]) == [(whole, [0, 1, 2])]
    # After a crash between commits the tables ahead take less: a group of their own, order kept.
    assert same_takes([(0, ahead), (1, whole), (2, ahead)]) == [(ahead, [0, 2]), (whole, [1])]
    assert same_takes([]) == []


def test_a_stale_view_is_trusted_only_for_a_destination_taking_the_whole_batch() -> None:
    """`whole_batch`: a route table staged on its last commit's metadata (no load) keeps that view only
    where it takes the batch as planned; ahead, behind or past the end is decided on fresh metadata."""
    ranges = [TopicRange("a", {0: 10, 1: 5}, {0: 20, 1: 9}), TopicRange("b", {0: 3}, {0: 7}, gaps={0: 1})]
    assert whole_batch(ranges, {"a": {0: 10, 1: 5}, "b": {0: 1}})
    assert whole_batch(ranges, {"a": {0: 10}})  # partitions and topics never committed: taken whole
    assert not whole_batch(ranges, {"a": {0: 15, 1: 5}, "b": {0: 1}})  # ahead
    assert not whole_batch(ranges, {"a": {0: 10, 1: 2}})  # behind
    assert not whole_batch(ranges, {"a": {0: 10, 1: 5}, "b": {0: 3}})  # at the start, inside its gap
    assert not whole_batch(ranges, {"a": {0: 25}})  # holds it all
