"""`spec.source.topics`: several topics into one table, as the models accept and refuse it.

Proves: a list of topics is a source of the topics form (its names in order); exactly one of topic and
topics, each problem naming its field; a topic listed twice, a keyed table of several topics and a
dead-letter topic among the topics are refused with the fix.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from icefall.api import StreamingTableSpec
from icefall.api.source import KafkaSource

pytestmark = pytest.mark.unit

SPEC = {
    "format": {"schema": [{"name": "id", "type": "long", "required": True}]},
    "table": {"namespace": "shop", "name": "orders"},
}


def spec(**source: object) -> StreamingTableSpec:
    return StreamingTableSpec.model_validate({**SPEC, "source": {"bootstrapServers": "k:9092", **source}})


def test_a_list_of_topics_is_the_topics_form() -> None:
    source = spec(topics=["orders-eu", "orders-us"]).source
    assert (source.by_topic, source.topic_names, source.first_topic) == (
        True,
        ("orders-eu", "orders-us"),
        "orders-eu",
    )
    one = spec(topic="orders").source
    assert (one.by_topic, one.topic_names) == (False, ("orders",))


@pytest.mark.parametrize(
    ("source", "field", "words"),
    [
        ({}, "topic", "is required"),
        ({"topic": "a", "topics": ["b"]}, "topics", "one of them only"),
        ({"topics": ["a", "a"]}, "topics[1]", "listed twice"),
        ({"topics": []}, "topics", "at least 1"),
        ({"topics": ["bad name"]}, "topics", "pattern"),
    ],
)
def test_exactly_one_of_topic_and_topics(source: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(ValidationError) as error:
        KafkaSource.model_validate({"bootstrapServers": "k:9092", **source})
    assert field in str(error.value) and words in str(error.value), str(error.value)


def test_a_keyed_table_and_a_dead_letter_topic_among_the_topics_are_refused() -> None:
    with pytest.raises(ValidationError, match=r"a keyed table .* reads one topic"):
        StreamingTableSpec.model_validate(
            {
                **SPEC,
                "source": {"bootstrapServers": "k:9092", "topics": ["a", "b"]},
                "mode": "upsert",
                "key": ["id"],
            }
        )
    with pytest.raises(ValidationError, match="the dead-letter topic must differ"):
        StreamingTableSpec.model_validate(
            {
                **SPEC,
                "source": {"bootstrapServers": "k:9092", "topics": ["a", "b"]},
                "deadLetter": {"topic": "b"},
            }
        )
