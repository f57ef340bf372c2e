"""`spec.source.topicPattern`: which topics a pattern selects, and which patterns are refused at admission.

Proves: a pattern must match the whole name (Kafka's semantics), selects the listed topics it matches,
sorted, and never Kafka's internal topics nor '_' names unless it starts with '_'; exactly one of topic,
topics and topicPattern; a pattern that does not compile, is too long, uses backreferences or nests
unbounded quantifiers is refused naming spec.source.topicPattern (also by `icefall validate`); a dead-letter
topic the pattern matches, a keyed table and a registry subject named after a topic are refused; the topic
list is read again every metadata.max.age.ms.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from icefall import cli
from icefall.api import StreamingTableSpec
from icefall.api.source import DEFAULT_TOPIC_REFRESH_SECONDS, KafkaSource
from icefall.api.topic_pattern import pattern_problem
from icefall.commands.common import EXIT_INVALID

pytestmark = pytest.mark.unit

SPEC = {
    "format": {"schema": [{"name": "id", "type": "long", "required": True}]},
    "table": {"namespace": "shop", "name": "orders"},
}

LISTED = ["orders-us", "orders-eu", "orders-eu-v2", "x-orders-eu", "_schemas", "__consumer_offsets", "pay"]


def source(**fields: object) -> KafkaSource:
    return KafkaSource.model_validate({"bootstrapServers": "k:9092", **fields})


def test_a_pattern_selects_whole_names_sorted_and_leaves_internal_topics_out() -> None:
    orders = source(topicPattern="orders-(eu|us)")
    assert orders.select_topics(LISTED) == ("orders-eu", "orders-us")  # not orders-eu-v2, x-orders-eu
    assert (orders.by_topic, orders.topic_names, orders.topics_text) == (True, (), "pattern 'orders-(eu|us)'")
    assert orders.reads("orders-eu") and not orders.reads("orders-eu-v2")
    everything = source(topicPattern=".*")
    assert everything.select_topics(LISTED) == (
        "orders-eu",
        "orders-eu-v2",
        "orders-us",
        "pay",
        "x-orders-eu",
    )
    assert source(topicPattern="_.*").select_topics(LISTED) == ("_schemas",)  # __consumer_offsets: never
    assert source(topicPattern="(?i)PAY").select_topics(LISTED) == ("pay",)
    listed = source(topics=["pay", "gone"])
    assert listed.select_topics(LISTED) == ("pay", "gone")  # named topics are read whatever Kafka lists


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("orders-[", "not a valid regular expression"),
        ("a" * 257, "at most 256 characters"),
        ("(a+)+", "nested quantifiers"),
        (r"(\w*)*x", "nested quantifiers"),
        ("(x{2,}){3,}", "nested quantifiers"),
        (r"(orders)-\1", "backreferences"),
        ("(?P<t>a)(?P=t)", "backreferences"),
    ],
)
def test_a_costly_or_broken_pattern_is_refused_naming_the_field(pattern: str, words: str) -> None:
    with pytest.raises(ValidationError) as error:
        source(topicPattern=pattern)
    assert "topicPattern" in str(error.value) and words in str(error.value), str(error.value)


@pytest.mark.parametrize(
    "pattern", [r"cdc\.shop\.[a-z_]+", "([a-z]+-){2}[a-z]+", "[(+]+x", "(a?)+b", r"orders-\d{2,4}"]
)
def test_ordinary_patterns_pass(pattern: str) -> None:
    assert pattern_problem(pattern) is None


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"topic": "a", "topicPattern": "a.*"}, "topicPattern"),
        ({"topics": ["a"], "topicPattern": "a.*"}, "topicPattern"),
        ({"topic": "a", "topics": ["b"]}, "topics"),
    ],
)
def test_exactly_one_of_topic_topics_and_pattern(fields: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as error:
        source(**fields)
    assert field in str(error.value) and "one of them only" in str(error.value), str(error.value)


def spec(**extra: object) -> StreamingTableSpec:
    return StreamingTableSpec.model_validate(
        {**SPEC, "source": {"bootstrapServers": "k:9092", "topicPattern": "orders-.*"}, **extra}
    )


def test_what_a_pattern_cannot_be_combined_with() -> None:
    with pytest.raises(ValidationError, match="the dead-letter topic must differ"):
        spec(deadLetter={"topic": "orders-dlq"})
    assert spec(deadLetter={"topic": "dlq-orders"}).dead_letter.topic == "dlq-orders"
    with pytest.raises(ValidationError, match=r"a keyed table .* reads one topic"):
        spec(mode="upsert", key=["id"])
    registry = {"type": "avro", "registry": {"url": "http://r:8081"}}
    with pytest.raises(
        ValidationError, match=r"format.schema: with source.topicPattern .* registry.subjectNameStrategy"
    ):
        spec(format=registry)
    record = {"subjectNameStrategy": "record", "recordName": "shop.Order"}
    by_record = spec(format={**registry, "registry": {"url": "http://r:8081", **record}})
    assert by_record.format.registry is not None


def test_the_topic_list_is_read_again_every_metadata_max_age() -> None:
    assert source(topicPattern="a.*").topic_refresh_seconds == DEFAULT_TOPIC_REFRESH_SECONDS
    every = source(topicPattern="a.*", properties={"metadata.max.age.ms": "2500"})
    assert every.topic_refresh_seconds == 2.5
    assert source(topicPattern="a.*", properties={"metadata.max.age.ms": "10"}).topic_refresh_seconds == 1.0


def test_icefall_validate_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": "orders"},
        "spec": {**SPEC, "source": {"bootstrapServers": "k:9092", "topicPattern": "(orders-.+)*"}},
    }
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert cli.main(["validate", "-f", str(path)]) == EXIT_INVALID
    out = capsys.readouterr().out
    assert "spec.source.topicPattern: nested quantifiers" in out, out
