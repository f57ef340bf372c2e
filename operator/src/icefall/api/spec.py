"""The `StreamingTable` resource: group `icefall.dev`, version `v1alpha1`, short name `st`.

One manifest drives both the operator (applied with kubectl/Helm/GitOps) and the local runner
(`icefall run -f table.yaml`). These models are the single source of the CRD schema.

Guarantees:
- A `StreamingTable` that validates can be run: every field is in range, the partition and sort columns
  exist in the inline schema with types their transforms accept (when the columns are known statically),
  the schema is writable by Spark, and no secret is inline.
- Defaults are explicit in the models: earliest start, PLAINTEXT, a dead-letter Iceberg table
  `<table>_dlq` beside the table, 10 s freshness target, Retain on delete.
- The spec grows by adding optional fields (`compaction` and `retention` were added that way), never by
  changing the meaning of an existing one. `retention.field` must be a time-partitioned column.

Not guaranteed here: anything that needs I/O (the topic exists, the catalog answers, referenced Secrets
exist) and the columns produced by `transforms.select`, which are known only after Spark analyses the
expressions; those are checked when the pipeline starts and reported as conditions.
"""

from __future__ import annotations

import difflib
import re
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from icefall.api.base import (
    DNS1123_LABEL_PATTERN,
    FIELD_PATH_PATTERN,
    IDENTIFIER_PATTERN,
    NAMESPACE_PATTERN,
    TOPIC_PATTERN,
    ApiModel,
    Loc,
    ProblemCollector,
    SecretRef,
)
from icefall.api.pods import PodTemplates
from icefall.api.schema import SchemaField, check_fields
from icefall.api.source import KafkaSource
from icefall.api.status import StreamingTableStatus
from icefall.api.table import TableSpec, layout_problems

GROUP = "icefall.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "StreamingTable"
PLURAL = "streamingtables"
SINGULAR = "streamingtable"
SHORT_NAMES = ("st",)
#: Longest metadata.name: leaves room for child names such as `icefall-<name>-commit` within 63 characters.
MAX_NAME_LENGTH = 40
DEFAULT_MAX_RECORD_BYTES = 1024 * 1024
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


#: Registry formats this version decodes; the others are refused at validation.
SUPPORTED_REGISTRY_FORMATS = (FormatType.AVRO,)


class SubjectNameStrategy(StrEnum):
    """How the registry subject of the record schema is named (Confluent's subject name strategies)."""

    TOPIC = "topic"  # <topic>-value
    RECORD = "record"  # <fully qualified record name>
    TOPIC_RECORD = "topic-record"  # <topic>-<fully qualified record name>


class TableMode(StrEnum):
    """What a record means for the table."""

    APPEND = "append"  # every record is a new row
    UPSERT = "upsert"  # a record replaces the row with its key; a tombstone (null value) deletes it
    CDC = "cdc"  # a Debezium change event (op c/r/u/d, before/after) changes the row with its key


