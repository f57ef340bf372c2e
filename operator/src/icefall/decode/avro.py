"""Decode Confluent-framed Avro records with Spark: `spec.format.type: avro`.

A record's value is the Confluent wire format: magic byte 0, a 4-byte big-endian schema id, then the Avro
binary encoding of the record with that (writer) schema. `AvroDecoding.decode` returns the same columns as
`icefall.decode.decode.Decoder.decode` (so `good_rows`, `bad_rows` and `split` apply unchanged): the Kafka
columns, `TYPED_COLUMN` (the table's fields), `BAD_COLUMN` and, with `errors`, `ERROR_COLUMN`.

How a batch is decoded: with the writer schemas it is given (ingestion: every one the writer has met,
`icefall.decode.known_writers`), or else those of the schema ids present in the batch, gathered first (one
small Spark job over the first five bytes of each value) and looked up (`SchemaLookup`, in production
`icefall.kafka.registry.WriterSchemas`). Each record is decoded by spark-avro's `from_avro` (mode
PERMISSIVE) with the writer schema of its own id — one `from_avro` per id, chosen per record by a CASE on
the id, so each record is parsed once; an id without a writer schema is an unknown id. The writer's record
is then projected onto the table's fields by name (`try_cast` to the table's type; a field the writer does
not have is null; a writer whose record is the table's row as it is, is the row). The decoded frame keeps
the value's (and key's) schema id (`icefall.decode.framing`: `SCHEMA_ID_COLUMN`, `KEY_SCHEMA_ID_COLUMN`),
for the write's observation. The columns for one set of writer schemas are built once and kept
(`MAX_PLANS_KEPT`): building them costs more than a small batch.

Reasons a record goes to the dead-letter table (`error`, joined by "; " like the JSON path's):
`tombstone: the record's value is null`; `record is N bytes, over the limit of M (...)`;
`too short for the Confluent wire format: N bytes (a magic byte and a 4-byte schema id come first)`;
`wrong magic byte 0x01: not the Confluent wire format (magic byte 0x00, then a 4-byte schema id)`;
`unknown schema id 42 (the registry has no Avro schema with this id)`;
`bytes do not decode as Avro with writer schema id 7`;
`field 'amount': the writer's value does not fit decimal(10,2)`;
`required field 'id' is missing or null` (with `, and writer schema id 7 has no such field` when absent).

Keyed modes (`spec.mode` upsert and cdc, `icefall.decode.keyed` for the rules they share with JSON): the
output also holds `DELETE_COLUMN`, `KAFKA_KEY_COLUMN` and, for cdc with `spec.sequenceBy`, `POSITION_COLUMN`.
upsert: the value is the row; a tombstone deletes its key. cdc: the value is Debezium's Avro envelope
(`{before, after, source, op, ts_ms, ...}`, the row record in before and after); op c, r and u write the
after image, d deletes the key of the before image, and `spec.sequenceBy` paths read the envelope (e.g.
`source.lsn`). Key fields a row lacks come from the Kafka key, decoded like the value: a Confluent-framed
Avro key (Kafka Connect's and Debezium's AvroConverter: a record holding the key fields, read by name, or a
primitive for a one-column key) with its own writer schema (the batch's key schema ids are gathered with
the values', `BatchWriters.key_schemas`); otherwise as the JSON path reads a text key (a JSON object, or
the bare value of a one-column key), or for a one-column int or long key 4 or 8 bytes big-endian (Kafka's
IntegerSerializer, LongSerializer). The reasons are the JSON path's: `tombstone (null value): the Kafka key
gives no value for key field 'id' (...)`, `not a Debezium change event: ...` (also for a writer schema that
is not an envelope), `Debezium op 't' is not one of c, r, u, d`, `Debezium op 'c' has no after image`,
`Debezium event has no source.lsn (...)`.

Not guaranteed: bytes that happen to decode as the writer schema (Avro binary has no checksum) are taken
as that record; nested records are cast as a whole, so their fields must match the table's in number and
order. A binary key that happens to start like a frame (a zero byte, then an id the registry knows) is read
as a framed key.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the usual name
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from icefall.api import StreamingTableSpec, TableMode, to_spark_schema_json
from icefall.api.avro import IMAGE_FIELDS, envelope_row, named_records
from icefall.decode.columns import (
    BAD_COLUMN,
    DELETE_COLUMN,
    ERROR_COLUMN,
    KAFKA_KEY_COLUMN,
    POSITION_COLUMN,
    TYPED_COLUMN,
)
from icefall.decode.framing import HEADER_BYTES, KEY_SCHEMA_ID_COLUMN, SCHEMA_ID_COLUMN, Framing
from icefall.decode.keyed import Keyed, change_reasons, sequence_part

#: The writer schemas (Avro JSON text) of schema ids; None for an id the registry does not know.
SchemaLookup = Callable[[Iterable[int]], Mapping[int, str | None]]


_SCHEMA_ID = SCHEMA_ID_COLUMN
_RECORD = "__icefall_avro_"  # + schema id: the record parsed with that writer schema
_FAILED = "__icefall_avro_failed_"  # + schema id: true when the bytes did not decode
_ROW = "__icefall_avro_row"
_PROBLEM = "__icefall_avro_problem"
_KEY_SCHEMA_ID = KEY_SCHEMA_ID_COLUMN
#: Decode columns kept per set of writer schemas; a writer rarely meets more than a few sets.
MAX_PLANS_KEPT = 32
_KEY = "__icefall_avro_key_"  # + schema id: the Kafka key parsed with that writer schema
_OP = "__icefall_avro_op"
#: The Kafka keys an Avro table's key is read from, for the dead-letter reason of a delete without one.
KEY_FORMS = (
    "a Confluent-framed Avro record with the key fields, a JSON object with them, or the bare value of a "
    "one-column key"
)


class BatchWriters(dict[int, str | None]):
    """The writer schemas of a batch's values by schema id (the mapping, what the table's schema follows),
    and in keyed modes those of its Kafka keys (`key_schemas`)."""

    def __init__(
        self, values: Mapping[int, str | None], key_schemas: Mapping[int, str | None] | None = None
    ) -> None:
        super().__init__(values)
        self.key_schemas: dict[int, str | None] = dict(key_schemas or {})


class _Decoded:
    """What the records of one value schema id decode to: the row, the checks on it, and in cdc its op and
    position."""

    def __init__(
        self,
        row: Column,
        checks: Sequence[tuple[Column, Column]],
        op: Column | None = None,
        position: Column | None = None,
    ) -> None:
        self.row, self.checks, self.op, self.position = row, list(checks), op, position


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The columns that decode a batch with one set of writer schemas, added in this order."""

    schema_id: Column  # `SCHEMA_ID_COLUMN`, a known id's header matched as bytes
    parsed: list[Column]  # each in a projection of its own: one `from_avro` per writer schema
    failed: list[Column]
    by_id: list[Column]
    kafka_key: Column | None  # keyed modes
    problem: Column
    verdict: list[Column]
    internal: list[str]  # dropped at the end
    kept: list[str] = dataclasses.field(default_factory=list)  # the output's, filled by the first batch


