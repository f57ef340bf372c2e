"""Read-only views of a topic: its id, its partitions, their watermarks, and offsets for a timestamp.

Uses a consumer that never joins a group and never commits: Icefall's progress lives in the table,
not in Kafka consumer groups. Every read is `read_committed` (`ISOLATION`), not overridable: the high
watermark is the last stable offset, so a batch never plans past an open transaction, and records of
aborted transactions are never read. The topic id tells a topic from one deleted and created again under
the same name, whose offsets start over.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

#: The one isolation level of every Kafka read (Spark's source, planning, the audit): committed records only.
ISOLATION = {"isolation.level": "read_committed"}


_REFUSED_CREDENTIALS = {
    KafkaError._AUTHENTICATION,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
}

# librdkafka's words (OpenSSL's, mostly) for a TLS setup the brokers and this client cannot agree on; a TLS
# connection that merely drops (a broker restarting mid-handshake) says none of them and stays an outage.
_UNTRUSTED_BROKER = ("certificate verify failed",)
_REFUSED_CLIENT_CERT = (
    "alert bad certificate",
    "alert certificate required",
    "alert unknown ca",
    "alert certificate unknown",
)
_NOT_TLS = ("connecting to a PLAINTEXT broker listener",)


@dataclass(frozen=True)
class Refusal:
    """The brokers refused this client's security settings: what happened, and what to fix."""

    what: str  # e.g. "refused the credentials"
    fix: str  # names the spec fields

    def message(self, bootstrap: str, topic: str, reason: object) -> str:
        return f"Kafka at {bootstrap} {self.what} for topic '{topic}' ({reason}): {self.fix}"


def refusal(error: KafkaError) -> Refusal | None:
    """The refusal `error` says (not an outage: retrying will not help), or None for any other error."""
    text = error.str()
    if error.code() in _REFUSED_CREDENTIALS:
        return Refusal(
            "refused the credentials",
            "check spec.source.security (username, password, saslMechanism) and the Secret or variables it "
            "references",
        )
    if any(marker in text for marker in _UNTRUSTED_BROKER):
        return Refusal(
            "presented a certificate this client does not trust",
            "check spec.source.security.caCert (the PEM bundle of the CA that signed the brokers' "
            "certificates, which must name the hosts of spec.source.bootstrapServers) and the Secret or "
            "variable it references",
        )
    if any(marker in text for marker in _REFUSED_CLIENT_CERT):
        return Refusal(
            "refused the client certificate",
            "check spec.source.security.clientCert and clientKey (a pair signed by a CA the brokers trust; "
            "the listener requires mutual TLS) and the Secrets or variables they reference",
        )
    if any(marker in text for marker in _NOT_TLS):
        return Refusal(
            "does not speak TLS on that port",
            "check spec.source.security.protocol against the listener of spec.source.bootstrapServers",
        )
    return None


class TopicNotFoundError(RuntimeError):
    pass


class KafkaUnavailableError(RuntimeError):
    """The brokers did not answer (or refused): names the bootstrap servers and the topic."""


class KafkaCredentialsRefusedError(KafkaUnavailableError):
    """The brokers answered but refused the credentials or the TLS settings (an untrusted broker certificate,
    a refused client certificate, TLS against a plaintext listener): a configuration error, not an outage."""


