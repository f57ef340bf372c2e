"""The topics one writer reads, as a mapping of topic name to `TopicView`: fixed for `topic` and `topics`,
found in Kafka's topic list for `topicPattern`.

Guarantees: a pattern's topic list is read with one metadata request of the first view's consumer (no new
client), at most every `spec.source.topic_refresh_seconds` (`refresh`), or at once after a topic was found
gone (`gone`). A topic that starts matching is logged (INFO) and read from the next batch on (from its
earliest record once the table holds offsets: `icefall.ingest.planning`); one that stops matching or is
deleted is logged (WARNING) and no longer read; its committed offsets stay in the table, and it is read
again from them if it matches again (a topic deleted and created again under the same name then stops
ingestion with TopicRecreated, as for one topic). Looking up a topic that left the set still gives a view of
it, so a batch planned before it left is checked and reported as any other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping

from icefall.api.source import KafkaSource
from icefall.kafka.admin import TopicView

log = logging.getLogger(__name__)


class TopicSet(Mapping[str, TopicView]):
    """The views of the topics `source` reads, through `first`'s clients (`TopicView.sibling`)."""

    def __init__(self, source: KafkaSource, first: TopicView, label: str) -> None:
        self.source, self.first, self.label = source, first, label
        self._views: dict[str, TopicView] = {}
        self._current: tuple[str, ...] = ()
        self._listed_at: float | None = None
        self._set(source.topic_names)

    @property
    def pattern(self) -> bool:
        """The topics come from Kafka's list (`topicPattern`)."""
        return self.source.topic_pattern is not None

    def refresh(self) -> None:
        """A pattern's topics from Kafka's list, if it was last read `topic_refresh_seconds` ago or more."""
        now = time.monotonic()
        if not self.pattern or (
            self._listed_at is not None and now - self._listed_at < self.source.topic_refresh_seconds
        ):
            return
        found = self.source.select_topics(self.first.listed_topics())
        self._listed_at = now
        first_time = not self._current and not self._views
        for topic in sorted(set(found) - set(self._current)):
            log.info("%s: topic %r matches %s: reading it", self.label, topic, self.source.topics_text)
        for topic in sorted(set(self._current) - set(found)):
            self._left(topic, "no longer matches the pattern or was deleted")
        if not found and (first_time or self._current):
            log.warning("%s: no topic matches %s yet", self.label, self.source.topics_text)
        self._set(found)

    def gone(self, topic: str) -> None:
        """`topic` was not found where it was read: leave it out, and read the list again next time."""
        self._left(topic, "was deleted")
        self._set(tuple(t for t in self._current if t != topic))
        self._listed_at = None

    def _left(self, topic: str, why: str) -> None:
        log.warning(
            "%s: topic %r %s: it is no longer read; its committed offsets stay in the table and it is read "
            "again from them if it matches again",
            self.label, topic, why,
        )  # fmt: skip

    def _set(self, topics: tuple[str, ...]) -> None:
        self._current = topics
        for topic in topics:
            self._view(topic)

    def _view(self, topic: str) -> TopicView:
        if topic not in self._views:
            self._views[topic] = self.first if topic == self.first.topic else self.first.sibling(topic)
        return self._views[topic]

    def __getitem__(self, topic: str) -> TopicView:
        return self._view(topic)

    def __contains__(self, topic: object) -> bool:
        return topic in self._current

    def __iter__(self) -> Iterator[str]:
        return iter(self._current)

    def __len__(self) -> int:
        return len(self._current)