class AvroDecoding:
    """The Avro half of `Decoder`: built once per spec, applied to each batch."""

    def __init__(
        self,
        spec: StreamingTableSpec,
        schemas: SchemaLookup,
        *,
        base: Sequence[Column],
        errors: bool = True,
    ) -> None:
        self.spec = spec
        self.fields = list(spec.format.schema_fields)
        # Nullable at every depth: `from_avro` in PERMISSIVE mode returns its whole type nullable, and Spark
        # refuses to cast a list that may hold nulls to one that may not (the write checks requiredness).
        self.targets: dict[str, DataType] = {
            f.name: _nullable(f.dataType)
            for f in StructType.fromJson(to_spark_schema_json(self.fields)).fields
        }
        self._row_struct = "struct<{}>".format(
            ", ".join(f"`{name}`: {dtype.simpleString()}" for name, dtype in self.targets.items())
        )
        self.schemas = schemas
        self.errors = errors
        self.keyed = Keyed(spec) if spec.mode is not TableMode.APPEND else None
        self.cdc = spec.mode is TableMode.CDC
        self._base = list(base)
        max_bytes = spec.dead_letter.max_record_bytes
        framing = Framing(max_bytes, "Avro schema")
        self._size_ok = framing.size_ok
        self._schema_id = framing.schema_id
        self._unaliased_schema_id = framing.schema_id_value
        self._frame_reasons = framing.frame_reasons
        key = F.col("key")
        self._plans: dict[tuple[tuple[tuple[int, str], ...], tuple[tuple[int, str], ...]], _Plan] = {}
        self._key_schema_id = F.when(
            (F.length(key) >= HEADER_BYTES) & (F.hex(F.substring(key, 1, 1)) == F.lit("00")),
            F.conv(F.hex(F.substring(key, 2, 4)), 16, 10).cast("bigint"),
        ).alias(_KEY_SCHEMA_ID)

    def schema_ids(self, framed: DataFrame) -> list[int]:
        """The schema ids of the batch's framed records (a Spark job over their headers)."""
        return Framing.schema_ids(framed)

    def writer_schemas(self, kafka_df: DataFrame) -> BatchWriters:
        """The writer schema of each schema id in `kafka_df`, and in keyed modes of each Kafka key's (one
        Spark job over the headers, then one lookup)."""
        if self.keyed is None:
            return self._writers(kafka_df.select(self._schema_id))
        return self._writers(kafka_df.select(self._schema_id, self._key_schema_id))

    def _writers(self, framed: DataFrame) -> BatchWriters:
        """`writer_schemas` of `framed` (holding `_SCHEMA_ID`, and in keyed modes `_KEY_SCHEMA_ID`)."""
        if self.keyed is None:
            return BatchWriters(self.schemas(self.schema_ids(framed)))
        ids = F.array(
            F.struct(F.lit(False).alias("key"), F.col(_SCHEMA_ID).alias("id")),
            F.struct(F.lit(True).alias("key"), F.col(_KEY_SCHEMA_ID).alias("id")),
        )
        rows = framed.select(F.inline(ids)).where(F.col("id").isNotNull()).distinct().collect()
        values = sorted(int(r["id"]) for r in rows if not r["key"])
        keys = sorted(int(r["id"]) for r in rows if r["key"])
        found = self.schemas(sorted({*values, *keys}))
        return BatchWriters({i: found.get(i) for i in values}, {i: found.get(i) for i in keys})

    def decode(
        self, kafka_df: DataFrame, headers: Column, writers: Mapping[int, str | None] | None = None
    ) -> DataFrame:
        """Decode with `writers` (value writer schemas by id; a `BatchWriters` carries the keys' too; an id
        it lacks is unknown). Default: `writer_schemas` of this input, looked up now."""
        key_id = [self._key_schema_id] if self.keyed is not None else []
        if writers is None or (self.keyed is not None and not isinstance(writers, BatchWriters)):
            looked_up = self._writers(kafka_df.select(*self._base, self._schema_id, *key_id))
            writers = looked_up if writers is None else BatchWriters(writers, looked_up.key_schemas)
        key_writers: Mapping[int, str | None] = getattr(writers, "key_schemas", None) or {}
        plan = self._plan(writers, key_writers, kafka_df.sparkSession)
        parsed = kafka_df.select(*self._base, headers, plan.schema_id, *key_id)
        for column in plan.parsed:
            parsed = parsed.select("*", column)
        rows = parsed.select("*", *plan.failed, *plan.by_id)  # (each select is analysed anew, every batch)
        if plan.kafka_key is not None:
            rows = rows.select("*", plan.kafka_key)
        checked = rows.select("*", plan.problem)
        if not plan.kept:  # the same in every batch: asked of Spark once (verdict and drop: one projection)
            plan.kept.extend(c for c in checked.columns if c not in plan.internal)
        return checked.select(*plan.kept, *plan.verdict)

    def _plan(
        self, writers: Mapping[int, str | None], key_writers: Mapping[int, str | None], spark: SparkSession
    ) -> _Plan:
        """The decode columns for these writer schemas, built on first use."""
        values = tuple((i, w) for i, w in sorted(writers.items()) if w is not None)
        keys = tuple((i, w) for i, w in sorted(key_writers.items()) if w is not None)
        plan = self._plans.get((values, keys))
        if plan is None:
            if len(self._plans) >= MAX_PLANS_KEPT:
                self._plans.clear()
            plan = self._plans[values, keys] = self._build(dict(values), dict(keys), spark)
        return plan

    def _build(
        self, writers: Mapping[int, str], key_writers: Mapping[int, str], spark: SparkSession
    ) -> _Plan:
        """`_plan`'s columns, built."""
        from pyspark.sql.avro.functions import from_avro

        row_type = StructType([StructField(name, dtype, True) for name, dtype in self.targets.items()])

        schema_id = F.col(_SCHEMA_ID)
        payload = F.expr(f"substring(value, {HEADER_BYTES + 1})")
        known = sorted(writers)
        # Each record is parsed once, with its own id's writer schema; later projections read the result.
        parsed_columns: list[Column] = []
        failed_columns: list[Column] = []
        decoded: list[tuple[int, _Decoded]] = []
        for i in known:
            writer = writers[i]
            top_fields = _record_fields(writer)
            problem = self._writer_problem(i, writer, top_fields)
            if top_fields is None or problem is not None:
                why = F.lit(problem or f"schema id {i} is not an Avro record; the table needs a record")
                decoded.append((i, _Decoded(F.lit(None).cast(self._row_struct), [(F.lit(True), why)])))
                continue
            name = f"{_RECORD}{i}"
            record = from_avro(payload, writer, {"mode": "PERMISSIVE"})
            # A generator over a one-element array is a barrier the optimizer does not inline through:
            # without it, every field access would parse the record again.
            parsed_columns.append(F.explode(F.array(F.when(schema_id == F.lit(i), record))).alias(name))
            failed_columns.append(_failed(F.col(name), top_fields).alias(f"{_FAILED}{i}"))
            # A writer whose record is the table's row as it is (names, order, types): no projection.
            exact = not self.cdc and _parsed_type(spark, record) == row_type
            failed = F.col(f"{_FAILED}{i}")
            decoded.append((i, self._decoded(i, writer, F.col(name), failed, top_fields, exact=exact)))
        key_known = sorted(key_writers)
        for i in key_known:
            key_payload = F.expr(f"substring(key, {HEADER_BYTES + 1})")
            key_record = from_avro(key_payload, key_writers[i], {"mode": "PERMISSIVE"})
            parsed_columns.append(
                F.explode(F.array(F.when(F.col(_KEY_SCHEMA_ID) == F.lit(i), key_record))).alias(f"{_KEY}{i}")
            )
        internal = [_ROW, _PROBLEM, *(f"{p}{i}" for i in known for p in (_RECORD, _FAILED))]
        kafka_key = None
        if self.keyed is not None:
            kafka_key = self._kafka_key(key_writers, key_known)
            internal += [_OP, *(f"{_KEY}{i}" for i in key_known)]
        problems = _case(schema_id, [(i, self._problem(d.checks)) for i, d in decoded])
        if problems is None:
            problems = F.lit(None).cast("string" if self.errors else "boolean")
        unknown = schema_id.isNotNull() & ~schema_id.isin(*known) if known else schema_id.isNotNull()
        return _Plan(
            schema_id=self._known_schema_id(known),
            parsed=parsed_columns,
            failed=failed_columns,
            by_id=self._by_id(decoded, schema_id),
            kafka_key=kafka_key,
            problem=problems.alias(_PROBLEM),
            verdict=[F.col(_ROW).alias(TYPED_COLUMN), *self._verdict(unknown, schema_id)],
            internal=internal,
        )

    def _known_schema_id(self, known: Sequence[int]) -> Column:
        """`SCHEMA_ID_COLUMN` as `Framing.schema_id` has it, the header of a `known` id matched as its 5
        bytes (a literal id): the hex text and base conversion only for the other records."""
        header = F.substring(F.col("value"), 1, HEADER_BYTES)
        by_header = [(i, header == F.lit(bytearray(b"\x00" + i.to_bytes(4, "big")))) for i in known]
        column = self._unaliased_schema_id
        for i, matched in reversed(by_header):
            column = F.when(self._size_ok & matched, F.lit(i).cast("bigint")).otherwise(column)
        return column.alias(_SCHEMA_ID)

    def _by_id(self, decoded: Sequence[tuple[int, _Decoded]], schema_id: Column) -> list[Column]:
        """The row of each record (by its schema id), and in keyed modes whether it deletes its key, in cdc
        its op and position."""
        row = _case(schema_id, [(i, d.row) for i, d in decoded])
        columns = [(row if row is not None else F.lit(None)).cast(self._row_struct).alias(_ROW)]
        if self.keyed is None:
            return columns
        value = F.col("value")
        if not self.cdc:
            return [*columns, value.isNull().alias(DELETE_COLUMN)]
        op = _case(schema_id, [(i, d.op) for i, d in decoded if d.op is not None])
        op = (op if op is not None else F.lit(None)).cast("string")
        columns += [
            op.alias(_OP),
            (value.isNull() | F.coalesce(op == "d", F.lit(False))).alias(DELETE_COLUMN),
        ]
        if self.keyed.sequence_by:
            position = _case(schema_id, [(i, d.position) for i, d in decoded if d.position is not None])
            position = (position if position is not None else F.lit(None)).cast("array<string>")
            columns.append(F.when(value.isNotNull(), position).alias(POSITION_COLUMN))
        return columns

    def _writer_problem(
        self, schema_id: int, writer: str, top_fields: Mapping[str, bool] | None
    ) -> str | None:
        """cdc: why the records of writer schema `schema_id` are not change events (None: they are)."""
        if not self.cdc or top_fields is None:
            return None
        parsed = json.loads(writer)
        if envelope_row(parsed) is None:
            return (
                f"not a Debezium change event: writer schema id {schema_id} is not an envelope (a record "
                "with op, and before or after holding the row's record)"
            )
        return None

    def _decoded(
        self,
        schema_id: int,
        writer: str,
        record: Column,
        failed: Column,
        top_fields: Mapping[str, bool],
        *,
        exact: bool = False,
    ) -> _Decoded:
        """The records of writer schema `schema_id`, parsed into `record`: their row and its checks; in cdc
        the envelope's row image (after, or before for op d), op and position."""
        if not self.cdc:
            projected, checks = self._projected(schema_id, record, failed, top_fields, exact=exact)
            return _Decoded(projected, checks)
        parsed = json.loads(writer)
        row = envelope_row(parsed)
        assert row is not None  # `_writer_problem` refused the others
        row_fields = _record_fields(json.dumps(row)) or {}
        op = record["op"].cast("string")
        images = [name for name in IMAGE_FIELDS if name in top_fields]
        after = record["after"] if "after" in images else F.lit(None)
        before = record["before"] if "before" in images else F.lit(None)
        image = F.when(op.isin("c", "r", "u"), after).when(op == "d", before)
        projected, checks = self._projected(schema_id, image, failed, row_fields)
        checks = [*change_reasons(~failed, op, after), *checks]
        position = None
        if self.keyed is not None and self.keyed.sequence_by:
            names = named_records(parsed)
            parts = [
                sequence_part(_path(record, parsed, path, names).cast("string"))
                for path in self.keyed.sequence_by
            ]
            position = F.array(*parts)
        return _Decoded(projected, checks, op, position)

    def _kafka_key(self, key_writers: Mapping[int, str | None], key_known: Sequence[int]) -> Column:
        """`KAFKA_KEY_COLUMN`: the key fields read from the Kafka key, for records whose row lacks one of
        them (a delete, or a value without the key field): a framed Avro key with its writer schema, else a
        text key as the JSON path reads it, else a one-column int or long key in binary."""
        assert self.keyed is not None
        keyed = self.keyed
        key_type = keyed.key_schema
        row = F.col(_ROW)
        needed = F.col(DELETE_COLUMN) | row.isNull()
        for name in keyed.key:
            needed = needed | row[name].isNull()
        plain = keyed.text_key()
        binary_bytes = {"int": 4, "long": 8}.get(keyed.key_fields[0].parsed.name)
        if len(keyed.key) == 1 and binary_bytes is not None:
            name, key = keyed.key[0], F.col("key")
            unsigned = F.conv(F.hex(key), 16, 10).cast("decimal(20,0)")
            half, whole = (
                F.lit(str(n)).cast("decimal(20,0)")
                for n in (2 ** (8 * binary_bytes - 1), 2 ** (8 * binary_bytes))
            )
            signed = F.when(unsigned >= half, unsigned - whole)
            binary = F.when(F.length(key) == binary_bytes, signed.otherwise(unsigned))
            plain = F.struct(F.coalesce(plain[name], binary.cast(key_type[name].dataType)).alias(name))
        cases: list[tuple[int, Column]] = []
        for i in key_known:
            writer = key_writers[i]
            assert writer is not None
            cases.append((i, self._avro_key(F.col(f"{_KEY}{i}"), writer)))
        from_key = plain.cast(key_type)
        if cases:
            key_id = F.col(_KEY_SCHEMA_ID)
            framed = _case(key_id, cases)
            assert framed is not None
            decoded_key = F.when(key_id.isin(*key_known), framed.cast(key_type))
            from_key = F.when(decoded_key.isNotNull(), decoded_key).otherwise(from_key)
        return F.when(needed, from_key).alias(KAFKA_KEY_COLUMN)

    def _avro_key(self, parsed: Column, writer: str) -> Column:
        """The key fields of a Kafka key parsed with its Avro `writer`: a record's fields by name, or a
        primitive as the value of a one-column key; null when the bytes did not decode."""
        assert self.keyed is not None
        key = self.keyed.key
        fields = _record_fields(writer)
        if fields is None:  # a primitive (or another non-record type)
            if len(key) != 1:
                return F.lit(None)
            return F.struct(parsed.try_cast(self.targets[key[0]]).alias(key[0]))
        values = [
            (parsed[name].try_cast(self.targets[name]) if name in fields else F.lit(None)).alias(name)
            for name in key
        ]
        return F.when(~_failed(parsed, fields), F.struct(*values))

    def _verdict(self, unknown: Column, schema_id: Column) -> list[Column]:
        """`BAD_COLUMN` and, with `errors`, `ERROR_COLUMN`: from the frame, the id and the projection; in
        keyed modes a delete needs only its key (`icefall.decode.decode._bad`)."""
        reasons = [
            *self._frame_reasons,
            (
                unknown,
                F.format_string(
                    "unknown schema id %d (the registry has no Avro schema with this id)", schema_id
                ),
            ),
            (F.col(_PROBLEM).isNotNull(), F.col(_PROBLEM)),
        ]
        keyed = self.keyed
        if self.errors:
            if keyed is not None:
                not_delete = ~F.col(DELETE_COLUMN)
                reasons = [
                    *keyed.delete_reasons(KEY_FORMS),
                    *((not_delete & c, m) for c, m in reasons),
                    *keyed.sequence_reasons(F.col(_OP)),
                ]
            error = _joined(reasons)
            return [error.isNotNull().alias(BAD_COLUMN), error.alias(ERROR_COLUMN)]
        bad = unknown | F.coalesce(F.col(_PROBLEM), F.lit(False))
        for condition, _ in self._frame_reasons:
            bad = bad | condition
        bad = F.coalesce(bad, F.lit(False))
        if keyed is not None:
            bad = F.when(F.col(DELETE_COLUMN), keyed.key_missing()).otherwise(bad) | keyed.sequence_missing()
        return [bad.alias(BAD_COLUMN)]

    def _problem(self, checks: Sequence[tuple[Column, Column]]) -> Column:
        """With `errors`, the messages of the checks that apply (null when none does); without, whether
        one does."""
        if self.errors:
            return _joined(checks)
        flag = F.lit(False)
        for condition, _ in checks:
            flag = flag | condition
        return flag

    def _projected(
        self,
        schema_id: int,
        record: Column,
        failed: Column,
        writer_fields: Mapping[str, bool],
        *,
        exact: bool = False,
    ) -> tuple[Column, list[tuple[Column, Column]]]:
        """The table's row of a record parsed with writer schema `schema_id` (`record`: its row record,
        null when it has none), and the checks on it (`failed`: the bytes did not decode, `_failed`). In
        keyed modes a key field the record lacks may come from the Kafka key. `exact`: the record's type
        is the table's row type, so the record is the row (no field is cast, none can mismatch)."""
        decoded = ~failed & record.isNotNull()
        values: list[Column] = []
        checks: list[tuple[Column, Column]] = [
            (failed, F.lit(f"bytes do not decode as Avro with writer schema id {schema_id}"))
        ]
        key = self.keyed.key if self.keyed is not None else []
        for field in self.fields:
            target = self.targets[field.name]
            if exact:
                value, mismatch, absent = record[field.name], F.lit(False), ""
            elif field.name in writer_fields:
                raw = record[field.name]
                value = raw.try_cast(target)
                mismatch = decoded & raw.isNotNull() & value.isNull()
                checks.append(
                    (
                        mismatch,
                        F.lit(f"field '{field.name}': the writer's value does not fit {field.type}"),
                    )
                )
                absent = ""
            else:
                value = F.lit(None).cast(target)
                mismatch = F.lit(False)
                absent = f", and writer schema id {schema_id} has no such field"
            if field.required:
                present = (
                    value if field.name not in key else F.coalesce(value, F.col(KAFKA_KEY_COLUMN)[field.name])
                )
                checks.append(
                    (
                        decoded & present.isNull() & ~mismatch,
                        F.lit(f"required field '{field.name}' is missing or null{absent}"),
                    )
                )
            values.append(value.alias(field.name))
        return (record if exact else F.struct(*values)), checks


