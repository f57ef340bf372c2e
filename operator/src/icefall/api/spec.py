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

import re
from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from icefall.api.base import (
    IDENTIFIER_PATTERN,
    NAMESPACE_PATTERN,
    TOPIC_PATTERN,
    ApiModel,
    Loc,
    ObjectMeta,
    ProblemCollector,
)
from icefall.api.format import Format, FormatType, SubjectNameStrategy, Transforms
from icefall.api.maintenance import CompactionSpec, RetentionSpec, retention_problems
from icefall.api.mode import (
    DEFAULT_REMEMBER_DELETES_SECONDS,
    TableMode,
    key_problems,
    sequence_problems,
)
from icefall.api.pods import PodTemplates
from icefall.api.route_specs import own_route_problems, route_update
from icefall.api.routes import MAX_ROUTES, DynamicRoute, NameFrom, Route, Unrouted
from icefall.api.source import KafkaSource
from icefall.api.spark import SparkSpec
from icefall.api.status import StreamingTableStatus
from icefall.api.table import DELTA_PARTITION_TYPES, TableFormat, TableSpec, layout_problems

GROUP = "icefall.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "StreamingTable"
PLURAL = "streamingtables"
SINGULAR = "streamingtable"
SHORT_NAMES = ("st",)
DEFAULT_MAX_RECORD_BYTES = 1024 * 1024


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
        default_factory=DeadLetterTable,
        description="Dead-letter table; on by default. Format delta: a Delta table beside the table.",
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
    max_collect_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=0,
        le=2**40,
        description=(
            "Routed tables (spec.routes, spec.dynamicRoute): the largest batch, in estimated bytes (twice "
            "its Kafka value bytes plus 64 per record), whose route tables' rows the driver collects in one "
            "Spark job and writes itself; a larger batch is appended by Spark one route table at a time "
            "(slower; driver memory stays bounded). 0: always by Spark. Raise it with the driver's memory."
        ),
    )
    pipelined: bool = Field(
        default=True,
        description=(
            "While behind, read and write the next batch while the previous one's commit runs. "
            "false: every batch is committed before the next one starts."
        ),
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
    routes: list[Route] = Field(
        default_factory=list,
        max_length=MAX_ROUTES,
        description=(
            "Static routes: the source's records into several tables, read once per batch. Each record goes "
            "to the first route whose condition holds; records no route takes go where unrouted says. Each "
            "table commits the offsets it has taken (per topic and partition), exactly once. A route may "
            "give its table's own schema, key and sequenceBy (json). Keyed (mode upsert, cdc): every route "
            "table has its key and MERGEs the changes it takes; a delete no condition takes deletes its key "
            "in every destination."
        ),
    )
    dynamic_route: DynamicRoute | None = Field(
        default=None,
        description=(
            "Dynamic route: a table per value computed from each record no static route takes (a field, a "
            "header, the key or the topic, through nameTemplate), created on first use, at most maxTables. "
            "Exactly once per table, as routes. mode append. With from: Topic and source.topics or "
            "topicPattern: a table per topic."
        ),
    )
    unrouted: Unrouted | None = Field(
        default=None,
        description=(
            "With routes or dynamicRoute: where records no route takes go. Table (default): spec.table. "
            "DeadLetter: the dead-letter table and topic, with the reason 'unrouted: ...'; spec.table then "
            "gets no rows."
        ),
    )
    dead_letter: DeadLetter = Field(default_factory=DeadLetter, description="Where bad records go.")
    freshness: Freshness = Field(default_factory=Freshness, description="Freshness target.")
    batch: BatchSpec = Field(default_factory=BatchSpec, description="Batch size limits.")
    spark: SparkSpec = Field(
        default_factory=SparkSpec,
        description="Spark settings of the table's ingestion session, within an allow-list.",
    )
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
            "or without the schema envelope, or avro: the AvroConverter's envelope, whose after record "
            "gives the columns); op c, r and u write the after image, d deletes the key. Immutable."
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
            "the Kafka key: a JSON object with these fields, or for a one-column key the bare value; with "
            "avro also a Confluent-framed Avro key (a record with these fields). "
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
        if self.dead_letter.topic is not None and self.source.reads(self.dead_letter.topic):
            problems.add(("deadLetter", "topic"), "the dead-letter topic must differ from the source topic")
        problems.extend((), pattern_subject_problems(self))
        if self.source.by_topic and self.key is not None and not self.routes:
            problems.add(
                ("key",),
                "a keyed table (mode upsert or cdc) reads one topic: Kafka orders the changes of a key "
                "within a partition of one topic only; use source.topic, mode append, or routes (a table "
                "per topic: a condition on _kafka.topic)",
            )
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
        keyed_formats = (FormatType.JSON, FormatType.AVRO)
        if self.format.type not in keyed_formats and self.mode is not TableMode.APPEND:
            problems.add(
                ("mode",),
                f"mode {self.mode.value} is not supported with format {self.format.type.value} yet; use "
                "mode: append, or json or avro records",
            )
        problems.extend((), key_problems(self.mode, self.key, self.format))
        problems.extend((), sequence_problems(self.mode, self.sequence_by, self.remember_deletes_seconds))
        problems.extend((), route_problems(self))
        problems.extend((), delta_spec_problems(self))
        problems.raise_if_any()
        return self

    @property
    def routed(self) -> bool:
        """Whether records are routed to other tables than `table` (`routes` or `dynamicRoute`)."""
        return bool(self.routes) or self.dynamic_route is not None

    def route_spec(self, index: int) -> StreamingTableSpec | None:
        """Route `index`'s table's spec when the route decodes its own way (`route_update`), else None."""
        update = route_update(self.routes[index], self.format, self.key, self.sequence_by)
        return None if update is None else self.model_copy(update=update)

    @property
    def unrouted_to(self) -> Unrouted:
        """`unrouted`, or its default."""
        return self.unrouted or Unrouted.TABLE

    @property
    def deletes_remembered_seconds(self) -> int:
        """`rememberDeletesSeconds`, or its default."""
        given = self.remember_deletes_seconds
        return DEFAULT_REMEMBER_DELETES_SECONDS if given is None else given


def pattern_subject_problems(spec: StreamingTableSpec) -> list[tuple[Loc, str]]:
    """A table of `source.topicPattern` whose columns would come from a registry subject named after a
    topic: no topic is known when the table is made."""
    fmt = spec.format
    if spec.source.topic_pattern is None or fmt.registry is None or fmt.schema_known:
        return []
    if fmt.registry.subject_name_strategy is SubjectNameStrategy.RECORD:
        return []
    return [
        (
            ("format", "schema"),
            "with source.topicPattern the table's columns cannot come from a subject named after a topic "
            "(no topic is known when the table is made): give the fields here, or set "
            "registry.subjectNameStrategy: record",
        )
    ]


def route_problems(spec: StreamingTableSpec) -> list[tuple[Loc, str]]:
    """`routes`, `dynamicRoute` and `unrouted` against the rest of the spec; paths relative to `spec`."""
    if not spec.routed:
        if spec.unrouted is not None:
            return [(("unrouted",), "applies with routes or dynamicRoute; remove it, or add routes")]
        return []
    problems: list[tuple[Loc, str]] = []
    if spec.dynamic_route is not None and spec.mode is not TableMode.APPEND:
        problems.append(
            (
                ("dynamicRoute",),
                f"dynamicRoute needs mode append (not {spec.mode.value}) for now: keyed tables route with "
                "spec.routes (a route per table); remove dynamicRoute, or list the tables in routes",
            )
        )
    problems += dynamic_spec_problems(spec)
    if spec.unrouted is Unrouted.DEAD_LETTER and not spec.dead_letter.enabled:
        problems.append(
            (("unrouted",), "DeadLetter needs a dead-letter table or topic (spec.deadLetter); use Table")
        )
    problems += own_route_problems(spec.routes, spec.format, spec.mode, spec.key, spec.transforms)
    if spec.transforms.select is None and spec.format.schema_known:
        for i, route in enumerate(spec.routes):
            table, fields = route.table, spec.format.schema_fields  # (own schema: `own_route_problems`)
            problems.extend(
                (("routes", i, "table", *loc), message)
                for loc, message in layout_problems(fields, table.partitioning, table.sort_order)
                if route.schema_fields is None
            )
    return problems


def dynamic_spec_problems(spec: StreamingTableSpec) -> list[tuple[Loc, str]]:
    """`dynamicRoute` against the schema; paths relative to `spec`."""
    route = spec.dynamic_route
    if route is None:
        return []
    problems: list[tuple[Loc, str]] = []
    names = [f.name for f in spec.format.schema_fields]
    if route.from_ is NameFrom.FIELD and spec.format.schema_known and route.name not in names:
        problems.append(
            (("dynamicRoute", "name"), f"{route.name!r} is not a field of format.schema; name one of {names}")
        )
    if spec.transforms.select is None and spec.format.schema_known:
        template = route.table
        problems += [
            (("dynamicRoute", "table", *loc), message)
            for loc, message in layout_problems(
                spec.format.schema_fields, template.partitioning, template.sort_order
            )
        ]
    return problems


def delta_spec_problems(spec: StreamingTableSpec) -> list[tuple[Loc, str]]:
    """What a Delta table (`spec.table.format: delta`) does not support yet, beyond `spec.table`'s own
    (`delta_table_problems`); paths relative to `spec`."""
    if spec.table.format is not TableFormat.DELTA:
        return []
    unsupported = "is not supported with table format delta yet"
    problems: list[tuple[Loc, str]] = []
    if spec.retention is not None:
        problems.append(
            (
                ("retention",),
                f"retention (rows dropped by whole time partitions) {unsupported}; remove it. How long "
                "old versions and their files are kept is compaction.maxSnapshotAgeSeconds (the table's "
                "delta.deletedFileRetentionDuration and delta.logRetentionDuration)",
            )
        )
    if spec.compaction.min_snapshots_to_keep != 1:
        problems.append(
            (
                ("compaction", "minSnapshotsToKeep"),
                "a Delta table keeps versions by age only (compaction.maxSnapshotAgeSeconds), not by count; "
                "remove minSnapshotsToKeep",
            )
        )
    if spec.routes:
        problems.append((("routes",), f"routes are {unsupported[3:]}; remove them"))
    if spec.dynamic_route is not None:
        problems.append((("dynamicRoute",), f"a dynamic route {unsupported}; remove it"))
    problems += _delta_partition_types(spec)
    if spec.key and (spec.table.location or "").startswith(("gs://", "abfs://", "abfss://")):
        problems.append(  # the keyed MERGE reads the table's files through Hadoop's S3A (or locally)
            (
                ("table", "location"),
                "keyed (upsert/cdc) Delta tables on GCS or Azure are not supported yet; use s3://, a local "
                "path or format iceberg",
            )
        )
    return problems


def _delta_partition_types(spec: StreamingTableSpec) -> list[tuple[Loc, str]]:
    """Delta partition columns: an identity field of a type whose value reads back the same
    (`DELTA_PARTITION_TYPES`), or a transform Delta derives filters from (`icefall.api.delta_partitions`)
    whose column is not a field already; with `transforms.select` or a registry schema the fields' types
    are checked when the writer starts."""
    from icefall.api.delta_partitions import delta_partitions, delta_transform_problem

    known = spec.transforms.select is None and spec.format.schema_known
    fields = {f.name: f for f in spec.format.schema_fields} if known else {}
    problems: list[tuple[Loc, str]] = []
    for i, part in enumerate(spec.table.partitioning):
        found = fields.get(part.field)
        type_name = found.parsed.name if found is not None else None
        where: Loc = ("table", "partitioning", i)
        if (problem := delta_transform_problem(part, type_name)) is not None:
            problems.append(((*where, "transform"), problem))
            continue
        column = delta_partitions([part])[0]
        if column.generated and column.column in fields:
            problems.append(
                (
                    (*where, "transform"),
                    f"{part.transform}({part.field}) is the Delta column {column.column}, which "
                    "spec.format.schema has already; rename that field, or partition by it (identity)",
                )
            )
        if not column.generated and found is not None and type_name not in DELTA_PARTITION_TYPES:
            problems.append(
                (
                    (*where, "field"),
                    f"{part.field} is a {type_name}: a Delta table is partitioned by columns of type "
                    f"{', '.join(sorted(DELTA_PARTITION_TYPES))} (values that read back the same from its "
                    "partition folders); partition by one of those, or by a time transform of a timestamp",
                )
            )
    return problems


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
        taken = {self.table_identifier: "spec.table", **({dlq: "the dead-letter table"} if dlq else {})}
        for i, identifier in enumerate(self.route_identifiers):
            if identifier in taken:
                problems.add(
                    ("spec", "routes", i, "table", "name"),
                    f"{'.'.join(identifier)} is already {taken[identifier]}; each route writes a table of "
                    "its own: pick another name",
                )
            taken.setdefault(identifier, f"routes[{i}].table")
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
    def route_identifiers(self) -> tuple[tuple[str, ...], ...]:
        """The identifier of each route's table, in the order of `spec.routes`."""
        return tuple(
            (*(route.table.namespace or self.spec.table.namespace).split("."), route.table.name)
            for route in self.spec.routes
        )

    def route_of(self, identifier: str) -> int | None:
        """Which destination `identifier` (`namespace.name`) is: None for spec.table, else the index of its
        route in `spec.routes`. ValueError naming the valid choices for a table this one does not write."""
        destinations = (self.table_identifier, *self.route_identifiers)
        names = [".".join(d) for d in destinations]
        if identifier not in names:
            raise ValueError(
                f"{identifier!r} is not a table {self.metadata.name} writes; choose one of {', '.join(names)}"
            )
        index = names.index(identifier)
        return None if index == 0 else index - 1

    @property
    def destination_identifiers(self) -> tuple[tuple[str, ...], ...]:
        """Every table the StreamingTable writes records to: `spec.table` first, then each route's table (the
        dead-letter table aside: it holds the records none of them takes). What `status.tables` lists, the
        compaction pods tidy and `deletionPolicy: Delete` drops."""
        return (self.table_identifier, *self.route_identifiers)

    @property
    def dynamic_namespace(self) -> tuple[str, ...]:
        """The namespace levels of the tables `spec.dynamicRoute` creates."""
        route = self.spec.dynamic_route
        return tuple(((route.namespace if route else None) or self.spec.table.namespace).split("."))

    @property
    def dynamic_reserved(self) -> dict[str, str]:
        """Names in `dynamic_namespace` of the tables this StreamingTable writes otherwise, to what they
        are: a dynamic route never writes them."""
        dlq = self.dead_letter_identifier
        taken = {self.table_identifier: "spec.table", **({dlq: "the dead-letter table"} if dlq else {})}
        taken |= {ident: f"spec.routes[{i}]'s table" for i, ident in enumerate(self.route_identifiers)}
        return {ident[-1]: what for ident, what in taken.items() if ident[:-1] == self.dynamic_namespace}

    @property
    def dead_letter_identifier(self) -> tuple[str, ...] | None:
        """Identifier of the dead-letter table, or None when it is disabled."""
        dlq = self.spec.dead_letter.table
        if not dlq.enabled:
            return None
        namespace = dlq.namespace or self.spec.table.namespace
        return (*namespace.split("."), dlq.name or f"{self.table_name}_dlq")
