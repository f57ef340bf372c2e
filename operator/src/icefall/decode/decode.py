"""Decode a batch of Kafka records with Spark: good rows for the table, bad rows for the dead-letter table.

Input is what Spark's Kafka batch source returns (with `includeHeaders=true`; without it `headers` is
null): `key, value, topic, partition, offset, timestamp, timestampType, headers`. `prepare` returns

- `good`: the spec's columns (Spark types per `icefall.api.to_spark_ddl`) and `_kafka`
  struct<partition int, offset bigint, timestamp timestamp>, then `spec.transforms` applied: `select`
  expressions over those columns (`_kafka` is kept even when `select` leaves it out), then `filter`.
  A record the filter drops is in neither output.
- `bad`: `partition, offset, timestamp, key, value, headers, error, ingested_at` (`DEAD_LETTER_COLUMNS`),
  one row per record that cannot be ingested. `error` lists every reason found, joined by "; ":
  `tombstone: the record's value is null`;
  `record is N bytes, over the limit of M (spec.deadLetter.maxRecordBytes)` (the value is not parsed);
  `malformed JSON: '<start of value>'`, `malformed JSON: the value is empty`,
  `not a JSON object (got an array): '<start of value>'`;
  `field 'amount': '1.234567890125E11' does not fit decimal(10,2)` (raw value, truncated);
  `a nested value does not fit the schema: '<start of value>'` (a mismatch below the top level);
  `required field 'customer.id' is missing or null` (also inside present structs, and `items[].sku` for
  structs in lists, `attrs{}.x` in map values); `list 'tags' holds a null element, but spec says
  elementRequired`; `map 'attrs' holds a null value, but spec says valueRequired`;
  `field 'id': 'abc' does not fit uuid`; `field 'h': '<base64>' does not fit fixed[16]`.

How JSON maps to types (Spark's JSON reader, `from_json` in PERMISSIVE mode):
- timestamptz: an ISO-8601 string (no offset = UTC, the session time zone) or a JSON integer of epoch
  SECONDS (a fraction does not fit; a time outside the years 1 to 9999, as epoch milliseconds read as
  seconds give, is `field 'ts': '+55840-11-08 22:15:23' is outside the years 1 to 9999 (...)`);
  timestamp (no zone): an ISO-8601 string without offset, numbers do not fit; date: "YYYY-MM-DD".
- decimal(P,S): a number or a numeric string, rounded half-up to S digits; more than P digits does not fit.
- binary and fixed[N]: base64 strings. uuid: a canonical UUID string. string: any value (objects and
  arrays as their JSON text).
- Fields not in the schema are ignored; text after the first JSON value is ignored.

JSON Schema (`spec.format.type: jsonSchema`): the JSON text after the Confluent wire format's header, read
as above into the table's fields; the frame's reasons come first (`icefall.decode.framing`: tombstone, too
short, wrong magic byte, `unknown schema id 42 (the registry has no JSON Schema with this id)`, also for an
id whose schema is of another type). Avro and Protobuf: `icefall.decode.avro`, `icefall.decode.protobuf`.

Keyed modes (`spec.mode` upsert, cdc; `icefall.decode.keyed`): the good rows carry `DELETE_COLUMN` (true for a
record that deletes its key: a tombstone, a Debezium d event), a delete needs only its key, a Debezium event
is decoded from its row image (after, or before for d), and key fields missing from the image come from the
Kafka key (Avro: `icefall.decode.avro`, the same rules and reasons). Errors of keyed modes: `tombstone
(null value): the Kafka key gives no value for key field 'id' ...`, `delete (op d, or a tombstone): the
before image nor the Kafka key gives ...`, `not a Debezium change event: it has no op (nor payload.op)`,
`Debezium op 't' is not one of c, r, u, d`, `Debezium op 'c' has no after image`.

Guarantees: every input row is in exactly one of good, bad, or filtered out (one boolean, `BAD_COLUMN`,
splits them); everything is Spark column expressions (no Python UDF). Each output re-reads its input:
persist `kafka_df`, or call `decode` and persist its result, then `split` it, to decode once. The good
rows alone (`good_rows` of `decode(..., errors=False)`) build no error text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the usual name
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

from icefall.api import FormatType, SchemaField, StreamingTableSpec, TableMode, to_spark_schema_json
from icefall.decode import columns
from icefall.decode.columns import CORRUPT_COLUMN, POSITION_COLUMN, RAW_COLUMN, TEXT_COLUMN
from icefall.decode.framing import HEADER_BYTES, KNOWN_COLUMN, Framing, observed_ids
from icefall.decode.keyed import Keyed, image_column
from icefall.decode.protobuf import PAYLOAD_COLUMN, payload
from icefall.decode.reasons import (
    RECORD_QUOTE_CHARS,
    VALUE_QUOTE_CHARS,
    Check,
    describe,
    json_problem,
    quote,
    value_checks,
)

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

    from icefall.decode.avro import AvroDecoding, SchemaLookup

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
#: The columns of a decode result, named by `icefall.decode.columns` (the Avro decoder shares them).
KAFKA_COLUMN = columns.KAFKA_COLUMN
SEQUENCE_COLUMN = columns.SEQUENCE_COLUMN
_RANK = "__icefall_rank"  # `last_changes`: a change's rank among its key's, latest first
DEAD_LETTER_COLUMNS = columns.DEAD_LETTER_COLUMNS
TYPED_COLUMN = columns.TYPED_COLUMN
BYTES_COLUMN = columns.BYTES_COLUMN
ERROR_COLUMN = columns.ERROR_COLUMN
BAD_COLUMN = columns.BAD_COLUMN
DELETE_COLUMN = columns.DELETE_COLUMN


@dataclass(frozen=True)
class Prepared:
    good: DataFrame
    bad: DataFrame


def prepare(kafka_df: DataFrame, spec: StreamingTableSpec, *, now_expr: Column | None = None) -> Prepared:
    """Decode and validate `kafka_df`; `now_expr` gives `ingested_at` (default `current_timestamp()`)."""
    return split(decode(kafka_df, spec), spec, now_expr=now_expr)


def decode(kafka_df: DataFrame, spec: StreamingTableSpec, *, errors: bool = True) -> DataFrame:
    """One row per record: the Kafka columns of `DEAD_LETTER_COLUMNS`, `TYPED_COLUMN` (the decoded struct),
    `BAD_COLUMN` (true when the record cannot be ingested) and, with `errors`, `ERROR_COLUMN` (why; null
    exactly when `BAD_COLUMN` is false). Without `errors` no error text is built: the good rows cost only
    the parse and the checks. Persist it to decode once, then `split` it. To decode many batches with one
    spec, build a `Decoder` once."""
    return Decoder(spec, errors=errors).decode(kafka_df)


class Decoder:
    """`decode` for one spec, its Spark expressions built once and applied to each batch's input.

    Building the expressions takes hundreds of py4j calls, and each `withColumn` analyses the whole plan
    again: about 0.3 s per batch, more than reading and decoding a small batch takes. A Decoder builds the
    columns once, and `decode` adds them in three projections.
    """

    def __init__(
        self, spec: StreamingTableSpec, *, errors: bool = True, schemas: SchemaLookup | None = None
    ) -> None:
        self._avro: AvroDecoding | None = None
        self._framing: Framing | None = None
        self._frame_reasons: list[Check] | None = None
        self._schemas: SchemaLookup | None = None
        if spec.format.type is FormatType.AVRO:
            self._init_registry_format(spec, errors=errors, schemas=schemas)
            return
        fields = spec.format.schema_fields
        max_bytes = spec.dead_letter.max_record_bytes
        typed_schema = StructType.fromJson(to_spark_schema_json(fields)).add(CORRUPT_COLUMN, StringType())
        loose_schema = StructType(
            [StructField(f.name, StringType()) for f in fields] + [StructField(CORRUPT_COLUMN, StringType())]
        )
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
        value = F.col("value")
        self.spec = spec
        self._base = _kafka_columns(spec)
        self._headers = F.col("headers").alias("headers")
        self._no_headers = F.lit(None).cast(HEADERS_TYPE).alias("headers")
        self._text = F.when(
            value.isNotNull() & (F.length(value) <= max_bytes) & F.is_valid_utf8(value.cast("string")),
            value.cast("string"),
        ).alias(TEXT_COLUMN)
        if spec.format.type is not FormatType.JSON:
            self._init_framing(spec, schemas)
        self._keyed = Keyed(spec) if spec.mode is not TableMode.APPEND else None
        # Separate projections, so the optimizer keeps each parse in one place (it does not inline a costly
        # expression that is referenced several times).
        self._typed = F.from_json(F.col(image_column(spec)), typed_schema, options).alias(TYPED_COLUMN)
        self._bad = _bad(fields, self._keyed).alias(BAD_COLUMN)
        self._raw: Column | None = None
        self._error: Column | None = None
        self._good_filter = ~F.col(BAD_COLUMN)
        self._good = _good_columns(spec, self._keyed)
        if errors:
            text, typed = F.col(image_column(spec)), F.col(TYPED_COLUMN)
            typed_failed = text.isNotNull() & (typed.isNull() | typed[CORRUPT_COLUMN].isNotNull())
            # The loose parse (every field as text) only runs for records the typed parse rejected: it
            # tells a malformed record from one whose fields do not fit, for the error text.
            self._raw = F.when(typed_failed, F.from_json(text, loose_schema, options)).alias(RAW_COLUMN)
            self._error = _error(_reasons(fields, max_bytes, self._keyed, self._frame_reasons)).alias(
                ERROR_COLUMN
            )

    def _init_framing(self, spec: StreamingTableSpec, schemas: SchemaLookup | None) -> None:
        """JSON Schema and Protobuf: JSON text from what follows the wire format's header
        (`icefall.decode.framing`), read as json is. The text is there only for a record whose frame is
        right and whose schema id the registry knows; `_frame_reasons` say why else it is not."""
        self._schemas = schemas if schemas is not None else _registry_lookup(spec)
        max_bytes = spec.dead_letter.max_record_bytes
        if spec.format.type is FormatType.PROTOBUF:
            self._framing = framing = Framing(max_bytes, "Protobuf schema")
            decoded = F.col(PAYLOAD_COLUMN)
            self._text = F.when(framing.ok, decoded["json"]).alias(TEXT_COLUMN)
            problem: Check = (framing.ok & decoded["problem"].isNotNull(), decoded["problem"])
        else:
            self._framing = framing = Framing(max_bytes, "JSON Schema")
            body = F.expr(f"substring(value, {HEADER_BYTES + 1})")
            text = body.cast("string")
            self._text = F.when(framing.ok & F.is_valid_utf8(text), text).alias(TEXT_COLUMN)
            problem = (
                framing.ok & ~F.is_valid_utf8(text),
                F.concat(
                    F.lit("the value is not valid UTF-8 text, as JSON must be; its first bytes after "),
                    F.lit("the header: 0x"),
                    F.hex(F.substring(body, 1, 32)),
                ),
            )
        self._frame_reasons = [*framing.reasons, problem]

    def _payload(self, writers: Mapping[int, str | None]) -> list[Column]:
        """The columns a batch with `writers` needs before its text: Protobuf's decoded payload."""
        return [payload(writers)] if self.spec.format.type is FormatType.PROTOBUF else []

    def _init_registry_format(
        self, spec: StreamingTableSpec, *, errors: bool, schemas: SchemaLookup | None
    ) -> None:
        """A registry format (`spec.format.registry`): decoded by `icefall.decode.avro`."""
        from icefall.decode.avro import AvroDecoding

        if schemas is None:
            schemas = _registry_lookup(spec)
        self.spec = spec
        self._headers = F.col("headers").alias("headers")
        self._no_headers = F.lit(None).cast(HEADERS_TYPE).alias("headers")
        self._avro = AvroDecoding(spec, schemas, base=_kafka_columns(spec), errors=errors)
        self._good_filter = ~F.col(BAD_COLUMN)
        self._good = _good_columns(spec, self._avro.keyed)

    def good_rows(self, decoded: DataFrame, carry: Sequence[str] = ()) -> DataFrame:
        """`good_rows` (module function) of a `decode` result of this decoder; `carry`: columns of `decoded`
        kept beside the table's (a routed batch's destination: `icefall.ingest.routes`)."""
        good = decoded.where(self._good_filter).select(*self._good, *carry)
        return _transformed(good, self.spec, carry)

    @property
    def uses_registry(self) -> bool:
        """A registry format: records decode with writer schemas by id."""
        return self._avro is not None or self._framing is not None

    def writer_schemas(self, kafka_df: DataFrame) -> Mapping[int, str | None] | None:
        """A registry format: the writer schema of each schema id in `kafka_df` (a Spark job over the
        records' headers); None for json."""
        if self._framing is not None and self._schemas is not None:
            return self._schemas(self._framing.schema_ids(kafka_df.select(self._framing.schema_id)))
        return self._avro.writer_schemas(kafka_df) if self._avro is not None else None

    def observed_ids(self) -> list[Column]:
        """A registry format: aggregates naming the schema ids of a `decode` result's records
        (`icefall.decode.framing.observed_ids`: values, and for a keyed Avro table keys); json: none."""
        if not self.uses_registry:
            return []
        return observed_ids(keys=self._avro is not None and self._avro.keyed is not None)

    def decode(self, kafka_df: DataFrame, writers: Mapping[int, str | None] | None = None) -> DataFrame:
        """`decode` of `kafka_df` (module function) with this decoder's spec; a registry format with
        `writers` (`writer_schemas` of this input; default: looked up now)."""
        headers = self._headers if "headers" in kafka_df.columns else self._no_headers
        if self._avro is not None:
            return self._avro.decode(kafka_df, headers, writers)
        internal = [TEXT_COLUMN]
        if self._framing is not None:
            if writers is None:
                writers = self.writer_schemas(kafka_df)
            assert writers is not None
            framed = kafka_df.select(*self._base, headers, self._framing.schema_id)
            decoded = self._payload(writers)
            text = framed.select("*", self._framing.known(writers), *decoded).select("*", self._text)
            internal += [KNOWN_COLUMN, *(PAYLOAD_COLUMN for _ in decoded)]  # the id is kept (observed_ids)
        else:
            text = kafka_df.select(*self._base, headers, self._text)
        if self._keyed is not None:
            text = self._keyed.changes(text)
            internal += self._keyed.internal
        typed = text.select("*", self._typed)
        if self._keyed is not None:
            typed = typed.select("*", self._keyed.kafka_key)
        if self._raw is None or self._error is None:
            return typed.select("*", self._bad).drop(*internal)
        return typed.select("*", self._raw).select("*", self._bad, self._error).drop(*internal, RAW_COLUMN)


