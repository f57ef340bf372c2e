"""Send dead-letter rows to a Kafka topic (`spec.deadLetter.topic`). Delivery is AT LEAST ONCE.

Each bad record goes out with its original key and value (a tombstone stays a tombstone) and its original
headers, followed by these headers (UTF-8 text):

- `icefall.error`: why it cannot be ingested (the dead-letter `error` column, see `icefall.decode.decode`);
- `icefall.source.topic`, `icefall.source.topic-id`, `icefall.source.partition`, `icefall.source.offset`:
  where it came from (the topic id is Kafka's, so it changes when the topic is deleted and created again);
- `icefall.source.timestamp`: its Kafka timestamp in the source topic, epoch milliseconds;
- `icefall.epoch`: the epoch of the writer that sent it (a re-send after a take-over carries a newer one);
- `icefall.dedupe-key`: `<source topic id>/<partition>/<offset>`, the dedupe key (below; the id is base64
  and may hold '/': split it from the right).

Kafka headers may repeat a key: if the original record already had one of these (a dead letter that was
replayed into the source, say), the original stays and Icefall's comes after it, so take the last one.
The dead-letter record's own timestamp is the time it was produced.

At least once, not exactly once: the engine sends a batch's dead letters BEFORE it commits the batch to the
table (so no committed batch ever misses its dead letters), and a crash, a lost lease or a refused commit
between the two replays the batch, which sends its dead letters again (possibly from another writer, with
another epoch). Consumers of the dead-letter topic that need each bad record once keep the first record
per `icefall.dedupe-key` (`dedupe_key`): it is unique per source record, identical in every re-send, and,
because it holds the topic id rather than the name, a topic deleted and created again (whose offsets start
over) never makes two different records share a key. Records sent before topic ids were stored carry no
topic id (the key's first part is empty).

The producer is idempotent (no duplicates from its own retries), uses acks=all and the Java client's
murmur2 partitioner (records with the same key land in the same partition as a Java producer would put
them). `produce_dead_letters` returns only once every record is acknowledged; any delivery error raises
`DeadLetterDeliveryError` so the caller does not commit the batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from icefall.runtime.failpoints import failpoint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ERROR_HEADER = "icefall.error"
SOURCE_TOPIC_HEADER = "icefall.source.topic"
SOURCE_TOPIC_ID_HEADER = "icefall.source.topic-id"
SOURCE_PARTITION_HEADER = "icefall.source.partition"
SOURCE_OFFSET_HEADER = "icefall.source.offset"
SOURCE_TIMESTAMP_HEADER = "icefall.source.timestamp"
EPOCH_HEADER = "icefall.epoch"
DEDUPE_KEY_HEADER = "icefall.dedupe-key"

#: Producer settings Icefall needs; `kafka_config` may override the others (timeouts, security, ...).
_REQUIRED = {"enable.idempotence": True, "acks": "all"}
_DEFAULTS: dict[str, Any] = {
    "partitioner": "murmur2_random",
    "linger.ms": 20,
    # Bounds how long a batch waits for an unreachable cluster before it fails (librdkafka: 300 s).
    "message.timeout.ms": 120_000,
}

Header = tuple[str, bytes | None]


class _Message(NamedTuple):
    key: bytes | None
    value: bytes | None
    headers: list[Header]


class DeadLetterDeliveryError(RuntimeError):
    """A dead-letter record was not acknowledged by the cluster; the batch must not be committed."""


@dataclass(frozen=True)
class Source:
    """Where a batch's records come from, as the dead-letter headers name it."""

    topic: str
    topic_id: str | None = None  # Kafka's id of the topic (None: unknown, e.g. a table of an older version)
    epoch: int = 0  # the writer's lease epoch


def dedupe_key(topic_id: str | None, partition: int, offset: int) -> str:
    """The value of `icefall.dedupe-key`: one per source record, the same in every re-send."""
    return f"{topic_id or ''}/{partition}/{offset}"


def header(headers: list[Header] | None, name: str) -> bytes | None:
    """The last value of header `name` (Icefall's come after the record's own), or None."""
    found = [value for key, value in headers or [] if key == name]
    return found[-1] if found else None


