"""`spec.source`: the Kafka topic a StreamingTable follows, where it starts, and how it connects.

Guarantees:
- Credentials (usernames, passwords, CA bundles, client keys) are only ever references (`SecretRef`);
  an inline value is rejected with a message that says how to reference it, without echoing it.
- The free-form consumer `properties` are an allow-list of tuning settings (fetch sizes, timeouts,
  backoffs, `client.rack`, `group.id`; `icefall.api.code_properties`): what Icefall manages (bootstrap
  servers, security, offsets, deserialisers) is rejected with the spec field to use instead, and settings
  that load code (`config.providers`, `*.class`, `interceptor.classes`, ...) or are simply not listed are
  rejected with that reason.
- `onDataLoss` says what ingestion does when Kafka's retention deleted records it had not read yet:
  `Continue` (the default) goes on from the earliest record left and counts the skipped ones in the table
  (`icefall.lost-records`, Degraded reason DataLoss); `Halt` skips nothing and stops ingestion (reason
  DataLossHalted) until a person decides.
- Exactly one of `topic`, `topics` and `topicPattern` (`icefall.api.topic_pattern`: whole-name match,
  internal topics left out, costly patterns refused). `topics` and `topicPattern` are the topics form:
  offsets and topic ids by topic; a pattern's topics are found while the table runs
  (`icefall.kafka.topic_set`).
- `startingPosition` only matters the first time a table is filled. Afterwards ingestion resumes from the
  offsets committed in the table, and partitions added to the topic later are read from their earliest
  offset (as Spark does), so no record in a new partition is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from icefall.api.base import (
    BOOTSTRAP_PATTERN,
    PROPERTY_KEY_PATTERN,
    TOPIC_PATTERN,
    ApiModel,
    ProblemCollector,
    SecretRef,
    looks_secret,
)
from icefall.api.code_properties import kafka_property_problem
from icefall.api.topic_pattern import MAX_PATTERN_LENGTH, compiled, pattern_problem, selects

#: Consumer properties Icefall sets itself, and the spec field that controls each.
MANAGED_CONSUMER_PROPERTIES = {
    "bootstrap.servers": "spec.source.bootstrapServers",
    "security.protocol": "spec.source.security.protocol",
    "sasl.mechanism": "spec.source.security.saslMechanism",
    "sasl.jaas.config": "spec.source.security (username and password references)",
    "auto.offset.reset": "spec.source.startingPosition",
    "isolation.level": "nothing: Icefall always reads committed records only (read_committed)",
    "enable.auto.commit": "nothing: offsets are committed in the Iceberg table",
    "key.deserializer": "nothing: records are read as bytes and decoded by spec.format",
    "value.deserializer": "nothing: records are read as bytes and decoded by spec.format",
    "interceptor.classes": "nothing: Spark's Kafka source does not allow consumer interceptors",
}


#: Most topics one table reads (`topics`): a bound for the CRD's CEL cost and for one Spark read's options.
MAX_TOPICS = 64

#: One Kafka topic name.
TopicName = Annotated[str, Field(min_length=1, max_length=249, pattern=TOPIC_PATTERN)]

#: How often a pattern's topics are listed again, unless `properties` sets metadata.max.age.ms (Kafka's own
#: knob for it; its default, 5 minutes, is long for a table that is seconds behind its topics).
DEFAULT_TOPIC_REFRESH_SECONDS = 30.0

#: Most consumer properties a table sets (the allow-list is shorter; a bound the CRD's CEL cost needs).
MAX_CONSUMER_PROPERTIES = 64


class StartingPositionType(StrEnum):
    """Where a new table starts reading the topic."""

    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"


class StartingPosition(ApiModel):
    """Where to start reading when the table has no committed offsets yet."""

    type: StartingPositionType = Field(
        default=StartingPositionType.EARLIEST,
        description=(
            "earliest: the oldest record Kafka still holds; latest: only records produced after the first "
            "start; timestamp: the first record at or after timestampMs."
        ),
    )
    timestamp_ms: int | None = Field(
        default=None,
        ge=0,
        description="Start time in milliseconds since the Unix epoch; required for type timestamp only.",
    )

    @model_validator(mode="after")
    def _timestamp_iff_type(self) -> StartingPosition:
        problems = ProblemCollector()
        if self.type is StartingPositionType.TIMESTAMP and self.timestamp_ms is None:
            problems.add(("timestampMs",), "type timestamp needs timestampMs (milliseconds since the epoch)")
        if self.type is not StartingPositionType.TIMESTAMP and self.timestamp_ms is not None:
            problems.add(
                ("timestampMs",),
                "timestampMs only applies to type timestamp; remove it or set type: timestamp",
            )
        problems.raise_if_any()
        return self


class OnDataLoss(StrEnum):
    """What ingestion does when retention deleted records it had not read yet."""

    CONTINUE = "Continue"
    HALT = "Halt"


class SecurityProtocol(StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)


class SaslMechanism(StrEnum):
    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


class KafkaSecurity(ApiModel):
    """How to connect to the brokers. Every credential is a reference, never a value."""

    protocol: SecurityProtocol = Field(
        default=SecurityProtocol.PLAINTEXT, description="Kafka security.protocol."
    )
    sasl_mechanism: SaslMechanism | None = Field(
        default=None, description="SASL mechanism; required with SASL_PLAINTEXT and SASL_SSL."
    )
    username: SecretRef | None = Field(default=None, description="Reference to the SASL username.")
    password: SecretRef | None = Field(default=None, description="Reference to the SASL password.")
    ca_cert: SecretRef | None = Field(
        default=None,
        description="Reference to a PEM bundle of CA certificates to trust; default: the system trust store.",
    )
    client_cert: SecretRef | None = Field(
        default=None, description="Reference to the PEM client certificate, for mutual TLS."
    )
    client_key: SecretRef | None = Field(
        default=None, description="Reference to the PEM client private key, for mutual TLS."
    )

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        problems = ProblemCollector()
        protocol = self.protocol
        if protocol.uses_sasl:
            for name, value in (
                ("saslMechanism", self.sasl_mechanism),
                ("username", self.username),
                ("password", self.password),
            ):
                if value is None:
                    problems.add((name,), f"protocol {protocol.value} needs {name}; add it")
        else:
            for name, value in (
                ("saslMechanism", self.sasl_mechanism),
                ("username", self.username),
                ("password", self.password),
            ):
                if value is not None:
                    problems.add(
                        (name,), f"{name} is only used with SASL; remove it or set protocol: SASL_SSL"
                    )
        if not protocol.uses_tls:
            for name, value in (
                ("caCert", self.ca_cert),
                ("clientCert", self.client_cert),
                ("clientKey", self.client_key),
            ):
                if value is not None:
                    problems.add(
                        (name,), f"{name} is only used with TLS; remove it or set protocol: SSL or SASL_SSL"
                    )
        elif (self.client_cert is None) != (self.client_key is None):
            missing = "clientKey" if self.client_key is None else "clientCert"
            problems.add((missing,), "mutual TLS needs both clientCert and clientKey; add " + missing)
        problems.raise_if_any()
        return self


class KafkaSource(ApiModel):
    """The Kafka topic to ingest."""

    bootstrap_servers: str = Field(
        description="Comma-separated host:port list of Kafka brokers, e.g. kafka-0:9092,kafka-1:9092.",
        min_length=1,
        max_length=4096,
        pattern=BOOTSTRAP_PATTERN,
    )
    topic: str | None = Field(
        default=None,
        description=(
            "Kafka topic to read. Immutable: a table follows one topic for its whole life. Exactly one of "
            "topic, topics and topicPattern."
        ),
        min_length=1,
        max_length=249,
        pattern=TOPIC_PATTERN,
    )
    topics: list[TopicName] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_TOPICS,
        description=(
            "Kafka topics to read into the one table, instead of topic (exactly one of the three; a table "
            "keeps the form it was created with). Offsets, topic ids and lag are kept per topic and "
            "partition, and each row names its topic (_kafka.topic). Topics may be added while the table "
            "runs: a topic new to a table that already holds offsets is read from its earliest record, "
            "whatever startingPosition says; a topic removed keeps its committed offsets and is read again "
            "from them if it comes back."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    topic_pattern: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PATTERN_LENGTH,
        description=(
            "A regular expression selecting the topics to read into the one table, instead of topic or "
            "topics (exactly one of the three; a table keeps the form it was created with). The whole name "
            "must match, as in Kafka's pattern subscription (Java's Pattern.matches); it is matched with "
            "Python's re.fullmatch, so use the syntax the two share. Kafka's internal topics "
            "(__consumer_offsets, __transaction_state) never match; other names starting with '_' (such "
            "as _schemas) only match a pattern that starts with '_'. Backreferences and a group repeated "
            "without bound that repeats inside, such as (a+)+, are refused. The topic list is read again "
            "at most every metadata.max.age.ms (properties; default 30000): a topic that starts matching "
            "is read from its earliest record once the table holds offsets; one that stops matching or "
            "is deleted is no longer read (a log line says so), keeps its committed offsets in the "
            "table, and is read again from them if it matches again. Offsets, topic ids and lag are kept "
            "per topic and partition, as with topics."
        ),
    )
    starting_position: StartingPosition = Field(
        default_factory=StartingPosition,
        description="Where a new table starts reading; ignored once the table has committed offsets.",
    )
    security: KafkaSecurity = Field(
        default_factory=KafkaSecurity, description="Connection security; credentials by reference only."
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_CONSUMER_PROPERTIES,
        description=(
            "Extra Kafka consumer properties, without Spark's 'kafka.' prefix, from an allow-list of "
            "tuning settings: fetch sizes and waits (fetch.max.bytes, max.poll.records, ...), timeouts, "
            "backoffs, client.rack, client.id, group.id. Values are strings."
        ),
    )

    on_data_loss: OnDataLoss = Field(
        default=OnDataLoss.CONTINUE,
        description=(
            "When Kafka's retention deleted records before they were ingested. Continue: go on from the "
            "earliest record left; the skipped ones are counted in the table (icefall.lost-records) and "
            "reported (Degraded, reason DataLoss). Halt: skip nothing and stop ingesting (Ready and "
            "Ingesting False, reason DataLossHalted) until this is set to Continue for the skip to happen."
        ),
    )

    @model_validator(mode="after")
    def _one_form(self) -> KafkaSource:
        problems = ProblemCollector()
        given = [
            f
            for f, v in (("topic", self.topic), ("topics", self.topics), ("topicPattern", self.topic_pattern))
            if v is not None
        ]
        if not given:
            problems.add(
                ("topic",),
                "is required; add it: the Kafka topic to read (or topics: [...] or topicPattern: <regex> "
                "to read several)",
            )
        if len(given) > 1:
            problems.add(
                (given[-1],),
                "name the topic to read (topic: <name>), the topics (topics: [...]) or a pattern "
                f"(topicPattern: <regex>), one of them only (not {' and '.join(given)})",
            )
        if self.topic_pattern is not None and (problem := pattern_problem(self.topic_pattern)) is not None:
            problems.add(("topicPattern",), problem)
        if self.topics is not None:
            for i, name in enumerate(self.topics):
                if name in self.topics[:i]:
                    problems.add(("topics", i), f"{name!r} is listed twice; remove one")
        problems.raise_if_any()
        return self

    @property
    def by_topic(self) -> bool:
        """The topics form (`topics` or `topicPattern`): offsets, rows and dead letters are kept by topic."""
        return self.topics is not None or self.topic_pattern is not None

    @property
    def topic_names(self) -> tuple[str, ...]:
        """The topics named, in the order given (one, in the one-topic form; none with `topicPattern`: its
        topics are what Kafka lists, `select_topics`)."""
        if self.topic_pattern is not None:
            return ()
        return tuple(self.topics) if self.topics is not None else (self.topic or "",)

    @property
    def first_topic(self) -> str:
        """The one topic, or the first of `topics` (a registry format's subject, log lines); with
        `topicPattern`, the pattern (what Kafka clients name in their messages)."""
        return self.topic_pattern if self.topic_pattern is not None else self.topic_names[0]

    @property
    def topics_text(self) -> str:
        """The topics, for messages: `'orders'`, `'orders-eu', 'orders-us'`, or `pattern 'orders-.*'`."""
        if self.topic_pattern is not None:
            return f"pattern {self.topic_pattern!r}"
        return ", ".join(repr(t) for t in self.topic_names)

    def reads(self, topic: str) -> bool:
        """Whether this source reads `topic`: one it names, or one its pattern selects."""
        if self.topic_pattern is not None:
            return selects(compiled(self.topic_pattern), topic)
        return topic in self.topic_names

    def select_topics(self, listed: Iterable[str]) -> tuple[str, ...]:
        """The topics this source reads of those a cluster lists: the named ones (listed or not: a missing
        one is an error where it is read), or those the pattern selects, sorted."""
        if self.topic_pattern is None:
            return self.topic_names
        pattern = compiled(self.topic_pattern)
        return tuple(sorted(t for t in set(listed) if selects(pattern, t)))

    @property
    def topic_refresh_seconds(self) -> float:
        """How often a pattern's topics are listed again: `metadata.max.age.ms` of `properties` (at least
        1 s), else `DEFAULT_TOPIC_REFRESH_SECONDS`."""
        try:
            return max(1.0, int(self.properties["metadata.max.age.ms"]) / 1000)
        except (KeyError, ValueError):
            return DEFAULT_TOPIC_REFRESH_SECONDS

    @field_validator("properties")
    @classmethod
    def _plain_properties(cls, value: dict[str, str]) -> dict[str, str]:
        problems = ProblemCollector()
        for key in value:
            if key.startswith("kafka."):
                problems.add((key,), f"write consumer properties without the 'kafka.' prefix: {key[6:]!r}")
            bare = key.removeprefix("kafka.")
            if bare in MANAGED_CONSUMER_PROPERTIES:
                problems.add((key,), f"{bare} is set by Icefall; use {MANAGED_CONSUMER_PROPERTIES[bare]}")
            elif looks_secret(bare) or bare.startswith(("ssl.", "sasl.")):
                problems.add(
                    (key,),
                    f"{bare} is security configuration; set it through spec.source.security "
                    "with secret references",
                )
            elif re.fullmatch(PROPERTY_KEY_PATTERN, key) is None:
                problems.add((key,), "property names use letters, digits, '.', '_' and '-'")
            elif (problem := kafka_property_problem(bare)) is not None:
                problems.add((key,), problem)
        problems.raise_if_any()
        return value