#: How long a cdc table with sequenceBy remembers a deleted key by default (`rememberDeletesSeconds`).
DEFAULT_REMEMBER_DELETES_SECONDS = 3600
#: Types an identifier (key) field may have: Iceberg refuses float and double identifier fields, and
#: nested types cannot be compared for equality.
KEY_TYPES = frozenset(
    {"boolean", "int", "long", "decimal", "date", "time", "timestamp", "timestamptz", "string", "uuid",
     "fixed", "binary"}
)  # fmt: skip


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
            "with the writer schema of each record's schema id from `registry`. protobuf and jsonSchema "
            "are not supported yet."
        ),
    )
    schema_fields: list[SchemaField] = Field(
        alias="schema",
        default_factory=list,
        max_length=10000,
        description=(
            "The record's fields, in column order. They become the Iceberg table's columns. Required for "
            "json; for avro, default: derived from the subject's latest registry schema when the table is "
            "created."
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
        else:
            if self.type not in SUPPORTED_REGISTRY_FORMATS:
                problems.add(
                    ("type",),
                    f"{self.type.value} is not supported yet; use avro or json",
                )
            if self.registry is None:
                problems.add(
                    ("registry",),
                    f"{self.type.value} records are framed by a schema registry: add registry: {{url: ...}}",
                )
        problems.extend(
            ("schema",), check_fields(self.schema_fields, json_format=self.type is FormatType.JSON)
        )
        problems.raise_if_any()
        return self

    @property
    def schema_known(self) -> bool:
        """The table's columns are in the spec (always for json; for avro when `schema` is given)."""
        return bool(self.schema_fields)


class Transforms(ApiModel):
    """Spark SQL applied to decoded records before they are written."""

    select: list[str] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Spark SQL expressions for the output columns, e.g. ['*', 'amount * 100 AS cents']. "
            "Default: all schema fields."
        ),
    )
    filter: str | None = Field(
        default=None,
        min_length=1,
        max_length=65536,
        description=(
            "Spark SQL boolean expression; records for which it is not true are skipped (not dead-lettered)."
        ),
    )

    @model_validator(mode="after")
    def _non_blank(self) -> Transforms:
        problems = ProblemCollector()
        for i, expression in enumerate(self.select or []):
            if not expression.strip():
                problems.add(("select", i), "empty expression; remove it or write a Spark SQL expression")
        if self.filter is not None and not self.filter.strip():
            problems.add(("filter",), "empty filter; remove it or write a Spark SQL boolean expression")
        problems.raise_if_any()
        return self


class DeadLetterTable(ApiModel):
    """The Iceberg table that receives records that cannot be ingested."""

    enabled: bool = Field(default=True, description="Write bad records to a dead-letter Iceberg table.")
    name: str | None = Field(
        default=None,
        description="Table name; default: the table's name with suffix _dlq.",
        min_length=1,
        max_length=255,
        pattern=IDENTIFIER_PATTERN,
    )
    namespace: str | None = Field(
        default=None,
        description="Namespace; default: the table's namespace.",
        min_length=1,
        max_length=255,
        pattern=NAMESPACE_PATTERN,
    )


class DeadLetter(ApiModel):
    """Where records go that do not decode, miss required fields, or exceed maxRecordBytes.

    Dead-lettered records are committed atomically with the batch they came from. With neither a table
    nor a topic, a bad record stops ingestion (Degraded, reason BadRecordHalted) instead of being dropped.
    """

    table: DeadLetterTable = Field(
        default_factory=DeadLetterTable, description="Dead-letter Iceberg table; on by default."
    )
    topic: str | None = Field(
        default=None,
        description="Kafka topic that also receives bad records (same cluster as the source).",
        min_length=1,
        max_length=249,
        pattern=TOPIC_PATTERN,
    )
    max_record_bytes: int = Field(
        default=DEFAULT_MAX_RECORD_BYTES,
        ge=1,
        le=64 * 1024 * 1024,
        description="Records whose value is larger than this many bytes are dead-lettered, not decoded.",
    )

    @property
    def enabled(self) -> bool:
        return self.table.enabled or self.topic is not None


class Freshness(ApiModel):
    """How fresh the table should be."""

    target_seconds: int = Field(
        default=10,
        ge=1,
        le=86400,
        description="Target seconds between a record reaching Kafka and being queryable in the table.",
    )


class BatchSpec(ApiModel):
    """Limits on ingestion batches. Within them, batch size follows the freshness target and the backlog."""

    max_records: int = Field(
        default=1_000_000, ge=1, le=10**10, description="Most records (Kafka offsets) in one batch."
    )
    max_records_per_partition: int | None = Field(
        default=None,
        ge=1,
        le=10**10,
        description="Most records from one Kafka partition in one batch; default: no limit.",
    )
    min_interval_seconds: int = Field(
        default=1,
        ge=0,
        le=3600,
        description="Least seconds between the starts of two batches; bounds the commit rate.",
    )
    pipelined: bool = Field(
        default=True,
        description=(
            "While behind, read and write the next batch while the previous one's commit runs. "
            "false: every batch is committed before the next one starts."
        ),
    )


DEFAULT_ORPHAN_MIN_AGE_SECONDS = 3 * 86400
MIN_ORPHAN_MIN_AGE_SECONDS = 3600
DEFAULT_MAX_SNAPSHOT_AGE_SECONDS = 5 * 86400
MAX_COMPACTION_REPLICAS = 100


