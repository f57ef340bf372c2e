"""The columns of a decoded batch, shared by both decoders (`icefall.decode.decode` for JSON, and
`icefall.decode.avro`, which `decode` calls): names only, no Spark.

A decode result holds the Kafka columns, `BYTES_COLUMN`, `TYPED_COLUMN` (the record as the table's fields),
`BAD_COLUMN` (true: the record goes to the dead-letter table) and, when error texts are built,
`ERROR_COLUMN`. Good rows hold the spec's fields and `KAFKA_COLUMN` (keyed modes also `DELETE_COLUMN`, cdc
with `spec.sequenceBy` `SEQUENCE_COLUMN`); dead-letter rows hold `DEAD_LETTER_COLUMNS`. Columns named with
`INTERNAL_PREFIX` never reach a table.
"""

from __future__ import annotations

INTERNAL_PREFIX = "__icefall_"

KAFKA_COLUMN = "_kafka"
#: cdc with `spec.sequenceBy`: the change's position in the source, one text per path, numbers padded so
#: that arrays compare in the source's order (`icefall.decode.keyed.sequence_part`).
SEQUENCE_COLUMN = "_sequence"
DEAD_LETTER_COLUMNS = ("partition", "offset", "timestamp", "key", "value", "headers", "error", "ingested_at")

TYPED_COLUMN = f"{INTERNAL_PREFIX}typed"
#: The value's length in bytes, for the batch's observed bytes: taken with the Kafka columns, so that the
#: value itself (often the widest column) is not carried through every later step of the plan for it.
BYTES_COLUMN = f"{INTERNAL_PREFIX}bytes"
ERROR_COLUMN = f"{INTERNAL_PREFIX}error"
BAD_COLUMN = f"{INTERNAL_PREFIX}bad"
#: Keyed modes (upsert, cdc): true when the record deletes its key (a tombstone, a Debezium d event).
DELETE_COLUMN = f"{INTERNAL_PREFIX}delete"

# Intermediate columns of the JSON decoder, dropped before any output.
CORRUPT_COLUMN = f"{INTERNAL_PREFIX}corrupt"
#: The value as text; null when it is not parsed (tombstone, oversized, not UTF-8).
TEXT_COLUMN = f"{INTERNAL_PREFIX}text"
#: cdc: the text of the row image the event carries (after, or before for d).
IMAGE_COLUMN = f"{INTERNAL_PREFIX}image"
#: cdc: the Debezium envelope's op, before and after (as JSON text).
ENVELOPE_COLUMN = f"{INTERNAL_PREFIX}envelope"
#: cdc with spec.sequenceBy: the event's position (becomes `SEQUENCE_COLUMN`).
POSITION_COLUMN = f"{INTERNAL_PREFIX}sequence"
#: Keyed modes: the key fields read from the Kafka key, when needed.
KAFKA_KEY_COLUMN = f"{INTERNAL_PREFIX}kafka_key"
RAW_COLUMN = f"{INTERNAL_PREFIX}raw"
