"""How record values become rows: `spec.format` (JSON text or a schema registry's wire format, and the
schema) and `spec.transforms` (an optional Spark SQL projection and filter).

Guarantees: a `Format` that validates names a format this version decodes, with a schema Spark can write
(inline for JSON, from the registry otherwise) and registry settings that fit its subject name strategy.
Not guaranteed here: that the registry answers or holds the subject, and the columns `transforms.select`
produces (known only when Spark analyses it, when the pipeline starts).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from icefall.api.base import ApiModel, ProblemCollector, SecretRef
from icefall.api.schema import SchemaField, check_fields
from icefall.api.sql_expressions import expression_problem

REGISTRY_URL_PATTERN = r"^https?://[^\s/?#]+(/[^\s?#]*)?$"
#: An Avro full name: dot-separated names.
RECORD_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


class FormatType(StrEnum):
    """How Kafka record values are decoded: JSON text, or a schema registry's wire format (a magic byte 0,
    the 4-byte schema id, then the encoded record)."""

    JSON = "json"
    AVRO = "avro"
    PROTOBUF = "protobuf"
    JSON_SCHEMA = "jsonSchema"

    @property
    def uses_registry(self) -> bool:
        return self is not FormatType.JSON

    @property
    def schema_type(self) -> str:
        """The registry's `schemaType` of this format's schemas (AVRO, PROTOBUF, JSON); "" for json."""
        return _SCHEMA_TYPES[self]


_SCHEMA_TYPES = {
    FormatType.JSON: "",
    FormatType.AVRO: "AVRO",
    FormatType.PROTOBUF: "PROTOBUF",
    FormatType.JSON_SCHEMA: "JSON",
}
#: How the registry's schema types are named in messages.
SCHEMA_TYPE_NAMES = {"AVRO": "Avro", "PROTOBUF": "Protobuf", "JSON": "JSON Schema"}


class SubjectNameStrategy(StrEnum):
    """How the registry subject of the record schema is named (Confluent's subject name strategies)."""

    TOPIC = "topic"  # <topic>-value
    RECORD = "record"  # <fully qualified record name>
    TOPIC_RECORD = "topic-record"  # <topic>-<fully qualified record name>


class SchemaRegistry(ApiModel):
    """A Confluent-compatible schema registry (Confluent, Apicurio's ccompat API, Karapace, Redpanda)."""

    url: str = Field(
        description=(
            "Base URL of the registry's Confluent-compatible API, e.g. http://registry:8081 or "
            "http://apicurio:8080/apis/ccompat/v7."
        ),
        min_length=1,
        max_length=2048,
        pattern=REGISTRY_URL_PATTERN,
    )
    username: SecretRef | None = Field(
        default=None, description="Reference to the HTTP basic-auth user name (or API key)."
    )
    password: SecretRef | None = Field(
        default=None, description="Reference to the HTTP basic-auth password (or API secret)."
    )
    subject_name_strategy: SubjectNameStrategy = Field(
        default=SubjectNameStrategy.TOPIC,
        description=(
            "How the subject of the record schema is named: topic: <topic>-value; record: the record's "
            "fully qualified name (recordName); topic-record: <topic>-<recordName>."
        ),
    )
    record_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        pattern=RECORD_NAME_PATTERN,
        description="Fully qualified record name (namespace.Name); needed by the record and topic-record "
        "strategies.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SchemaRegistry:
        problems = ProblemCollector()
        if (self.username is None) != (self.password is None):
            missing = "password" if self.password is None else "username"
            problems.add((missing,), f"basic auth needs both username and password; add {missing}")
        needs_record = self.subject_name_strategy is not SubjectNameStrategy.TOPIC
        if needs_record and self.record_name is None:
            problems.add(
                ("recordName",),
                f"subjectNameStrategy {self.subject_name_strategy.value} names the subject after the record: "
                "add recordName (e.g. com.example.Order)",
            )
        if not needs_record and self.record_name is not None:
            problems.add(
                ("recordName",),
                "recordName is used by the record and topic-record strategies only; remove it or set "
                "subjectNameStrategy",
            )
        problems.raise_if_any()
        return self

    def subject(self, topic: str) -> str:
        """The subject of the record (value) schema of `topic`."""
        if self.subject_name_strategy is SubjectNameStrategy.TOPIC:
            return f"{topic}-value"
        assert self.record_name is not None  # checked by the validator
        if self.subject_name_strategy is SubjectNameStrategy.RECORD:
            return self.record_name
        return f"{topic}-{self.record_name}"


class Format(ApiModel):
    """How record values are decoded, and the schema they follow."""

    type: FormatType = Field(
        default=FormatType.JSON,
        description=(
            "Record value encoding. json: JSON text read with `schema`. avro: Confluent-framed Avro, decoded "
            "with the writer schema of each record's schema id from `registry`. jsonSchema: Confluent-framed "
            "JSON text (JSON Schema serializers), read as json is. protobuf: Confluent-framed Protobuf, the "
            "message named by each record's message index."
        ),
    )
    schema_fields: list[SchemaField] = Field(
        alias="schema",
        default_factory=list,
        max_length=10000,
        description=(
            "The record's fields, in column order. They become the Iceberg table's columns. Required for "
            "json; for a registry format, default: derived from the subject's latest registry schema when "
            "the table is created (protobuf: its message recordName, or its first message)."
        ),
    )
    registry: SchemaRegistry | None = Field(
        default=None, description="The schema registry; required for avro, protobuf and jsonSchema."
    )

    @model_validator(mode="after")
    def _whole_schema(self) -> Format:
        problems = ProblemCollector()
        if self.type is FormatType.JSON:
            if not self.schema_fields:
                problems.add(("schema",), "json needs the record's fields; add schema: [{name, type}, ...]")
            if self.registry is not None:
                problems.add(
                    ("registry",), "json records carry no schema id; remove registry or set type: avro"
                )
        elif self.registry is None:
            problems.add(
                ("registry",),
                f"{self.type.value} records are framed by a schema registry: add registry: {{url: ...}}",
            )
        problems.extend(
            ("schema",),
            # jsonSchema and protobuf records are read as JSON too (`icefall.decode.decode`)
            check_fields(self.schema_fields, json_format=self.type is not FormatType.AVRO),
        )
        problems.raise_if_any()
        return self

    @property
    def schema_known(self) -> bool:
        """The table's columns are in the spec (always for json; for a registry format when `schema` is
        given)."""
        return bool(self.schema_fields)


class Transforms(ApiModel):
    """Spark SQL applied to decoded records before they are written: expressions over the record only,
    with functions from an allow-list (`icefall.api.sql_expressions`)."""

    select: list[str] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Spark SQL expressions for the output columns, e.g. ['*', 'amount * 100 AS cents']. "
            "Default: all schema fields. Only record-local functions are allowed (string, math, date and "
            "time, conditional, cast, collection, hashing and JSON functions); no queries, no file reads."
        ),
    )
    filter: str | None = Field(
        default=None,
        min_length=1,
        max_length=65536,
        description=(
            "Spark SQL boolean expression; records for which it is not true are skipped (not dead-lettered). "
            "The same functions as select are allowed."
        ),
    )

    @model_validator(mode="after")
    def _non_blank(self) -> Transforms:
        problems = ProblemCollector()
        for i, expression in enumerate(self.select or []):
            if not expression.strip():
                problems.add(("select", i), "empty expression; remove it or write a Spark SQL expression")
            elif (problem := expression_problem(expression)) is not None:
                problems.add(("select", i), problem)
        if self.filter is not None and not self.filter.strip():
            problems.add(("filter",), "empty filter; remove it or write a Spark SQL boolean expression")
        elif self.filter is not None and (problem := expression_problem(self.filter)) is not None:
            problems.add(("filter",), problem)
        problems.raise_if_any()
        return self