class CompactionSpec(ApiModel):
    """Continuous compaction and table maintenance: rewrite small files, rewrite manifests, expire snapshots,
    remove orphan files, apply `spec.retention`. In a cluster a Deployment of stateless pods does it, scaled
    from the backlog between minReplicas and maxReplicas; `icefall run` does it in-process beside the batches.
    """

    enabled: bool = Field(
        default=True,
        description=(
            "Run compaction and maintenance (including retention). false: the table is left as written."
        ),
    )
    min_replicas: int = Field(
        default=0,
        ge=0,
        le=MAX_COMPACTION_REPLICAS,
        description="Fewest compaction pods, even with nothing to do. 0: none while the table is tidy.",
    )
    max_replicas: int = Field(
        default=2,
        ge=0,
        le=MAX_COMPACTION_REPLICAS,
        description="Most compaction pods, whatever the backlog. At least minReplicas.",
    )
    target_file_size_bytes: int | None = Field(
        default=None,
        ge=1024,
        le=16 * 1024**3,
        description=(
            "Size of the data files compaction writes. Default: the table property "
            "write.target-file-size-bytes, else 128 MiB."
        ),
    )
    max_snapshot_age_seconds: int = Field(
        default=DEFAULT_MAX_SNAPSHOT_AGE_SECONDS,
        ge=0,
        le=10 * 365 * 86400,
        description=(
            "Snapshots older than this are expired (time travel reaches back this far). Branch and tag "
            "heads and the newest minSnapshotsToKeep are always kept."
        ),
    )
    min_snapshots_to_keep: int = Field(
        default=1,
        ge=1,
        le=100000,
        description="The newest snapshots of main kept whatever their age.",
    )
    orphan_min_age_seconds: int = Field(
        default=DEFAULT_ORPHAN_MIN_AGE_SECONDS,
        ge=MIN_ORPHAN_MIN_AGE_SECONDS,
        le=365 * 86400,
        description=(
            "Files no metadata references are deleted only once older than this (at least 3600): a write "
            "in flight has files no snapshot references yet."
        ),
    )
    rewrite_deleted_percent: int = Field(
        default=10,
        ge=1,
        le=100,
        description=(
            "Keyed tables (mode upsert or cdc): a data file is rewritten without its deleted rows (and its "
            "position delete files dropped) once this percentage of its rows is deleted."
        ),
    )
    embedded_interval_seconds: int = Field(
        default=30,
        ge=0,
        le=86400,
        description=(
            "icefall run only: least seconds between two in-process maintenance steps (one work item "
            "each, on a thread beside the ingestion batches). 0: one after another."
        ),
    )

    @field_validator("orphan_min_age_seconds", mode="before")
    @classmethod
    def _orphan_window(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool) and value < MIN_ORPHAN_MIN_AGE_SECONDS:
            raise ValueError(
                f"orphanMinAgeSeconds {value} is below {MIN_ORPHAN_MIN_AGE_SECONDS} (1 h): files of a write "
                "in flight are referenced by no snapshot yet and would be deleted; raise it to at least 3600"
            )
        return value

    @model_validator(mode="after")
    def _replica_range(self) -> CompactionSpec:
        problems = ProblemCollector()
        if self.min_replicas > self.max_replicas:
            problems.add(
                ("minReplicas",),
                f"{self.min_replicas} is more than maxReplicas ({self.max_replicas}); lower it or raise "
                "maxReplicas",
            )
        problems.raise_if_any()
        return self


class RetentionSpec(ApiModel):
    """Drop data older than maxAgeSeconds, by whole partitions of a time-partitioned column (metadata only:
    no data file is rewritten). A partition goes once all of its time range is older than the cut-off."""

    field: str = Field(
        description=(
            "A timestamp or date column that spec.table.partitioning partitions by hour, day, month or year."
        ),
        min_length=1,
        max_length=1024,
        pattern=FIELD_PATH_PATTERN,
    )
    max_age_seconds: int = Field(
        ge=3600,
        le=100 * 365 * 86400,
        description="Rows whose partition ends more than this many seconds ago are deleted.",
    )