def _kafka_columns(spec: StreamingTableSpec) -> list[Column]:
    """The Kafka source's columns a decoded row keeps (`topic` too in a table of several topics)."""
    columns = [
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("bigint").alias("offset"),
        F.col("timestamp").cast("timestamp").alias("timestamp"),
        F.col("key").cast("binary").alias("key"),
        F.col("value").cast("binary").alias("value"),
        F.length(F.col("value")).alias(BYTES_COLUMN),
    ]
    if spec.source.by_topic:
        columns.append(F.col("topic").cast("string").alias("topic"))
    return columns


def split(decoded: DataFrame, spec: StreamingTableSpec, *, now_expr: Column | None = None) -> Prepared:
    """Good rows (transforms applied) and bad rows of a `decode` result."""
    return Prepared(
        good=good_rows(decoded, spec),
        bad=bad_rows(decoded, now_expr=now_expr, by_topic=spec.source.by_topic),
    )


def good_rows(decoded: DataFrame, spec: StreamingTableSpec) -> DataFrame:
    """The table's rows of a `decode` result (with or without `errors`): `spec.transforms` applied."""
    keyed = Keyed(spec) if spec.mode is not TableMode.APPEND else None
    return _transformed(decoded.where(~F.col(BAD_COLUMN)).select(*_good_columns(spec, keyed)), spec)


