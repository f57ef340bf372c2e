"""The Kafka side of an audit on a live topic: `KafkaTopic`, a `TopicOffsets` read with a consumer."""

from __future__ import annotations

import time
from array import array
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from icefall.audit.rows import OFFSETS, AuditError
from icefall.kafka.admin import ISOLATION, TopicView


class KafkaTopic:
    """A live topic, read with a consumer assigned to explicit offsets (never a group, never a commit).

    `config` is added to the consumer's configuration (security settings, ...); reads are always
    `read_committed`, as ingestion's. Reading
    stops at the range's end, at the high watermark, or at the end of the partition, so gaps in the offsets
    (transaction markers, aborted or compacted records) are fine. `timeout` bounds a wait without progress.
    """

    def __init__(
        self, bootstrap: str, topic: str, *, config: Mapping[str, Any] | None = None, timeout: float = 30
    ) -> None:
        self.topic = topic
        self._timeout = timeout
        settings = {
            "bootstrap.servers": bootstrap,
            "group.id": "icefall-audit",  # required by the client; never joined, never committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",  # records deleted while we read: fail, do not skip silently
            # A fetch left waiting on a partition we moved off would hold up the next one (500 ms default).
            "fetch.wait.max.ms": 50,
            "log_level": 0,  # a broker down is an exception to the caller, not a log line every backoff
            **(config or {}),
            **ISOLATION,  # what ingestion reads: aborted transactions are not records of the topic
        }
        self._view = TopicView(bootstrap, topic, config)
        self._consumer = Consumer(settings)
        self._marks: dict[int, tuple[int, int]] | None = None
        self._topic_id: str | None = None

    @property
    def topic_id(self) -> str:
        if self._topic_id is None:
            self._topic_id = self._view.topic_id(timeout=self._timeout)
        return self._topic_id

    def watermarks(self, partition: int) -> tuple[int, int] | None:
        if self._marks is None:
            self._marks = self._view.watermarks(timeout=self._timeout)
        return self._marks.get(partition)

    def offsets(self, partition: int, start: int, end: int) -> Iterable[int]:
        marks = self.watermarks(partition)
        if marks is None:
            return []
        low, high = marks
        begin, stop = max(start, low), min(end, high)
        if begin >= stop:
            return []
        found = array("q")  # 8 bytes an offset; handed to Arrow without a copy
        self._consumer.assign([TopicPartition(self.topic, partition, begin)])
        try:
            deadline = time.monotonic() + self._timeout
            while True:
                # consume() waits until the batch is full or the wait ends: keep the wait short.
                messages = self._consumer.consume(num_messages=10_000, timeout=0.05)
                if not messages and time.monotonic() > deadline:
                    position = found[-1] + 1 if found else begin
                    raise AuditError(
                        f"no progress reading {self.topic} partition {partition} at offset {position} "
                        f"for {self._timeout}s (reading up to {stop})"
                    )
                if messages:
                    deadline = time.monotonic() + self._timeout
                if self._take(messages, partition, found, stop):
                    break
        finally:
            self._consumer.unassign()
        return pa.Array.from_buffers(OFFSETS, len(found), [None, pa.py_buffer(found)])  # type: ignore[no-any-return]

    def _take(self, messages: list[Any], partition: int, found: array[int], stop: int) -> bool:
        """Append the offsets below `stop`; True once the range is done."""
        for message in messages:
            if message.partition() != partition:
                continue  # left over from an earlier assignment
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return True
                if error.code() == KafkaError._AUTO_OFFSET_RESET:
                    raise AuditError(
                        f"Kafka deleted records of {self.topic} partition {partition} while they were "
                        f"being audited (retention); audit again ({error.str()})"
                    )
                raise KafkaException(error)
            offset = int(message.offset())
            if offset >= stop:
                return True
            found.append(offset)
        return bool(found) and found[-1] >= stop - 1

    def close(self) -> None:
        self._consumer.close()
        self._view.close()

    def __enter__(self) -> KafkaTopic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
