"""The decoder's expressions for keyed tables (`spec.mode` upsert and cdc): which records delete their key,
the row image a Debezium event carries, the key read from the Kafka key where the value has none, and a
change's position in its source (`spec.sequenceBy`).

Used by `icefall.decode.decode`, which owns the decoding flow; everything here is Spark column
expressions over the columns of `icefall.decode.columns`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - the usual name
from pyspark.sql.types import StructField, StructType

from icefall.api import SchemaField, StreamingTableSpec, TableMode, to_spark_schema_json
from icefall.decode.columns import (
    DELETE_COLUMN,
    ENVELOPE_COLUMN,
    IMAGE_COLUMN,
    KAFKA_KEY_COLUMN,
    POSITION_COLUMN,
    TEXT_COLUMN,
    TYPED_COLUMN,
)
from icefall.decode.reasons import VALUE_QUOTE_CHARS, Check, json_problem, quote

#: Digits of the largest non-negative integer a sequence part compares as a number (Spark's decimal(38)).
SEQUENCE_DIGITS = 38
CDC_OPS = ("c", "r", "u", "d")


def image_column(spec: StreamingTableSpec) -> str:
    """The column holding the JSON text of the row a record writes."""
    return IMAGE_COLUMN if spec.mode is TableMode.CDC else TEXT_COLUMN


class Keyed:
    """The expressions of the keyed modes (`spec.mode` upsert and cdc): which records delete their key,
    the row image a Debezium event carries, and the key read from the Kafka key where the value has none.

    upsert: a record with a value writes it; a tombstone (null value) deletes the key, read from the Kafka
    key. cdc: the value is a Debezium change event, `{"op", "before", "after", "source", ...}` or the same
    inside `{"schema", "payload"}` (JsonConverter with schemas.enable); op c (create), r (snapshot read) and
    u (update) write the after image, d deletes the key of the before image (or of the Kafka key); a
    tombstone (Debezium writes one after each delete, for log compaction) deletes the Kafka key's key.
    Key fields missing from a row image are read from the Kafka key: a JSON object holding them (also
    inside `payload`), or for a one-column key the bare value (JSON, or plain text for string keys).
    """

    def __init__(self, spec: StreamingTableSpec) -> None:
        self.mode = spec.mode
        fields = {f.name: f for f in spec.format.schema_fields}
        self.key = list(spec.key or [])
        self.key_fields = [fields[name] for name in self.key]
        self.image = image_column(spec)
        self.sequence_by = list(spec.sequence_by or [])
        # Dropped after decoding; `KAFKA_KEY_COLUMN` and `POSITION_COLUMN` stay: the good rows read them.
        self.internal = [ENVELOPE_COLUMN, IMAGE_COLUMN] if spec.mode is TableMode.CDC else []

    def column(self, name: str) -> Column:
        """Field `name` of the row: for a key field, the image's value, else the Kafka key's."""
        typed = F.col(TYPED_COLUMN)
        if name not in self.key:
            return typed[name]
        return F.coalesce(typed[name], F.col(KAFKA_KEY_COLUMN)[name])

    # -- projections ----------------------------------------------------------------------------------

    def changes(self, text_df: DataFrame) -> DataFrame:
        """`DELETE_COLUMN` (and for cdc the envelope and the row image) on the value text's rows."""
        value = F.col("value")
        if self.mode is TableMode.UPSERT:
            return text_df.select("*", value.isNull().alias(DELETE_COLUMN))
        # Each field as its JSON text (Spark keeps a number's or an object's text in a string field); the
        # positions' paths as nested structs, so the parse reads them on its way.
        envelope_type = _struct_ddl({"op": {}, "before": {}, "after": {}, **_path_tree(self.sequence_by)})
        envelope = F.from_json(
            F.col(TEXT_COLUMN), f"{envelope_type}, payload struct<{envelope_type}>", {"mode": "PERMISSIVE"}
        )
        with_envelope = text_df.select(
            "*",
            F.when(envelope["op"].isNull() & envelope["payload"].isNotNull(), envelope["payload"])
            .otherwise(envelope.dropFields("payload"))
            .alias(ENVELOPE_COLUMN),
        )
        op = F.col(ENVELOPE_COLUMN)["op"]
        sequence = []
        if self.sequence_by:
            parts = [sequence_part(self._envelope_field(p)) for p in self.sequence_by]
            sequence = [F.when(value.isNotNull(), F.array(*parts)).alias(POSITION_COLUMN)]
        return with_envelope.select(
            "*",
            F.when(op.isin("c", "r", "u"), F.col(ENVELOPE_COLUMN)["after"])
            .when(op == "d", F.col(ENVELOPE_COLUMN)["before"])
            .alias(IMAGE_COLUMN),
            (value.isNull() | F.coalesce(op == "d", F.lit(False))).alias(DELETE_COLUMN),
            *sequence,
        )

    @staticmethod
    def _envelope_field(path: str) -> Column:
        """The JSON text of `path` (a `spec.sequenceBy` entry) in the envelope; null when it is not there."""
        column = F.col(ENVELOPE_COLUMN)
        for name in path.split("."):
            column = column[name]
        return column

    @property
    def kafka_key(self) -> Column:
        """The key fields parsed from the Kafka key, only for records whose image lacks one of them."""
        typed = F.col(TYPED_COLUMN)
        needed = F.lit(False)
        for name in self.key:
            needed = needed | typed.isNull() | typed[name].isNull()
        return F.when(needed, self.text_key()).alias(KAFKA_KEY_COLUMN)

    def text_key(self) -> Column:
        """The key fields of a Kafka key that is text: a JSON object holding them (also inside `payload`),
        or for a one-column key the bare value (JSON, or plain text for string keys)."""
        key_text = F.when(F.is_valid_utf8(F.col("key").cast("string")), F.col("key").cast("string"))
        schema = self.key_schema
        wrapped = StructType([*schema.fields, StructField("payload", schema)])
        parsed = F.from_json(key_text, wrapped, {"mode": "PERMISSIVE"})
        as_object = F.struct(*(F.coalesce(parsed["payload"][n], parsed[n]).alias(n) for n in self.key))
        if len(self.key) != 1:
            return as_object
        name = self.key[0]
        scalar = F.from_json(
            F.concat(F.lit('{"v":'), key_text, F.lit("}")), f"v {schema[name].dataType.simpleString()}"
        )["v"]
        if self.key_fields[0].parsed.name in ("string", "uuid"):
            scalar = F.coalesce(scalar, key_text)
        return F.when(F.ltrim(key_text).startswith("{"), as_object).otherwise(F.struct(scalar.alias(name)))

    @property
    def key_schema(self) -> StructType:
        """The Spark type of the key fields (each nullable): the type of `KAFKA_KEY_COLUMN`."""
        return StructType.fromJson(to_spark_schema_json([_optional(f) for f in self.key_fields]))

    # -- reasons --------------------------------------------------------------------------------------

    def key_missing(self) -> Column:
        """True when some key field has no value (in the image nor the Kafka key)."""
        missing = F.lit(False)
        for name in self.key:
            missing = missing | self.column(name).isNull()
        return missing

    def sequence_missing(self) -> Column:
        """True (never null) when a change event lacks a field of `spec.sequenceBy` (a tombstone has none
        and needs none)."""
        if not self.sequence_by:
            return F.lit(False)
        return F.coalesce(F.exists(F.col(POSITION_COLUMN), lambda part: part.isNull()), F.lit(False))

    def delete_reasons(
        self, key_forms: str = "a JSON object with the key fields, or the bare value of a one-column key"
    ) -> list[Check]:
        """Why a delete cannot be applied: a key field without a value (`key_forms`: the Kafka keys that
        give one, for the message)."""
        delete = F.col(DELETE_COLUMN)
        what = "tombstone (null value)" if self.mode is TableMode.UPSERT else "delete (op d, or a tombstone)"
        source = "the Kafka key" if self.mode is TableMode.UPSERT else "the before image nor the Kafka key"
        return [
            (
                delete & self.column(name).isNull(),
                F.lit(f"{what}: {source} gives no value for key field '{name}' ({key_forms})"),
            )
            for name in self.key
        ]

    def envelope_reasons(self) -> list[Check]:
        """cdc: why a record (with a value that is text) is not a change event Icefall applies."""
        if self.mode is not TableMode.CDC:
            return []
        text, envelope = F.col(TEXT_COLUMN), F.col(ENVELOPE_COLUMN)
        op = envelope["op"]
        parsed = text.isNotNull() & F.try_parse_json(text).isNotNull() & F.ltrim(text).startswith("{")
        return [
            (text.isNotNull() & ~parsed, json_problem(text)),
            *change_reasons(parsed, op, envelope["after"]),
        ]

    def sequence_reasons(self, op: Column | None = None) -> list[Check]:
        """cdc with `spec.sequenceBy`: a change event (a delete too) without one of its fields (`op`: the
        event's op; default the JSON envelope's)."""
        if op is None:
            op = F.col(ENVELOPE_COLUMN)["op"]
        return [
            (
                op.isin(*CDC_OPS) & F.col(POSITION_COLUMN)[i].isNull(),
                F.lit(f"Debezium event has no {path} (spec.sequenceBy orders a key's changes by it)"),
            )
            for i, path in enumerate(self.sequence_by)
        ]


