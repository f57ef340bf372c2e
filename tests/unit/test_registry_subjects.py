"""The subjects a registry format's writer learns its writer schemas from before its first batch.

Proves: each named topic's value subject by the spec's strategy (once each), a keyed Avro table's
`<topic>-key` subjects with the topic strategy only, none for `topicPattern` (its topics are not known at
start), and `registered_writers` asks the registry for exactly those. No registry is contacted.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from icefall.api import StreamingTableSpec, load_manifest
from icefall.kafka.registry import registered_writers, writer_subjects

pytestmark = pytest.mark.unit


def _spec(source: str, registry: str = "{url: http://r}", extra: str = "") -> StreamingTableSpec:
    return load_manifest(
        f"""
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {{name: orders}}
spec:
  source: {{bootstrapServers: "kafka:9092", {source}}}
  format:
    type: avro
    registry: {registry}
    schema:
      - {{name: id, type: long, required: true}}
  table: {{namespace: it, name: t}}
{extra}"""
    ).spec


def test_value_subjects_follow_the_strategy() -> None:
    assert writer_subjects(_spec("topic: orders")) == (["orders-value"], [])
    assert writer_subjects(_spec("topics: [a, b]")) == (["a-value", "b-value"], [])
    record = "{url: http://r, subjectNameStrategy: record, recordName: com.shop.Order}"
    assert writer_subjects(_spec("topics: [a, b]", record)) == (["com.shop.Order"], [])
    topic_record = "{url: http://r, subjectNameStrategy: topic-record, recordName: com.shop.Order}"
    assert writer_subjects(_spec("topic: a", topic_record)) == (["a-com.shop.Order"], [])
    assert writer_subjects(_spec("topicPattern: 'orders-.*'")) == ([], [])


def test_a_keyed_avro_table_learns_its_key_subjects_too() -> None:
    keyed = "  mode: upsert\n  key: [id]\n"
    assert writer_subjects(_spec("topic: orders", extra=keyed)) == (["orders-value"], ["orders-key"])
    record = "{url: http://r, subjectNameStrategy: record, recordName: com.shop.Order}"
    assert writer_subjects(_spec("topic: orders", record, extra=keyed)) == (["com.shop.Order"], [])


def test_registered_writers_asks_for_those_subjects() -> None:
    asked: list[list[str]] = []

    class Registry:
        def lookup(self, ids: Iterable[int]) -> dict[int, str | None]:
            raise AssertionError("not asked by id")

        def latest_schema(self, topic: str) -> str:
            raise AssertionError("not asked")

        def registered(self, subjects: Iterable[str]) -> dict[int, str]:
            asked.append(list(subjects))
            return {len(asked): "{}"}

    assert registered_writers(Registry(), _spec("topic: orders")) == ({1: "{}"}, {})
    assert asked == [["orders-value"]]
    keyed = _spec("topic: orders", extra="  mode: upsert\n  key: [id]\n")
    assert registered_writers(Registry(), keyed) == ({2: "{}"}, {3: "{}"})
    assert asked[1:] == [["orders-value"], ["orders-key"]]
