"""The `StreamingTable` resource: group `icefall.dev`, version `v1alpha1`, short name `st`.

One manifest drives both the operator (applied with kubectl/Helm/GitOps) and the local runner
(`icefall run -f table.yaml`). These models are the single source of the CRD schema.

Guarantees:
- A `StreamingTable` that validates can be run: every field is in range, the partition and sort columns
  exist in the inline schema with types their transforms accept (when the columns are known statically),
  the schema is writable by Spark, and no secret is inline.
- Defaults are explicit in the models: earliest start, PLAINTEXT, a dead-letter Iceberg table
  `<table>_dlq` beside the table, 10 s freshness target, Retain on delete.
- The spec grows by adding optional fields (compaction and retention will be new top-level sections),
  never by changing the meaning of an existing one.

Not guaranteed here: anything that needs I/O (the topic exists, the catalog answers, referenced Secrets
exist) and the columns produced by `transforms.select`, which are known only after Spark analyses the
expressions; those are checked when the pipeline starts and reported as conditions.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from icefall.api.base import (
    DNS1123_LABEL_PATTERN,
    IDENTIFIER_PATTERN,
    NAMESPACE_PATTERN,
    TOPIC_PATTERN,
    ApiModel,
    ProblemCollector,
)
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


class FormatType(StrEnum):
    """How Kafka record values are decoded. Registry-backed formats (avro, protobuf) will be added here."""

    JSON = "json"


class Format(ApiModel):
    """How record values are decoded, and the schema they follow."""

    type: FormatType = Field(default=FormatType.JSON, description="Record value encoding; json for now.")
    schema_fields: list[SchemaField] = Field(
        alias="schema",
        min_length=1,
        max_length=10000,
        description="The record's fields, in column order. They become the Iceberg table's columns.",
    )

    @model_validator(mode="after")
    def _whole_schema(self) -> Format:
        problems = ProblemCollector()
        problems.extend(
            ("schema",), check_fields(self.schema_fields, json_format=self.type is FormatType.JSON)
        )
        problems.raise_if_any()
        return self


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
        if self.transforms.select is None:
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
        problems.raise_if_any()
        return self


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