class TopicView:
    def __init__(self, bootstrap: str, topic: str, config: Mapping[str, Any] | None = None) -> None:
        self.topic = topic
        self.bootstrap = bootstrap
        # librdkafka reports refused credentials and TLS failures only to error_cb (calls just time out):
        # kept, with what to fix, to name them
        # (a list: shared with the views `sibling` makes, whose clients are this view's)
        self._refused: list[tuple[KafkaError, Refusal]] = []
        # librdkafka's own log would repeat "connection refused" every backoff while a broker is down; every
        # failure reaches the caller as an exception instead (refused credentials through error_cb).
        self._client_config = {
            "bootstrap.servers": bootstrap,
            "log_level": 0,
            **(config or {}),
            "error_cb": self._on_error,
        }
        self._consumer = self._reader()
        self._admin: AdminClient | None = None
        self._owner = True  # closes the clients (a `sibling` does not)

    def sibling(self, topic: str) -> TopicView:
        """A view of `topic` on the same brokers through this view's clients (no new connection); closing
        this view closes them, closing the sibling does nothing."""
        if self._admin is None:
            self._admin = AdminClient(self._client_config)
        view = copy.copy(self)
        view.topic = topic
        view._owner = False
        return view

    def _reader(self, **settings: Any) -> Consumer:
        """A consumer of this view's client settings that reads read_committed and never joins a group."""
        return Consumer(
            {
                **self._client_config,
                "group.id": "icefall-metadata",  # required by the client; never joined or committed
                "enable.auto.commit": False,
                **settings,
                **ISOLATION,
            }
        )

    def _on_error(self, error: KafkaError) -> None:
        refused = refusal(error)
        if refused is not None:
            self._refused[:] = [(error, refused)]

    def _unavailable(self, error: KafkaException) -> KafkaUnavailableError:
        self._consumer.poll(0)  # serves the error callbacks queued during the failed call
        if self._admin is not None:
            self._admin.poll(0)
        reason = error.args[0] if error.args else error
        refused = refusal(reason) if isinstance(reason, KafkaError) else None
        if refused is None and self._refused:
            reason, refused = self._refused[0]
        if refused is not None:
            return KafkaCredentialsRefusedError(refused.message(self.bootstrap, self.topic, reason))
        return KafkaUnavailableError(
            f"cannot reach Kafka at {self.bootstrap} for topic '{self.topic}': {reason}"
        )

    def partitions(self, timeout: float = 10) -> list[int]:
        try:
            metadata = self._consumer.list_topics(self.topic, timeout=timeout)
        except KafkaException as error:
            raise self._unavailable(error) from None
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None:
            raise TopicNotFoundError(
                f"topic '{self.topic}' does not exist on the cluster (spec.source); create it first"
            )
        return sorted(topic.partitions)

    def listed_topics(self, timeout: float = 10) -> set[str]:
        """The names of the topics the cluster lists now (one metadata request of this view's consumer)."""
        try:
            metadata = self._consumer.list_topics(timeout=timeout)
        except KafkaException as error:
            raise self._unavailable(error) from None
        return {name for name, topic in metadata.topics.items() if topic.error is None}

    def topic_id(self, timeout: float = 10) -> str:
        """The topic's id (a UUID in Kafka's base64 form): it changes when the topic is deleted and created
        again under the same name."""
        if self._admin is None:
            self._admin = AdminClient(self._client_config)
        futures = self._admin.describe_topics(TopicCollection([self.topic]), request_timeout=timeout)
        future = futures[self.topic]
        try:
            description = future.result(timeout=timeout + 5)
        except KafkaException as e:
            if e.args and getattr(e.args[0], "code", lambda: None)() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise TopicNotFoundError(
                    f"topic '{self.topic}' does not exist on the cluster (spec.source); create it first"
                ) from None
            raise self._unavailable(e) from None
        return str(description.topic_id)

    def watermarks(self, timeout: float = 10, *, total: float | None = None) -> dict[int, tuple[int, int]]:
        """(low, high) per partition: the first retained offset and the next offset to be written. Each
        request waits at most `timeout`; with `total`, the whole call at most that (the operator's reads of
        a tenant's brokers: a topic of many partitions on a broker that answers slowly)."""
        deadline = None if total is None else time.monotonic() + total
        marks: dict[int, tuple[int, int]] = {}
        for partition in self.partitions(timeout):
            wait = timeout if deadline is None else min(timeout, deadline - time.monotonic())
            if wait <= 0:
                raise KafkaUnavailableError(
                    f"cannot read the watermarks of topic '{self.topic}' at {self.bootstrap} within "
                    f"{total} s ({len(marks)} partitions read)"
                )
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, partition), timeout=wait, cached=False
                )
            except KafkaException as error:
                raise self._unavailable(error) from None
            marks[partition] = (int(low), int(high))
        return marks

    def produce_times(self, offsets: Mapping[int, int], timeout: float = 5) -> dict[int, int]:
        """The produce time (epoch ms) of the first committed record at or after each partition's offset,
        for the partitions that have one within `timeout` (the oldest record a table has not yet read)."""
        if not offsets:
            return {}
        reader = self._reader(**{
            "auto.offset.reset": "earliest",  # an offset retention deleted: the first one left
            "max.partition.fetch.bytes": 65536,  # one record is wanted, not a full fetch
        })  # fmt: skip
        times: dict[int, int] = {}
        try:
            reader.assign([TopicPartition(self.topic, p, o) for p, o in offsets.items()])
            deadline = time.monotonic() + timeout
            while len(times) < len(offsets) and time.monotonic() < deadline:
                message = reader.poll(min(0.5, max(deadline - time.monotonic(), 0)))
                if message is None or message.error() is not None:
                    continue
                partition = message.partition()
                if partition is None or partition in times:
                    continue
                kind, timestamp = message.timestamp()
                if kind != TIMESTAMP_NOT_AVAILABLE:
                    times[partition] = timestamp
                reader.pause([TopicPartition(self.topic, partition)])
        finally:
            reader.close()
        return times

    def oldest_waiting_ms(
        self, committed: Mapping[int, int], marks: Mapping[int, tuple[int, int]], timeout: float = 5
    ) -> int | None:
        """The produce time of the oldest record past a table's `committed` offsets, given the watermarks
        `marks` (what freshness is measured from: `plan.lag`); None when none waits or a partition with
        records waiting did not answer within `timeout`."""
        positions = {p: max(committed.get(p, low), low) for p, (low, _) in marks.items()}
        waiting = {p: o for p, o in positions.items() if o < marks[p][1]}
        times = self.produce_times(waiting, timeout)
        return min(times.values()) if waiting and len(times) == len(waiting) else None

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
        if self._owner:
            self._consumer.close()

    def __enter__(self) -> TopicView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