def _good_columns(spec: StreamingTableSpec, keyed: Keyed | None) -> list[Column]:
    typed = F.col(TYPED_COLUMN)
    columns = [
        *[
            (keyed.column(f.name) if keyed is not None else typed[f.name]).alias(f.name)
            for f in spec.format.schema_fields
        ],
        F.struct(
            F.col("partition"),
            F.col("offset"),
            F.col("timestamp"),
            *([F.col("topic")] if spec.source.by_topic else []),
        ).alias(KAFKA_COLUMN),
    ]
    if keyed is not None and keyed.sequence_by:
        columns.append(F.col(POSITION_COLUMN).alias(SEQUENCE_COLUMN))
    if keyed is not None:
        columns.append(F.col(DELETE_COLUMN))
    return columns


def with_every_column(rows: DataFrame, schema: Schema | None) -> DataFrame:
    """`rows` with the table's top-level columns they lack (a field the spec no longer has) as nulls."""
    if schema is None:
        return rows
    missing = [f for f in schema.fields if f.name not in rows.columns]
    if not missing:
        return rows
    from icefall.api import fields_from_iceberg

    types = StructType.fromJson(to_spark_schema_json(fields_from_iceberg(schema.as_struct())))
    return rows.select("*", *(F.lit(None).cast(types[f.name].dataType).alias(f.name) for f in missing))


