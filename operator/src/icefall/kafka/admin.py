"""Read-only views of a topic: its partitions, their watermarks, and offsets for a timestamp.

Uses a consumer that never joins a group and never commits: Icefall's progress lives in the table,
not in Kafka consumer groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition


class TopicNotFoundError(RuntimeError):
    pass


class TopicView:
    def __init__(self, bootstrap: str, topic: str, config: Mapping[str, Any] | None = None) -> None:
        self.topic = topic
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "icefall-metadata",  # required by the client; never joined or committed
                "enable.auto.commit": False,
                **(config or {}),
            }
        )

    def partitions(self, timeout: float = 10) -> list[int]:
        metadata = self._consumer.list_topics(self.topic, timeout=timeout)
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            raise TopicNotFoundError(
                f"topic '{self.topic}' does not exist on the cluster (spec.source.topic); create it first"
            )
        return sorted(topic.partitions)

    def watermarks(self, timeout: float = 10) -> dict[int, tuple[int, int]]:
        """(low, high) per partition: the first retained offset and the next offset to be written."""
        marks = {}
        for partition in self.partitions(timeout):
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.topic, partition), timeout=timeout, cached=False
            )
            marks[partition] = (int(low), int(high))
        return marks

    def offsets_for_time(self, timestamp_ms: int, timeout: float = 10) -> dict[int, int]:
        """The first offset at or after `timestamp_ms` per partition (the high watermark if none)."""
        wanted = [TopicPartition(self.topic, p, timestamp_ms) for p in self.partitions(timeout)]
        found = self._consumer.offsets_for_times(wanted, timeout=timeout)
        result = {}
        marks = self.watermarks(timeout)
        for tp in found:
            if tp.error is not None:
                raise KafkaException(tp.error)
            result[tp.partition] = tp.offset if tp.offset >= 0 else marks[tp.partition][1]
        return result

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> TopicView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
