"""Decode Confluent-framed Avro records with Spark: `spec.format.type: avro`.

A record's value is the Confluent wire format: magic byte 0, a 4-byte big-endian schema id, then the Avro
binary encoding of the record with that (writer) schema. `AvroDecoding.decode` returns the same columns as
`icefall.ingest.decode.Decoder.decode` (so `good_rows`, `bad_rows` and `split` apply unchanged): the Kafka
columns, `TYPED_COLUMN` (the table's fields), `BAD_COLUMN` and, with `errors`, `ERROR_COLUMN`.

How a batch is decoded: the schema ids present in the batch are gathered first (one small Spark job over
the first five bytes of each value), their writer schemas are looked up (`SchemaLookup`, in production
`icefall.kafka.registry.WriterSchemas`), and each record is decoded by spark-avro's `from_avro` (mode
PERMISSIVE) with the writer schema of its own id — one `from_avro` per id, chosen per record by a CASE on
the id, so each record is parsed once. The writer's record is then projected onto the table's fields by
name (`try_cast` to the table's type; a field the writer does not have is null).

Reasons a record goes to the dead-letter table (`error`, joined by "; " like the JSON path's):
`tombstone: the record's value is null`; `record is N bytes, over the limit of M (...)`;
`too short for the Confluent wire format: N bytes (a magic byte and a 4-byte schema id come first)`;
`wrong magic byte 0x01: not the Confluent wire format (magic byte 0x00, then a 4-byte schema id)`;
`unknown schema id 42 (the registry has no Avro schema with this id)`;
`bytes do not decode as Avro with writer schema id 7`;
`field 'amount': the writer's value does not fit decimal(10,2)`;
`required field 'id' is missing or null` (with `, and writer schema id 7 has no such field` when absent).

Not guaranteed: bytes that happen to decode as the writer schema (Avro binary has no checksum) are taken
as that record; nested records are cast as a whole, so their fields must match the table's in number and
order. Keyed modes (upsert, cdc) are not supported with Avro yet (refused by the spec).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the usual name
from pyspark.sql.types import ArrayType, DataType, MapType, StructField, StructType

from icefall.api import StreamingTableSpec, to_spark_schema_json
from icefall.ingest.columns import BAD_COLUMN, ERROR_COLUMN, TYPED_COLUMN

#: The writer schemas (Avro JSON text) of schema ids; None for an id the registry does not know.
SchemaLookup = Callable[[Iterable[int]], Mapping[int, str | None]]

#: The wire format's header: magic byte 0 and the 4-byte schema id.
HEADER_BYTES = 5

_SCHEMA_ID = "__icefall_schema_id"
_RECORD = "__icefall_avro_"  # + schema id: the record parsed with that writer schema
_FAILED = "__icefall_avro_failed_"  # + schema id: true when the bytes did not decode
_ROW = "__icefall_avro_row"
_PROBLEM = "__icefall_avro_problem"


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
        self._base = list(base)
        max_bytes = spec.dead_letter.max_record_bytes
        value = F.col("value")
        size = F.length(value)
        self._size_ok = value.isNotNull() & (size >= HEADER_BYTES) & (size <= max_bytes)
        magic_ok = F.hex(F.substring(value, 1, 1)) == F.lit("00")
        self._schema_id = F.when(
            self._size_ok & magic_ok, F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("bigint")
        ).alias(_SCHEMA_ID)
        self._frame_reasons: list[tuple[Column, Column]] = [
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
                self._size_ok & ~magic_ok,
                F.concat(
                    F.lit("wrong magic byte 0x"),
                    F.lower(F.hex(F.substring(value, 1, 1))),
                    F.lit(": not the Confluent wire format (magic byte 0x00, then a 4-byte schema id)"),
                ),
            ),
        ]

    def schema_ids(self, framed: DataFrame) -> list[int]:
        """The schema ids of the batch's framed records (a Spark job over their headers)."""
        rows = framed.where(F.col(_SCHEMA_ID).isNotNull()).select(_SCHEMA_ID).distinct().collect()
        return sorted(int(row[0]) for row in rows)

    def writer_schemas(self, kafka_df: DataFrame) -> Mapping[int, str | None]:
        """The writer schema of each schema id in `kafka_df` (a Spark job over the headers, then a lookup)."""
        return self.schemas(self.schema_ids(kafka_df.select(self._schema_id)))

    def decode(
        self, kafka_df: DataFrame, headers: Column, writers: Mapping[int, str | None] | None = None
    ) -> DataFrame:
        """Decode with `writers` (`writer_schemas` of this input; default: looked up now)."""
        from pyspark.sql.avro.functions import from_avro

        framed = kafka_df.select(*self._base, headers, self._schema_id)
        if writers is None:
            writers = self.schemas(self.schema_ids(framed))
        schema_id = F.col(_SCHEMA_ID)
        payload = F.expr(f"substring(value, {HEADER_BYTES + 1})")
        known = sorted(i for i, writer in writers.items() if writer is not None)
        # Each record is parsed once, with its own id's writer schema; later projections read the result.
        parsed_columns: list[Column] = []
        failed_columns: list[Column] = []
        rows: list[tuple[int, Column, Column]] = []
        for i in known:
            writer = writers[i]
            assert writer is not None
            writer_fields = _record_fields(writer)
            if writer_fields is None:
                why = F.lit(f"schema id {i} is not an Avro record; the table needs a record")
                rows.append((i, F.lit(None).cast(self._row_struct), self._problem([(F.lit(True), why)])))
                continue
            name = f"{_RECORD}{i}"
            record = from_avro(payload, writer, {"mode": "PERMISSIVE"})
            # A generator over a one-element array is a barrier the optimizer does not inline through:
            # without it, every field access would parse the record again.
            parsed_columns.append(F.explode(F.array(F.when(schema_id == F.lit(i), record))).alias(name))
            failed_columns.append(_failed(F.col(name), writer_fields).alias(f"{_FAILED}{i}"))
            projected, checks = self._projected(i, F.col(name), F.col(f"{_FAILED}{i}"), writer_fields)
            rows.append((i, projected, self._problem(checks)))
        parsed = framed
        for column in parsed_columns:
            parsed = parsed.select("*", column)
        parsed = parsed.select("*", *failed_columns)
        row: Column = F.lit(None).cast(self._row_struct)
        problem: Column = F.lit(None).cast("string" if self.errors else "boolean")
        if rows:
            row_case = F.when(schema_id == F.lit(rows[0][0]), rows[0][1])
            problem_case = F.when(schema_id == F.lit(rows[0][0]), rows[0][2])
            for i, projected, why in rows[1:]:
                row_case = row_case.when(schema_id == F.lit(i), projected)
                problem_case = problem_case.when(schema_id == F.lit(i), why)
            row, problem = row_case.cast(self._row_struct), problem_case
        projected_df = parsed.select("*", row.alias(_ROW), problem.alias(_PROBLEM))
        unknown = schema_id.isNotNull() & ~schema_id.isin(*known) if known else schema_id.isNotNull()
        columns = [F.col(_ROW).alias(TYPED_COLUMN), *self._verdict(unknown, schema_id)]
        internal = [_SCHEMA_ID, _ROW, _PROBLEM, *(f"{p}{i}" for i in known for p in (_RECORD, _FAILED))]
        return projected_df.select("*", *columns).drop(*internal)

    def _verdict(self, unknown: Column, schema_id: Column) -> list[Column]:
        """`BAD_COLUMN` and, with `errors`, `ERROR_COLUMN`: from the frame, the id and the projection."""
        if self.errors:
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
            error = _joined(reasons)
            return [error.isNotNull().alias(BAD_COLUMN), error.alias(ERROR_COLUMN)]
        bad = unknown | F.coalesce(F.col(_PROBLEM), F.lit(False))
        for condition, _ in self._frame_reasons:
            bad = bad | condition
        return [F.coalesce(bad, F.lit(False)).alias(BAD_COLUMN)]

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
        self, schema_id: int, record: Column, failed: Column, writer_fields: Mapping[str, bool]
    ) -> tuple[Column, list[tuple[Column, Column]]]:
        """The table's row of a record parsed with writer schema `schema_id`, and the checks on it
        (`failed`: the bytes did not decode, `_failed`)."""
        decoded = ~failed
        values: list[Column] = []
        checks: list[tuple[Column, Column]] = [
            (failed, F.lit(f"bytes do not decode as Avro with writer schema id {schema_id}"))
        ]
        for field in self.fields:
            target = self.targets[field.name]
            if field.name in writer_fields:
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
                checks.append(
                    (
                        decoded & value.isNull() & ~mismatch,
                        F.lit(f"required field '{field.name}' is missing or null{absent}"),
                    )
                )
            values.append(value.alias(field.name))
        return F.struct(*values), checks


def _nullable(dtype: DataType) -> DataType:
    """`dtype` with every nested element, value and field nullable."""
    if isinstance(dtype, ArrayType):
        return ArrayType(_nullable(dtype.elementType), True)
    if isinstance(dtype, MapType):
        return MapType(dtype.keyType, _nullable(dtype.valueType), True)
    if isinstance(dtype, StructType):
        return StructType([StructField(f.name, _nullable(f.dataType), True) for f in dtype.fields])
    return dtype


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