def last_changes(changes: DataFrame, key: Sequence[str]) -> DataFrame:
    """The last of `changes` (good rows of a keyed mode) per key: the highest (partition, offset), or with
    `SEQUENCE_COLUMN` (cdc with `spec.sequenceBy`) the highest (sequence, partition, offset).

    Within a partition that is Kafka's order. A key written to several partitions has no order between
    them: the highest partition's last change wins here, and across batches the later batch's. Keys must be
    partition-stable, as Kafka's default partitioner keeps them (`icefall verify` counts the keys that
    are not, and does not judge them), unless the source's position orders them (`spec.sequenceBy`; a
    tombstone has none and loses to every change event).
    """
    from pyspark.sql import Window

    # Descending with nulls last: a change without a sequence (a tombstone) ranks below every one with.
    sequence = [F.col(SEQUENCE_COLUMN).desc()] if SEQUENCE_COLUMN in changes.columns else []
    order = [*sequence, F.col(f"{KAFKA_COLUMN}.partition").desc(), F.col(f"{KAFKA_COLUMN}.offset").desc()]
    # `row_number() = 1`, not `max_by(struct(every column), ...)`: an aggregation buffer holding strings
    # cannot be hashed, so that sorted the whole batch; a rank limit cuts each task's rows to one per key
    # before the shuffle (Spark's window group limit). bench/results/format_costs.md.
    rank = F.row_number().over(Window.partitionBy(*key).orderBy(*order))
    return changes.select("*", rank.alias(_RANK)).where(F.col(_RANK) == 1).drop(_RANK)


