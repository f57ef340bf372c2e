"""Confluent's wire format around a record value: magic byte 0, a 4-byte big-endian schema id, then the
encoded record. Spark column expressions for the schema id of each record and the reasons a frame is
refused, for every registry format (`icefall.decode.avro` uses the header checks, and words its unknown-id
reason itself).

Reasons, worded as the Avro decoder words them: `tombstone: the record's value is null`;
`record is N bytes, over the limit of M (spec.deadLetter.maxRecordBytes)`;
`too short for the Confluent wire format: N bytes (...)`; `wrong magic byte 0x01: not the Confluent wire
format (...)`; `unknown schema id 42 (the registry has no JSON Schema with this id)`.

Use: select `schema_id`, then `known(writers)` on that frame; the reasons read both columns. The writers
are those the ingestion writer has met (`icefall.decode.known_writers`): the decoded frame keeps
`SCHEMA_ID_COLUMN`, and `observed_ids` are the aggregates that name the batch's ids as it is written.
Audits and union reads ask first (`schema_ids`: a Spark job over the headers, then the registry).
Not here: what follows the header (a Protobuf message index, the payload's own decoding).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the usual name

#: The wire format's header: magic byte 0 and the 4-byte schema id.
HEADER_BYTES = 5
#: The schema id of a well-framed record (null otherwise), and whether the registry knows it.
SCHEMA_ID_COLUMN = "__icefall_schema_id"
KNOWN_COLUMN = "__icefall_schema_known"
#: The schema id of a framed Kafka key (keyed Avro tables), null otherwise.
KEY_SCHEMA_ID_COLUMN = "__icefall_key_schema_id"
#: The names of `observed_ids`' aggregates.
SCHEMA_IDS, KEY_SCHEMA_IDS = "schema_ids", "key_schema_ids"

Check = tuple[Column, Column]


class Framing:
    """The frame checks of one spec (`max_bytes`: `spec.deadLetter.maxRecordBytes`); `kind` names the
    registry's schemas of the format in messages ("JSON Schema", "Protobuf schema")."""

    def __init__(self, max_bytes: int, kind: str) -> None:
        value = F.col("value")
        size = F.length(value)
        #: The value is long enough for the header and within the size limit.
        self.size_ok = size_ok = value.isNotNull() & (size >= HEADER_BYTES) & (size <= max_bytes)
        magic_ok = F.substring(value, 1, 1) == F.lit(bytearray(b"\x00"))  # bytes: no hex text per record
        #: The id alone, unnamed (`schema_id` is it as `SCHEMA_ID_COLUMN`).
        self.schema_id_value = F.when(
            size_ok & magic_ok, F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("bigint")
        )
        self.schema_id = self.schema_id_value.alias(SCHEMA_ID_COLUMN)
        schema_id = F.col(SCHEMA_ID_COLUMN)
        #: The frame is right and the registry has the id's schema (of this format).
        self.ok = F.col(KNOWN_COLUMN)
        #: Why a frame is refused before its schema id is looked at (every registry format).
        self.frame_reasons: list[Check] = [
            (value.isNull(), F.lit("tombstone: the record's value is null")),
            (
                value.isNotNull() & (size > max_bytes),
                F.format_string(
                    f"record is %d bytes, over the limit of {max_bytes} (spec.deadLetter.maxRecordBytes)",
                    size,
                ),
            ),
            (
                value.isNotNull() & (size < HEADER_BYTES),
                F.format_string(
                    "too short for the Confluent wire format: %d bytes (a magic byte and a 4-byte schema id "
                    "come first)",
                    size,
                ),
            ),
            (
                size_ok & ~magic_ok,
                F.concat(
                    F.lit("wrong magic byte 0x"),
                    F.lower(F.hex(F.substring(value, 1, 1))),
                    F.lit(": not the Confluent wire format (magic byte 0x00, then a 4-byte schema id)"),
                ),
            ),
        ]
        self.reasons: list[Check] = [
            *self.frame_reasons,
            (
                schema_id.isNotNull() & ~self.ok,
                F.format_string(f"unknown schema id %d (the registry has no {kind} with this id)", schema_id),
            ),
        ]

    @staticmethod
    def schema_ids(framed: DataFrame) -> list[int]:
        """The schema ids of `framed`'s records (a frame with `schema_id`): one Spark job over them."""
        rows = framed.where(F.col(SCHEMA_ID_COLUMN).isNotNull()).select(SCHEMA_ID_COLUMN).distinct().collect()
        return sorted(int(row[0]) for row in rows)

    @staticmethod
    def known(writers: Mapping[int, object | None]) -> Column:
        """`KNOWN_COLUMN` for a batch whose ids have `writers` (None: the registry has no such schema)."""
        ids = sorted(i for i, writer in writers.items() if writer is not None)
        found = F.col(SCHEMA_ID_COLUMN).isin(*ids) if ids else F.lit(False)
        return F.coalesce(found, F.lit(False)).alias(KNOWN_COLUMN)


def observed_ids(*, keys: bool) -> list[Column]:
    """Aggregates over a decoded frame that keeps its id columns: the distinct value schema ids
    (`SCHEMA_IDS`) and, with `keys`, the distinct Kafka key schema ids (`KEY_SCHEMA_IDS`); for the write's
    observation, so that no job of its own reads the batch for them."""
    ids = [F.collect_set(SCHEMA_ID_COLUMN).alias(SCHEMA_IDS)]
    return [*ids, F.collect_set(KEY_SCHEMA_ID_COLUMN).alias(KEY_SCHEMA_IDS)] if keys else ids