def change_reasons(event: Column, op: Column, after: Column) -> list[Check]:
    """Why a decoded envelope (`event` true) is not a change Icefall applies: no op, an op other than c, r,
    u, d, or c, r, u without an after image. The same for every format."""
    return [
        (event & op.isNull(), F.lit("not a Debezium change event: it has no op (nor payload.op)")),
        (
            event & op.isNotNull() & ~op.isin(*CDC_OPS),
            F.concat(F.lit("Debezium op "), quote(op, VALUE_QUOTE_CHARS), F.lit(" is not one of c, r, u, d")),
        ),
        (
            event & op.isin("c", "r", "u") & after.isNull(),
            F.concat(F.lit("Debezium op "), quote(op, VALUE_QUOTE_CHARS), F.lit(" has no after image")),
        ),
    ]


def sequence_part(text: Column) -> Column:
    """A part of `SEQUENCE_COLUMN`: a non-negative integer left-padded with zeros to `SEQUENCE_DIGITS`
    digits, so that text order is number order; any other value as it is (compared as text)."""
    return F.when(
        text.rlike(f"^[0-9]{{1,{SEQUENCE_DIGITS}}}$"), F.lpad(text, SEQUENCE_DIGITS, "0")
    ).otherwise(text)


_Tree = dict[str, "_Tree"]


def _path_tree(paths: Sequence[str]) -> _Tree:
    """Dotted paths as a tree of names: a leaf is `{}`."""
    tree: _Tree = {}
    for path in paths:
        node = tree
        for name in path.split("."):
            node = node.setdefault(name, {})
    return tree


def _struct_ddl(tree: _Tree) -> str:
    """A tree of names as the fields of a Spark DDL struct: leaves are strings."""
    return ", ".join(
        f"`{name}` " + (f"struct<{_struct_ddl(sub)}>" if sub else "string") for name, sub in tree.items()
    )


def _optional(field: SchemaField) -> SchemaField:
    return field.model_copy(update={"required": False})