def _transformed(good: DataFrame, spec: StreamingTableSpec, carry: Sequence[str] = ()) -> DataFrame:
    """`spec.transforms` on the good rows. `_kafka` (and in keyed modes the delete flag, and `carry`) is
    kept even when `select` leaves it out; a delete is never filtered out (it carries only its key, which
    the filter may not be able to judge, and deleting a key that is not there changes nothing)."""
    transforms = spec.transforms
    keep = [KAFKA_COLUMN] + ([DELETE_COLUMN] if spec.mode is not TableMode.APPEND else [])
    keep += [SEQUENCE_COLUMN] if spec.sequence_by else []
    keep += list(carry)
    if transforms.select is not None:
        projected = good.selectExpr(*transforms.select)
        missing = [c for c in keep if c not in projected.columns]
        if missing:
            projected = good.selectExpr(*transforms.select, *missing)
        good = projected
    if transforms.filter is not None:
        condition = F.expr(transforms.filter)
        if DELETE_COLUMN in keep:
            condition = F.col(DELETE_COLUMN) | condition
        good = good.where(condition)
    return good


#: A dead letter's reason as a bounded metric label (`icefall_records_dead_lettered_total{reason}`): the
#: kind of its first message (JSON, keyed, Avro, JSON Schema and Protobuf messages alike), matched on how
#: the message starts.
REASON_KINDS: tuple[tuple[str, str], ...] = (
    ("delete_without_key", r"^(tombstone \(null value\)|delete \(op d, or a tombstone\)): "),
    ("tombstone", r"^tombstone: "),
    ("too_large", r"^record is \d+ bytes, over the limit"),
    ("not_utf8", r"^the value is not valid UTF-8"),
    ("malformed_json", r"^(malformed JSON|not a JSON object)"),
    ("not_a_change_event", r"^(not a Debezium change event|Debezium op )"),
    ("wire_format", r"^(too short for the Confluent wire format|wrong magic byte)"),
    ("unknown_schema_id", r"^unknown schema id"),
    (
        "undecodable",
        r"^(bytes do not decode as (Avro|protobuf)|schema id \d+ is not an Avro record"
        r"|(the )?message index )",
    ),
    ("required_missing", r"^required field "),
    ("null_element", r"^(list|map) '.*' holds a null"),
    ("type_mismatch", r"^(field '|a nested value does not fit)"),
)
OTHER_REASON = "other"