def produce_dead_letters(
    bad: DataFrame,
    *,
    bootstrap: str,
    topic: str,
    source: Source,
    kafka_config: Mapping[str, str] | None = None,
) -> int:
    """Send every row of `bad` (`icefall.decode.decode` dead-letter columns) to `topic`; returns how many.

    `kafka_config`: extra librdkafka producer properties (security, timeouts); idempotence and acks=all
    cannot be turned off. Rows are collected to the driver one Spark partition at a time.
    Raises `DeadLetterDeliveryError` unless every record was acknowledged.
    """
    from confluent_kafka import KafkaException, Producer

    rows = _records(bad)
    first = next(rows, None)
    if first is None:
        return 0  # no connection at all for the usual batch without bad records
    config: dict[str, Any] = {**_DEFAULTS, **(kafka_config or {}), **_REQUIRED}
    config["bootstrap.servers"] = bootstrap
    producer = Producer(config)
    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(f"{err} (source partition {_coordinates(msg)})")

    sent = 0
    try:
        for row in itertools.chain([first], rows):
            _produce(producer, topic, _message(row, source), on_delivery)
            sent += 1
            failpoint("dlq-topic.mid-produce")
            if failures:
                break
        pending = producer.flush(float(config["message.timeout.ms"]) / 1000 + 30)
    except KafkaException as error:
        raise DeadLetterDeliveryError(
            f"sending dead letters to topic '{topic}' failed after {sent} records: {error}"
        ) from error
    if failures or pending:
        shown = "; ".join(failures[:3]) + (f" and {len(failures) - 3} more" if len(failures) > 3 else "")
        problem = shown or f"{pending} records still unacknowledged after the flush timeout"
        raise DeadLetterDeliveryError(f"dead letters to topic '{topic}' were not all delivered: {problem}")
    return sent


def _records(bad: DataFrame) -> Iterator[Any]:
    """(partition, offset, timestamp ms, key, value, headers, error) per row, streamed to the driver."""
    from pyspark.sql import functions as F  # noqa: N812 - the usual name

    rows: Iterator[Any] = bad.select(
        "partition",
        "offset",
        F.unix_millis("timestamp").alias("timestamp_ms"),  # not a datetime: no time-zone guessing
        "key",
        "value",
        "headers",
        "error",
    ).toLocalIterator()
    return rows


def _message(row: Any, source: Source) -> _Message:
    headers: list[Header] = [(h["key"], _bytes(h["value"])) for h in row["headers"] or []]
    headers += [
        (ERROR_HEADER, str(row["error"]).encode()),
        (SOURCE_TOPIC_HEADER, source.topic.encode()),
        (SOURCE_TOPIC_ID_HEADER, (source.topic_id or "").encode()),
        (SOURCE_PARTITION_HEADER, str(row["partition"]).encode()),
        (SOURCE_OFFSET_HEADER, str(row["offset"]).encode()),
    ]
    if row["timestamp_ms"] is not None:
        headers.append((SOURCE_TIMESTAMP_HEADER, str(row["timestamp_ms"]).encode()))
    headers += [
        (EPOCH_HEADER, str(source.epoch).encode()),
        (DEDUPE_KEY_HEADER, dedupe_key(source.topic_id, row["partition"], row["offset"]).encode()),
    ]
    return _Message(_bytes(row["key"]), _bytes(row["value"]), headers)


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _produce(producer: Any, topic: str, message: _Message, callback: Any) -> None:
    while True:
        try:
            producer.produce(
                topic, key=message.key, value=message.value, headers=message.headers, on_delivery=callback
            )
        except BufferError:  # the local queue is full: let deliveries drain, then try again
            producer.poll(0.5)
            continue
        producer.poll(0)
        return


def _coordinates(msg: Any) -> str:
    found = dict(msg.headers() or [])
    partition = found.get(SOURCE_PARTITION_HEADER, b"?").decode()
    offset = found.get(SOURCE_OFFSET_HEADER, b"?").decode()
    return f"{partition}, offset {offset}"