class DeletionPolicy(StrEnum):
    """What deleting the StreamingTable does to the Iceberg table."""

    RETAIN = "Retain"
    DELETE = "Delete"


class StreamingTableSpec(ApiModel):
    """Desired state: follow `source`, decode with `format`, write `table`."""

    source: KafkaSource = Field(description="The Kafka topic to ingest and how to reach it.")
    format: Format = Field(description="How record values are decoded, and their schema.")
    table: TableSpec = Field(default_factory=TableSpec, description="The Iceberg table to write.")
    transforms: Transforms = Field(
        default_factory=Transforms, description="Optional Spark SQL projection and filter."
    )
    dead_letter: DeadLetter = Field(default_factory=DeadLetter, description="Where bad records go.")
    freshness: Freshness = Field(default_factory=Freshness, description="Freshness target.")
    batch: BatchSpec = Field(default_factory=BatchSpec, description="Batch size limits.")
    compaction: CompactionSpec = Field(
        default_factory=CompactionSpec, description="Continuous compaction and table maintenance."
    )
    retention: RetentionSpec | None = Field(
        default=None, description="Drop old data by time partition. Default: keep everything."
    )
    mode: TableMode = Field(
        default=TableMode.APPEND,
        description=(
            "append: every record is a new row. upsert: the table holds the latest record per key; a "
            "tombstone (null value) deletes the key. cdc: records are Debezium change events (JSON, with "
            "or without the schema envelope); op c, r and u write the after image, d deletes the key. "
            "Immutable."
        ),
    )
    key: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description=(
            "upsert and cdc only, required there: the columns that identify a row (the table's Iceberg "
            "identifier fields): required top-level schema fields of a primitive type other than float and "
            "double. Read from the record's value; a tombstone's (or a delete without a before image) from "
            "the Kafka key: a JSON object with these fields, or for a one-column key the bare value. "
            "Immutable."
        ),
    )
    sequence_by: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=8,
        description=(
            "cdc only: fields of the Debezium envelope that order a key's changes, compared in turn, e.g. "
            "[source.lsn] (PostgreSQL), [source.file, source.pos, source.row] (MySQL), [source.scn] "
            "(Oracle), [source.change_lsn, source.event_serial_no] (SQL Server). Non-negative integers "
            "compare as numbers, other values as text. A change older than the row's stored position "
            "(column _sequence) is skipped, so changes of a key may come from several partitions, or "
            "again after a connector restart; a deleted key is remembered with its delete's position for "
            "rememberDeletesSeconds. Debezium's tombstones are then not applied (the d event before each "
            "carries the delete and its position). Default: Kafka's order within a partition. Immutable."
        ),
    )
    remember_deletes_seconds: int | None = Field(
        default=None,
        ge=0,
        le=30 * 86400,
        description=(
            "With sequenceBy: how long after its delete is ingested a deleted key is remembered, so that "
            "an older change of it arriving later (a connector restart, a partition read behind) does not "
            "bring the row back. Every batch with deletes rewrites the set (tens of bytes per key). "
            f"Default {DEFAULT_REMEMBER_DELETES_SECONDS} (one hour)."
        ),
    )
    pods: PodTemplates = Field(
        default_factory=PodTemplates,
        description=(
            "What to add to the pods the operator runs for this table (image pull secrets, node selector, "
            "tolerations, affinity, resources, host network, env, volumes, labels, annotations, priority "
            "class, ServiceAccount annotations): common to all, then per role (driver, executor, "
            "compaction), over the operator's defaults."
        ),
    )
    suspend: bool = Field(
        default=False, description="Pause ingestion and compaction without deleting anything."
    )
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.RETAIN,
        description="Retain keeps the Iceberg table when the StreamingTable is deleted; Delete drops it.",
    )

    @model_validator(mode="after")
    def _cross_field(self) -> StreamingTableSpec:
        problems = ProblemCollector()
        if self.transforms.select is None and self.format.schema_known:
            problems.extend(
                ("table",),
                layout_problems(self.format.schema_fields, self.table.partitioning, self.table.sort_order),
            )
        if self.dead_letter.topic is not None and self.dead_letter.topic == self.source.topic:
            problems.add(("deadLetter", "topic"), "the dead-letter topic must differ from the source topic")
        if self.batch.min_interval_seconds > self.freshness.target_seconds:
            problems.add(
                ("batch", "minIntervalSeconds"),
                f"{self.batch.min_interval_seconds} s between batches cannot meet freshness.targetSeconds "
                f"{self.freshness.target_seconds}; lower it or raise the target",
            )
        if (
            self.batch.max_records_per_partition is not None
            and self.batch.max_records_per_partition > self.batch.max_records
        ):
            problems.add(
                ("batch", "maxRecordsPerPartition"),
                f"larger than maxRecords ({self.batch.max_records}); lower it or raise maxRecords",
            )
        if self.retention is not None:
            problems.extend(("retention",), retention_problems(self.retention, self.table))
        if self.format.type is not FormatType.JSON and self.mode is not TableMode.APPEND:
            problems.add(
                ("mode",),
                f"mode {self.mode.value} is not supported with format {self.format.type.value} yet; use "
                "mode: append, or json records",
            )
        problems.extend((), key_problems(self))
        problems.extend((), sequence_problems(self))
        problems.raise_if_any()
        return self

    @property
    def deletes_remembered_seconds(self) -> int:
        """`rememberDeletesSeconds`, or its default."""
        given = self.remember_deletes_seconds
        return DEFAULT_REMEMBER_DELETES_SECONDS if given is None else given