def reason_kind(error: Column) -> Column:
    """The `REASON_KINDS` label of an error text (`OTHER_REASON` for a message no kind matches)."""
    kind = F.when(F.lit(False), F.lit(None))
    for name, pattern in REASON_KINDS:
        kind = kind.when(error.rlike(pattern), F.lit(name))
    return kind.otherwise(F.lit(OTHER_REASON))


def bad_rows(decoded: DataFrame, *, now_expr: Column | None = None, by_topic: bool = False) -> DataFrame:
    """The dead-letter rows (`DEAD_LETTER_COLUMNS`, then `topic` with `by_topic`: a table of several
    topics) of a `decode` result made with `errors`."""
    return decoded.where(F.col(BAD_COLUMN)).select(
        *DEAD_LETTER_COLUMNS[:6],
        F.col(ERROR_COLUMN).alias("error"),
        (now_expr if now_expr is not None else F.current_timestamp()).cast("timestamp").alias("ingested_at"),
        *(["topic"] if by_topic else []),
    )


# --- reasons -------------------------------------------------------------------------------------------


def _registry_lookup(spec: StreamingTableSpec) -> SchemaLookup:
    """The writer schemas of `spec.format.registry`, of the spec's format."""
    from icefall.kafka.registry import WriterSchemas

    assert spec.format.registry is not None  # the spec requires it for registry formats
    return WriterSchemas(spec.format.registry, format_type=spec.format.type).lookup


def _reasons(
    fields: Sequence[SchemaField],
    max_bytes: int,
    keyed: Keyed | None = None,
    framed: Sequence[Check] | None = None,
) -> list[Check]:
    """Every reason a record cannot be ingested: (condition, message) pairs, in the order they are listed.

    A message is never null or empty where its condition is true (it quotes only values the condition
    found present), so a record has an error text exactly when one condition is true (`_bad`, `_error`).
    In keyed modes a delete needs only its key (`Keyed.delete_reasons`); everything else is checked on
    the row image (the value, or a Debezium event's after image).
    """
    if keyed is None:
        return _row_reasons(fields, max_bytes, F.col(TEXT_COLUMN), None, framed)
    row = _row_reasons(fields, max_bytes, F.col(keyed.image), keyed)
    not_delete = ~F.col(DELETE_COLUMN)
    return [*keyed.delete_reasons(), *((not_delete & c, m) for c, m in row), *keyed.sequence_reasons()]


def _row_reasons(
    fields: Sequence[SchemaField],
    max_bytes: int,
    text: Column,
    keyed: Keyed | None,
    framed: Sequence[Check] | None = None,
) -> list[Check]:
    """`_reasons` of a record that writes a row, `text` being the JSON text of the row."""
    typed, raw = F.col(TYPED_COLUMN), F.col(RAW_COLUMN)
    typed_failed = text.isNotNull() & (typed.isNull() | typed[CORRUPT_COLUMN].isNotNull())
    json_bad = typed_failed & (raw.isNull() | raw[CORRUPT_COLUMN].isNotNull())
    fields_bad = typed_failed & ~json_bad
    decoded = text.isNotNull() & ~json_bad
    # a top-level field whose JSON value is there but does not parse as its type
    mismatches = [fields_bad & raw[field.name].isNotNull() & typed[field.name].isNull() for field in fields]
    return [
        *(_value_reasons(max_bytes, keyed) if framed is None else framed),
        (json_bad, json_problem(text)),
        *_mismatch_reasons(fields, mismatches, fields_bad, text),
        *_field_reasons(fields, mismatches, decoded, keyed),
    ]


