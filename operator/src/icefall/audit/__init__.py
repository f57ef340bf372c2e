"""The auditor behind `icefall verify`: does the table hold every committed Kafka record once, as it should?

- `table`: the audit of an append table (and its dead-letter table) against the topic, by offset and, with
  a `ContentSource`, by content (`audit_table`, `audit_from_catalog`); its docstring states what is and is
  not guaranteed. `rows` reads what it compares, `kafka` reads a live topic's offsets, `report` holds what
  it found.
- `content`: `SparkContent`, the content side on Spark (rows and records as digests).
- `keyed`: the audit of a keyed table (`spec.mode` upsert, cdc) against a model of the topic (`audit_keyed`).
- `routed`: the audit of a routed table (`spec.routes`), each destination up to its own offsets
  (`audit_routed`); `keyed_routes`: the same for keyed routes, each destination by key
  (`audit_keyed_routes`).
"""

from icefall.audit.content import SparkContent, main_digest
from icefall.audit.kafka import KafkaTopic
from icefall.audit.keyed import KeyedAuditError, KeyedAuditReport, audit_keyed
from icefall.audit.report import AuditReport, PartitionAudit
from icefall.audit.rows import (
    DEAD_LETTER,
    EXPECTED_SCHEMA,
    FILTERED,
    GOOD,
    KAFKA_COLUMN,
    ROW_SCHEMA,
    AuditError,
    ContentSource,
    RecordedTopic,
    TopicOffsets,
)
from icefall.audit.table import DLQ_SUFFIX, MAX_EXAMPLES, audit_from_catalog, audit_table, dlq_identifier

__all__ = [
    "DEAD_LETTER",
    "DLQ_SUFFIX",
    "EXPECTED_SCHEMA",
    "FILTERED",
    "GOOD",
    "KAFKA_COLUMN",
    "MAX_EXAMPLES",
    "ROW_SCHEMA",
    "AuditError",
    "AuditReport",
    "ContentSource",
    "KafkaTopic",
    "KeyedAuditError",
    "KeyedAuditReport",
    "PartitionAudit",
    "RecordedTopic",
    "SparkContent",
    "TopicOffsets",
    "audit_from_catalog",
    "audit_keyed",
    "audit_table",
    "dlq_identifier",
    "main_digest",
]
