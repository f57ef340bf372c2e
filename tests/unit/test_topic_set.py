"""`icefall.kafka.topic_set.TopicSet`: the topics a writer reads, as the planner sees them.

Proves: a list's topics are fixed and never listed; a pattern's are listed on first use and then at most
every metadata.max.age.ms, a new matching topic joins and one that stops matching leaves (still looked up for
a batch planned before), and a topic found gone is left out and the list read again at the next look.
"""

from __future__ import annotations

from typing import Any

import pytest

from icefall.api.source import KafkaSource
from icefall.kafka.topic_set import TopicSet

pytestmark = pytest.mark.unit


class FakeView:
    """What TopicSet uses of a `TopicView`: its topic, `sibling` and `listed_topics` (counted)."""

    def __init__(self, topic: str, listed: set[str]) -> None:
        self.topic, self.listed, self.lists = topic, listed, 0

    def sibling(self, topic: str) -> Any:
        return FakeView(topic, self.listed)

    def listed_topics(self) -> set[str]:
        self.lists += 1
        return set(self.listed)


def topic_set(listed: set[str], **fields: object) -> tuple[TopicSet, FakeView]:
    source = KafkaSource.model_validate({"bootstrapServers": "k:9092", **fields})
    first = FakeView(source.first_topic, listed)
    return TopicSet(source, first, "shop.orders"), first  # type: ignore[arg-type]


def test_a_list_of_topics_is_fixed_and_never_listed() -> None:
    topics, first = topic_set({"a"}, topics=["a", "b"])
    topics.refresh()
    assert (list(topics), first.lists, topics["b"].topic) == (["a", "b"], 0, "b")


def test_a_pattern_is_listed_at_most_every_max_age(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("icefall.kafka.topic_set.time.monotonic", lambda: now[0])
    topics, first = topic_set(
        {"o-eu", "o-us", "pay", "_o-x"}, topicPattern="o-.*", properties={"metadata.max.age.ms": "5000"}
    )
    assert list(topics) == []  # nothing before the first look
    topics.refresh()
    assert (list(topics), first.lists) == (["o-eu", "o-us"], 1)
    first.listed |= {"o-asia"}
    first.listed -= {"o-us"}
    now[0] += 4
    topics.refresh()
    assert (list(topics), first.lists) == (["o-eu", "o-us"], 1), "listed again too soon"
    now[0] += 1
    topics.refresh()
    assert (list(topics), first.lists) == (["o-asia", "o-eu"], 2)
    assert "o-us" not in topics and topics["o-us"].topic == "o-us"  # a batch planned before still finds it
    topics.gone("o-eu")
    assert list(topics) == ["o-asia"]
    topics.refresh()  # a topic found gone: the list is read again at once
    assert first.lists == 3 and list(topics) == ["o-asia", "o-eu"]