def _value_reasons(max_bytes: int, keyed: Keyed | None) -> list[Check]:
    """The record's value cannot be read as JSON text: a tombstone, too large, not UTF-8, or (keyed) no
    envelope."""
    value = F.col("value")
    size = F.length(value)
    return [
        (value.isNull(), F.lit("tombstone: the record's value is null")),
        (
            value.isNotNull() & (size > max_bytes),
            F.format_string(
                f"record is %d bytes, over the limit of {max_bytes} (spec.deadLetter.maxRecordBytes)", size
            ),
        ),
        (
            value.isNotNull() & (size <= max_bytes) & F.col(TEXT_COLUMN).isNull(),
            F.concat(
                F.lit("the value is not valid UTF-8 text, as JSON must be; its first bytes: 0x"),
                F.hex(F.substring(value, 1, 32)),
            ),
        ),
        *(keyed.envelope_reasons() if keyed is not None else ()),
    ]


def _mismatch_reasons(
    fields: Sequence[SchemaField], mismatches: Sequence[Column], fields_bad: Column, text: Column
) -> list[Check]:
    """The JSON parsed but the typed parse did not: each top-level field that does not fit, or, when none
    is to blame, a nested value."""
    raw = F.col(RAW_COLUMN)
    reasons: list[Check] = [
        (
            mismatch,
            F.concat(
                F.lit(f"field '{field.name}': "),
                quote(raw[field.name], VALUE_QUOTE_CHARS),
                F.lit(f" does not fit {describe(field)}"),
            ),
        )
        for field, mismatch in zip(fields, mismatches, strict=True)
    ]
    any_mismatch = F.lit(False)
    for mismatch in mismatches:
        any_mismatch = any_mismatch | mismatch
    reasons.append(
        (
            fields_bad & ~any_mismatch,
            F.concat(F.lit("a nested value does not fit the schema: "), quote(text, RECORD_QUOTE_CHARS)),
        )
    )
    return reasons


def _field_reasons(
    fields: Sequence[SchemaField], mismatches: Sequence[Column], decoded: Column, keyed: Keyed | None
) -> list[Check]:
    """In a decoded row: a required field missing (unless it was there but did not fit), or a value that
    fails its type's checks (`value_checks`)."""
    typed = F.col(TYPED_COLUMN)
    reasons: list[Check] = []
    for field, mismatch in zip(fields, mismatches, strict=True):
        column = keyed.column(field.name) if keyed is not None else typed[field.name]
        if field.required:
            reasons.append(
                (
                    decoded & column.isNull() & ~mismatch,
                    F.lit(f"required field '{field.name}' is missing or null"),
                )
            )
        for condition, message in value_checks(field, column, field.name, quotable=True):
            reasons.append((decoded & condition, message))
    return reasons


def _bad(fields: Sequence[SchemaField], keyed: Keyed | None = None) -> Column:
    """True when a record cannot be ingested (never null), without the loose parse or any message.

    The same records as "some reason of `_reasons` applies": the value is not parsed (null, over the size
    limit, not UTF-8: `TEXT_COLUMN` is null), the typed parse failed (malformed JSON or a field that does not
    fit: every such reason requires it), a required field is missing, or a value check fails. `_reasons`
    tells these apart only to word the message.
    """
    # No test of the text itself: where it is null (not parsed), so is the typed parse of it, and a plan
    # that read the text here would carry it, row after row, through every later step.
    typed = F.col(TYPED_COLUMN)
    conditions = [typed.isNull(), typed[CORRUPT_COLUMN].isNotNull()]
    for field in fields:
        column = keyed.column(field.name) if keyed is not None else typed[field.name]
        if field.required:
            conditions.append(column.isNull())
        checks = value_checks(field, column, field.name, quotable=True)
        conditions.extend(condition for condition, _ in checks)
    found = F.lit(False)
    for condition in conditions:
        found = found | F.coalesce(condition, F.lit(False))
    if keyed is None:
        return found
    return F.when(F.col(DELETE_COLUMN), keyed.key_missing()).otherwise(found) | keyed.sequence_missing()


def _error(reasons: Sequence[Check]) -> Column:
    """The messages of the reasons that apply, joined by "; "; null when none does."""
    # Reasons quote parts of the record: never let bytes that are not UTF-8 into a string column.
    joined = F.make_valid_utf8(F.concat_ws("; ", *(F.when(c, m) for c, m in reasons)))
    return F.when(joined != "", joined)