TIME_TRANSFORM_NAMES = ("hour", "day", "month", "year")


def key_problems(spec: StreamingTableSpec) -> list[tuple[Loc, str]]:
    """`key` against `mode` and the schema; paths relative to `spec`. With `transforms.select` the key is
    also checked against the selected columns when the pipeline starts (`icefall.catalog.tables`)."""
    if spec.mode is TableMode.APPEND:
        if spec.key is not None:
            return [(("key",), "a key applies to mode upsert or cdc; remove it or set mode")]
        return []
    if spec.key is None:
        return [(("key",), f"mode {spec.mode.value} needs the columns that identify a row, e.g. key: [id]")]
    if not spec.format.schema_known:
        return []  # the columns come from the registry: checked when the pipeline starts
    problems: list[tuple[Loc, str]] = []
    fields = {f.name: f for f in spec.format.schema_fields}
    seen: set[str] = set()
    for i, name in enumerate(spec.key):
        field = fields.get(name)
        if name in seen:
            problems.append((("key", i), f"{name!r} is already in the key; remove one"))
        elif field is None:
            close = difflib.get_close_matches(name, list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((("key", i), f"{name!r} is not a top-level field of format.schema{hint}"))
        elif field.parsed.name not in KEY_TYPES:
            problems.append(
                (("key", i), f"{name!r} is a {field.parsed.name}; a key column is a primitive other than "
                 "float and double")
            )  # fmt: skip
        elif not field.required:
            problems.append(
                (("key", i), f"{name!r} may be null; a key column must be set: add required: true to it")
            )
        seen.add(name)
    return problems


#: A path into a Debezium envelope: dotted field names.
SEQUENCE_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: Envelope fields that hold the row or the operation, not a position.
NOT_POSITIONS = ("op", "before", "after", "payload", "schema")


def sequence_problems(spec: StreamingTableSpec) -> list[tuple[Loc, str]]:
    """`sequenceBy` against `mode`: paths into the Debezium envelope; paths relative to `spec`."""
    if spec.sequence_by is None:
        if spec.remember_deletes_seconds is not None:
            return [(("rememberDeletesSeconds",), "applies with sequenceBy (mode cdc); remove it")]
        return []
    if spec.mode is not TableMode.CDC:
        return [
            (
                ("sequenceBy",),
                "sequenceBy orders Debezium change events by their source position; it applies to mode "
                "cdc: remove it, or set mode: cdc",
            )
        ]
    problems: list[tuple[Loc, str]] = []
    for i, path in enumerate(spec.sequence_by):
        if not SEQUENCE_PATH.match(path):
            problems.append(
                (("sequenceBy", i), f"{path!r} is not a path of field names, e.g. source.lsn or ts_ms")
            )
        elif path.split(".")[0] in NOT_POSITIONS:
            problems.append(
                (
                    ("sequenceBy", i),
                    f"{path!r} is not a position of the change: name a field of the envelope's source "
                    "block (e.g. source.lsn; paths are inside payload when the schema envelope is on)",
                )
            )
        elif path in spec.sequence_by[:i]:
            problems.append((("sequenceBy", i), f"{path!r} is already in sequenceBy; remove one"))
        elif any(other.startswith(f"{path}.") or path.startswith(f"{other}.") for other in spec.sequence_by):
            problems.append((("sequenceBy", i), f"{path!r} holds, or is inside, another entry; keep one"))
    return problems


def retention_problems(retention: RetentionSpec, table: TableSpec) -> list[tuple[Loc, str]]:
    """`retention.field` must be partitioned by a time transform; paths relative to `spec.retention`."""
    for part in table.partitioning:
        if part.field == retention.field and part.parsed_transform.name.is_time:
            return []
    same_column = [p.transform for p in table.partitioning if p.field == retention.field]
    if same_column:
        why = f"{retention.field!r} is partitioned by {same_column[0]}, not by time"
    else:
        why = f"{retention.field!r} is not in spec.table.partitioning"
    return [
        (
            ("field",),
            f"{why}; retention drops whole time partitions: add {{field: {retention.field}, transform: day}} "
            "(or hour, month, year) to spec.table.partitioning, or name a column partitioned that way",
        )
    ]


class ObjectMeta(BaseModel):
    """The parts of Kubernetes object metadata Icefall reads; everything else is ignored."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,
    )

    name: str = Field(
        description="Name of the StreamingTable.",
        min_length=1,
        max_length=MAX_NAME_LENGTH,
        pattern=DNS1123_LABEL_PATTERN,
    )
    namespace: str | None = Field(
        default=None, description="Kubernetes namespace.", max_length=63, pattern=DNS1123_LABEL_PATTERN
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")
    generation: int | None = Field(default=None, ge=0, description="Spec generation, set by the API server.")
    uid: str | None = Field(default=None, description="Object UID, set by the API server.")


class StreamingTable(ApiModel):
    """A Kafka topic continuously ingested, exactly once, into an Iceberg table."""

    api_version: Literal["icefall.dev/v1alpha1"] = Field(
        default="icefall.dev/v1alpha1", description="icefall.dev/v1alpha1."
    )
    kind: Literal["StreamingTable"] = Field(default="StreamingTable", description="StreamingTable.")
    metadata: ObjectMeta = Field(description="Object metadata; only name is required.")
    spec: StreamingTableSpec = Field(description="Desired state.")
    status: StreamingTableStatus | None = Field(
        default=None, description="Observed state, written by the operator."
    )

    @model_validator(mode="after")
    def _names(self) -> StreamingTable:
        problems = ProblemCollector()
        if self.spec.table.name is None and re.fullmatch(IDENTIFIER_PATTERN, self.table_name) is None:
            problems.add(
                ("spec", "table", "name"),
                f"metadata.name {self.metadata.name!r} does not make a table name; set spec.table.name",
            )
        dlq = self.dead_letter_identifier
        if dlq is not None and dlq == self.table_identifier:
            problems.add(
                ("spec", "deadLetter", "table", "name"),
                "the dead-letter table must differ from the table; pick another name",
            )
        problems.raise_if_any()
        return self

    @property
    def table_name(self) -> str:
        """`spec.table.name`, or `metadata.name` with '-' replaced by '_'."""
        return self.spec.table.name or self.metadata.name.replace("-", "_")

    @property
    def table_identifier(self) -> tuple[str, ...]:
        """Namespace levels then table name, as pyiceberg takes them."""
        return (*self.spec.table.namespace.split("."), self.table_name)

    @property
    def dead_letter_identifier(self) -> tuple[str, ...] | None:
        """Identifier of the dead-letter table, or None when it is disabled."""
        dlq = self.spec.dead_letter.table
        if not dlq.enabled:
            return None
        namespace = dlq.namespace or self.spec.table.namespace
        return (*namespace.split("."), dlq.name or f"{self.table_name}_dlq")