def _parsed_type(spark: SparkSession, record: Column) -> DataType:
    """The Spark type `record` (a `from_avro` of the value) parses into: analysed once per plan."""
    return spark.range(0).select(F.lit(None).cast("binary").alias("value")).select(record).schema[0].dataType


def _nullable(dtype: DataType) -> DataType:
    """`dtype` with every nested element, value and field nullable."""
    if isinstance(dtype, ArrayType):
        return ArrayType(_nullable(dtype.elementType), True)
    if isinstance(dtype, MapType):
        return MapType(dtype.keyType, _nullable(dtype.valueType), True)
    if isinstance(dtype, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True) for f in dtype.fields])
    return dtype


def _case(schema_id: Column, cases: Sequence[tuple[int, Column]]) -> Column | None:
    """`cases[i]`'s column where `schema_id` is its id (null elsewhere); None without cases."""
    if not cases:
        return None
    column = F.when(schema_id == F.lit(cases[0][0]), cases[0][1])
    for i, value in cases[1:]:
        column = column.when(schema_id == F.lit(i), value)
    return column


def _path(record: Column, schema: Mapping[str, Any], path: str, named: Mapping[str, Any]) -> Column:
    """The value at the dotted `path` of `record` (parsed with the Avro record `schema`); null when the
    schema has no such field."""
    column: Column = record
    node: Any = schema
    for name in path.split("."):
        fields = node.get("fields") if isinstance(node, Mapping) else None
        found = [f for f in fields or [] if isinstance(f, Mapping) and f.get("name") == name]
        if not found:
            return F.lit(None)
        kind = found[0].get("type")
        if isinstance(kind, list):
            others = [t for t in kind if t != "null"]
            kind = others[0] if len(others) == 1 else None
        if isinstance(kind, str) and kind in named:
            kind = named[kind]
        column, node = column[name], kind if isinstance(kind, Mapping) else {}
    return column


def _failed(record: Column, writer_fields: Mapping[str, bool]) -> Column:
    """True when the bytes did not decode. `from_avro` in PERMISSIVE mode gives null, or a row of nulls,
    for bytes it cannot decode: a field the writer declares non-nullable (no union with null) is never null
    in a record that decoded. A writer whose fields are all nullable cannot tell a row of nulls apart."""
    failed = record.isNull()
    for name, nullable in writer_fields.items():
        if not nullable:
            failed = failed | record[name].isNull()
    return failed


def _record_fields(writer: str) -> dict[str, bool] | None:
    """The top-level fields of an Avro record schema, name -> nullable (a union with null, or null);
    None when the schema is not a record."""
    try:
        parsed = json.loads(writer)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        return None
    fields: dict[str, bool] = {}
    for field in parsed.get("fields", []):
        if isinstance(field, dict) and "name" in field:
            kind = field.get("type")
            fields[str(field["name"])] = kind == "null" or (isinstance(kind, list) and "null" in kind)
    return fields


def _joined(reasons: Sequence[tuple[Column, Column]]) -> Column:
    joined = F.make_valid_utf8(F.concat_ws("; ", *(F.when(c, m) for c, m in reasons)))
    return F.when(joined != "", joined)
