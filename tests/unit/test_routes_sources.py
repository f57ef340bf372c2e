"""Routes over several topics and registry formats: the spec accepts them, and each destination takes its
part of a batch per topic (`icefall.plan.routing.destination_takes`, `icefall.ingest.routes`).

Proves: routes and a dynamic route are accepted with `source.topics`, `source.topicPattern` and the
registry formats (avro, protobuf, jsonSchema); keyed routes read several topics too (a keyed table
without routes is refused); a
destination takes each topic from its own offsets of that topic (a topic it never committed: the batch's
range), leaves out the topics it holds, and a destination behind in one topic raises naming that topic; its
commit is in the batch's form (a `TopicsBatch` of the topics it takes, or the one topic's `Batch`), a keyed
route table's naming its own deleted keys file.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from icefall.api import StreamingTable
from icefall.commit import Batch, TopicsBatch
from icefall.ingest.routes import destination_batch
from icefall.plan.routing import DestinationBehindError, Take, TopicRange, destination_takes

pytestmark = pytest.mark.unit

SCHEMA = [{"name": "kind", "type": "string"}]
ROUTES = [{"table": {"name": "eu"}, "when": "_kafka.topic = 'orders-eu'"}]
REGISTRY = {"url": "http://127.0.0.1:8081"}


def st(source: dict[str, Any], **spec: Any) -> StreamingTable:
    base: dict[str, Any] = {
        "source": {"bootstrapServers": "k:9092", **source},
        "format": {"schema": SCHEMA},
        "table": {"namespace": "shop", "name": "orders"},
        "routes": ROUTES,
    }
    return StreamingTable.model_validate({"metadata": {"name": "orders"}, "spec": {**base, **spec}})


@pytest.mark.parametrize(
    "source",
    [{"topics": ["orders-eu", "orders-us"]}, {"topicPattern": "orders-.*"}],
    ids=["topics", "pattern"],
)
def test_routes_and_a_dynamic_route_read_several_topics(source: dict[str, Any]) -> None:
    assert st(source).spec.source.by_topic
    dynamic = st(source, routes=[], dynamicRoute={"from": "Topic", "pattern": "^orders-(.+)$"})
    assert dynamic.spec.dynamic_route is not None


@pytest.mark.parametrize(
    "fmt",
    [
        {"type": "avro", "registry": REGISTRY},
        {"type": "protobuf", "registry": REGISTRY, "schema": SCHEMA},
        {"type": "jsonSchema", "registry": REGISTRY, "schema": SCHEMA},
    ],
    ids=["avro", "protobuf", "jsonSchema"],
)
def test_routes_decode_registry_formats(fmt: dict[str, Any]) -> None:
    table = st({"topic": "orders"}, format=fmt, routes=[{"table": {"name": "big"}, "when": "amount > 100"}])
    assert table.spec.routed


def test_keyed_routes_read_several_topics_a_keyed_table_without_routes_one() -> None:
    keyed: dict[str, Any] = {
        "mode": "upsert",
        "key": ["kind"],
        "format": {"schema": [{**SCHEMA[0], "required": True}]},
    }
    assert st({"topic": "orders"}, **keyed).spec.routed
    assert st({"topics": ["orders-eu", "orders-us"]}, **keyed).spec.source.by_topic  # a table per topic
    with pytest.raises(ValidationError, match=r"a keyed table \(mode upsert or cdc\) reads one topic"):
        st({"topics": ["orders-eu", "orders-us"]}, routes=[], **keyed)


def test_a_destination_takes_each_topic_from_its_own_offsets() -> None:
    ranges = [
        TopicRange("a", {0: 10, 1: 5}, {0: 20, 1: 8}),
        TopicRange("b", {0: 0}, {0: 4}),
        TopicRange("c", {0: 7}, {0: 9}),
    ]
    held = {"a": {0: 15, 1: 5}, "c": {0: 9}}  # ahead in a/0, at the start of a/1, never b, all of c
    takes = destination_takes(ranges, held, name="shop.eu", by_topic=True)
    assert takes == {
        "a": Take({0: 15, 1: 5}, {0: 20, 1: 8}, skip_below={0: 15}),
        "b": Take({0: 0}, {0: 4}),
    }
    assert destination_takes(ranges[2:], held, name="shop.eu", by_topic=True) == {}


def test_a_destination_behind_in_one_topic_names_it() -> None:
    with pytest.raises(DestinationBehindError, match=r"shop.eu \(topic b\): partition 0 .* behind"):
        destination_takes([TopicRange("b", {0: 10}, {0: 12})], {"b": {0: 3}}, name="shop.eu", by_topic=True)


def test_a_destination_commits_the_topics_it_takes_in_the_batch_form() -> None:
    parts = (
        Batch("a", {0: 10}, {0: 20}, topic_id="ida", max_produce_time_ms=5),
        Batch("b", {0: 0}, {0: 4}, topic_id="idb"),
    )
    part = destination_batch(TopicsBatch(parts), {"a": Take({0: 15}, {0: 20}, skip_below={0: 15})})
    assert part == TopicsBatch((Batch("a", {0: 15}, {0: 20}, topic_id="ida", max_produce_time_ms=5),))
    one = destination_batch(parts[1], {"b": Take({0: 0}, {0: 4})})
    assert one == Batch("b", {0: 0}, {0: 4}, topic_id="idb")
    # A keyed route table (one topic) names its own deleted keys file, never the table's.
    table = Batch("b", {0: 0}, {0: 4}, topic_id="idb", deleted_keys="s3://w/t/metadata/table.parquet")
    own = destination_batch(
        table, {"b": Take({0: 2}, {0: 4}, skip_below={0: 2})}, "s3://w/r/metadata/r.parquet"
    )
    assert own == Batch("b", {0: 2}, {0: 4}, topic_id="idb", deleted_keys="s3://w/r/metadata/r.parquet")
    assert destination_batch(table, {"b": Take({0: 0}, {0: 4})}).deleted_keys is None
