"""Manifests load into typed models, round-trip, and every class of mistake yields one actionable line.

Proves: the example manifest loads with the documented defaults; a full manifest survives dump → YAML →
load unchanged; each kind of bad input (unknown field, snake_case name, wrong type, out of range, bad
enum, bad pattern, inline secret, cross-field conflicts, wrong apiVersion/kind, broken YAML, duplicate
keys) is reported with the dotted camelCase path and what to do, all problems at once, and without
echoing secret values.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from icefall.api import (
    API_VERSION,
    DeletionPolicy,
    FormatType,
    ManifestError,
    SecurityProtocol,
    StartingPositionType,
    StreamingTable,
    TableMode,
    load_manifest,
    parse_manifest,
    streaming_table_from_object,
)

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders.yaml"

FULL: dict[str, Any] = {
    "apiVersion": "icefall.dev/v1alpha1",
    "kind": "StreamingTable",
    "metadata": {"name": "payments", "namespace": "data", "labels": {"team": "pay"}},
    "spec": {
        "source": {
            "bootstrapServers": "kafka-0:9093,kafka-1:9093",
            "topic": "payments.v1",
            "startingPosition": {"type": "timestamp", "timestampMs": 1_700_000_000_000},
            "security": {
                "protocol": "SASL_SSL",
                "saslMechanism": "SCRAM-SHA-512",
                "username": {"secretKeyRef": {"name": "kafka-user", "key": "username"}},
                "password": {"secretKeyRef": {"name": "kafka-user", "key": "password"}},
                "caCert": {"secretKeyRef": {"name": "kafka-ca", "key": "ca.crt"}},
            },
            "properties": {"fetch.max.bytes": "52428800"},
        },
        "format": {
            "type": "json",
            "schema": [
                {"name": "id", "type": "uuid", "required": True, "doc": "Payment id."},
                {"name": "amount", "type": "decimal(18,4)", "required": True},
                {"name": "at", "type": "timestamptz", "required": True},
                {"name": "local_day", "type": "date"},
                {"name": "card", "type": "fixed[16]"},
                {
                    "name": "attrs",
                    "type": "map",
                    "key": {"type": "string"},
                    "value": {"type": "long"},
                    "valueRequired": True,
                },
                {
                    "name": "lines",
                    "type": "list",
                    "elementRequired": True,
                    "element": {
                        "type": "struct",
                        "fields": [{"name": "sku", "type": "string", "required": True}],
                    },
                },
            ],
        },
        "table": {
            "catalog": {
                "name": "lake",
                "type": "sql",
                "uri": "postgresql://catalog-db:5432/iceberg",
                "warehouse": "s3://lake/warehouse",
                "properties": {"s3.endpoint": "http://minio:9000"},
                "secretProperties": {
                    "password": {"secretKeyRef": {"name": "catalog-db", "key": "password"}},
                    "s3.secret-access-key": {"env": "S3_SECRET"},
                },
            },
            "namespace": "finance.eu",
            "name": "payments",
            "partitioning": [
                {"field": "at", "transform": "hour"},
                {"field": "id", "transform": "bucket[16]"},
            ],
            "sortOrder": [{"field": "amount", "direction": "desc", "nulls": "last"}],
            "properties": {"write.format.default": "parquet"},
        },
        "transforms": {"filter": "amount > 0"},
        "deadLetter": {
            "table": {"enabled": True, "name": "payments_bad"},
            "topic": "payments.dlq",
            "maxRecordBytes": 262144,
        },
        "freshness": {"targetSeconds": 30},
        "batch": {"maxRecords": 500000, "maxRecordsPerPartition": 50000, "minIntervalSeconds": 2},
        "suspend": True,
        "deletionPolicy": "Delete",
    },
}


def problems_of(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ManifestError) as caught:
        streaming_table_from_object(doc)
    return {p.path: p.message for p in caught.value.problems}


def edit(path: str | tuple[str, ...], value: Any, doc: dict[str, Any] | None = None) -> dict[str, Any]:
    """Copy of FULL (or doc) with the path (dotted, or a tuple when keys hold dots) set to value.

    `DELETE` as the value removes the entry instead.
    """
    out = copy.deepcopy(doc if doc is not None else FULL)
    *parents, last = path.split(".") if isinstance(path, str) else path
    node: Any = out
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    key: Any = int(last) if last.isdigit() else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return out


DELETE = object()


def test_example_manifest_loads_with_defaults() -> None:
    table = load_manifest(EXAMPLE)
    spec = table.spec
    assert table.metadata.name == "orders"
    assert spec.source.topic == "orders"
    assert spec.source.starting_position.type is StartingPositionType.EARLIEST
    assert spec.source.security.protocol is SecurityProtocol.PLAINTEXT
    assert spec.format.type is FormatType.JSON
    assert [f.name for f in spec.format.schema_fields] == [
        "id",
        "customer",
        "amount",
        "ts",
        "shipping",
        "tags",
        "channel",
        "items",
    ]
    assert spec.table.partitioning[0].field == "ts"
    assert spec.table.partitioning[0].transform == "day"
    assert table.table_identifier == ("shop", "orders")
    assert table.dead_letter_identifier == ("shop", "orders_dlq")
    assert spec.freshness.target_seconds == 10
    assert spec.deletion_policy is DeletionPolicy.RETAIN
    assert spec.suspend is False


def test_load_manifest_accepts_path_str_and_text() -> None:
    text = EXAMPLE.read_text()
    assert load_manifest(str(EXAMPLE)) == load_manifest(EXAMPLE) == load_manifest(text)


def test_full_manifest_round_trips_through_yaml() -> None:
    table = streaming_table_from_object(FULL)
    for dump in (
        table.model_dump(mode="json", exclude_none=True),
        table.model_dump(mode="json", exclude_defaults=True),
    ):
        text = yaml.safe_dump({"apiVersion": API_VERSION, "kind": "StreamingTable", **dump}, sort_keys=False)
        assert parse_manifest(text) == table
    assert table.spec.source.starting_position.timestamp_ms == 1_700_000_000_000
    assert table.table_identifier == ("finance", "eu", "payments")
    assert table.dead_letter_identifier == ("finance", "eu", "payments_bad")
    assert table.spec.table.sort_order[0].null_order.value == "last"


def test_minimal_manifest_gets_defaults() -> None:
    table = parse_manifest(
        """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: click-events}
spec:
  source: {bootstrapServers: "localhost:9092", topic: clicks}
  format:
    schema: [{name: url, type: string}]
"""
    )
    assert table.table_identifier == ("default", "click_events")
    assert table.dead_letter_identifier == ("default", "click_events_dlq")
    assert table.spec.table.catalog is None
    assert table.spec.batch.max_records == 1_000_000
    assert table.spec.dead_letter.max_record_bytes == 1024 * 1024


def test_python_code_may_use_snake_case_names() -> None:
    table = StreamingTable.model_validate(
        {
            "metadata": {"name": "t"},
            "spec": {
                "source": {"bootstrap_servers": "k:9092", "topic": "t"},
                "format": {"schema": [{"name": "a", "type": "int"}]},
            },
        }
    )
    assert table.spec.source.bootstrap_servers == "k:9092"


# Each class of bad input: (dotted path, value, expected path, words the message must contain).
BAD_INPUTS = [
    pytest.param(
        "spec.table.partitioning.0.transform",
        "hourly",
        "spec.table.partitioning[0].transform",
        ["'hourly' is not a transform; use one of identity, hour, day", "did you mean 'hour'"],
        id="bad-transform",
    ),
    pytest.param(
        "spec.source.topic", DELETE, "spec.source.topic", ["is required; add it", "Kafka topic"], id="missing"
    ),
    pytest.param(
        "spec.source.topik",
        "x",
        "spec.source.topik",
        ["unknown field 'topik'", "did you mean 'topic'"],
        id="unknown",
    ),
    pytest.param(
        "spec.source.bootstrap_servers",
        "k:1",
        "spec.source.bootstrap_servers",
        ["camelCase", "'bootstrapServers'"],
        id="snake-case",
    ),
    pytest.param(
        "spec.freshness.targetSeconds", 0, "spec.freshness.targetSeconds", ["at least 1, got 0"], id="range"
    ),
    pytest.param(
        "spec.batch.maxRecords", "lots", "spec.batch.maxRecords", ["whole number", "'lots'"], id="int-type"
    ),
    pytest.param(
        "spec.deletionPolicy",
        "Keep",
        "spec.deletionPolicy",
        ["'Keep' is not allowed; use one of Retain, Delete"],
        id="enum",
    ),
    pytest.param(
        "spec.source.security.protocol",
        "TLS",
        "spec.source.security.protocol",
        ["use one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"],
        id="enum-nested",
    ),
    pytest.param(
        "spec.table.namespace",
        "my-ns",
        "spec.table.namespace",
        ["'my-ns' is not valid", "letters, digits"],
        id="pattern",
    ),
    pytest.param(
        "spec.source.bootstrapServers",
        "kafka",
        "spec.source.bootstrapServers",
        ["'kafka' is not valid", "write host:port"],
        id="pattern-bootstrap",
    ),
    pytest.param(
        ("spec", "table", "properties", "write.format.default"),
        7,
        "spec.table.properties['write.format.default']",
        ["expected a string", "quote the value"],
        id="string-type",
    ),
    pytest.param(
        "spec.format.schema.0.type",
        "bigint",
        "spec.format.schema[0].type",
        ["'bigint' is not an Iceberg type", "did you mean 'long'"],
        id="iceberg-type",
    ),
    pytest.param(
        "spec.format.schema.0.type",
        "time",
        "spec.format.schema[0].type",
        ["cannot be written by the Iceberg Spark runtime", "use 'string' or 'long'"],
        id="time-type",
    ),
    pytest.param(
        "spec.format.schema.1.type",
        "decimal(40,2)",
        "spec.format.schema[1].type",
        ["precision must be between 1 and 38"],
        id="decimal-precision",
    ),
    pytest.param(
        "spec.format.schema.6.element",
        DELETE,
        "spec.format.schema[6].element",
        ["a list needs an element type"],
        id="list-without-element",
    ),
    pytest.param(
        "spec.format.schema.0.elementRequired",
        True,
        "spec.format.schema[0].elementRequired",
        ["only a list has elementRequired"],
        id="part-on-wrong-type",
    ),
    pytest.param(
        "spec.format.schema.5.key",
        {"type": "long"},
        "spec.format.schema[5].key.type",
        ["JSON object keys are strings"],
        id="json-map-key",
    ),
    pytest.param(
        "spec.format.schema.1.name",
        "ID",
        "spec.format.schema[1].name",
        ["duplicate field name 'ID'", "rename one"],
        id="duplicate-column",
    ),
    pytest.param(
        "spec.source.security.password",
        "hunter2",
        "spec.source.security.password",
        ["inline secret values are not allowed", "secretKeyRef", "env"],
        id="inline-password",
    ),
    pytest.param(
        "spec.source.security.password",
        {"secretKeyRef": {"name": "s", "key": "k"}, "env": "PW"},
        "spec.source.security.password",
        ["exactly one of secretKeyRef or env"],
        id="two-references",
    ),
    pytest.param(
        "spec.source.security.saslMechanism",
        DELETE,
        "spec.source.security.saslMechanism",
        ["SASL_SSL needs saslMechanism"],
        id="sasl-incomplete",
    ),
    pytest.param(
        ("spec", "source", "properties", "sasl.jaas.config"),
        "x",
        "spec.source.properties['sasl.jaas.config']",
        ["set by Icefall", "spec.source.security"],
        id="managed-consumer-property",
    ),
    pytest.param(
        ("spec", "source", "properties", "isolation.level"),
        "read_uncommitted",
        "spec.source.properties['isolation.level']",
        ["set by Icefall", "read_committed"],
        id="isolation-level-is-not-overridable",
    ),
    pytest.param(
        ("spec", "source", "properties", "ssl.keystore.password"),
        "x",
        "spec.source.properties['ssl.keystore.password']",
        ["spec.source.security", "secret references"],
        id="secret-consumer-property",
    ),
    pytest.param(
        "spec.source.startingPosition.timestampMs",
        DELETE,
        "spec.source.startingPosition.timestampMs",
        ["type timestamp needs timestampMs"],
        id="timestamp-without-ms",
    ),
    pytest.param(
        "spec.table.catalog.uri",
        "postgresql://user:pw@db:5432/iceberg",
        "spec.table.catalog.uri",
        ["carries a password", "secretProperties"],
        id="catalog-uri-password",
    ),
    pytest.param(
        ("spec", "table", "catalog", "properties", "s3.secret-access-key"),
        "x",
        "spec.table.catalog.properties['s3.secret-access-key']",
        ["looks secret", "secretProperties"],
        id="catalog-secret-property",
    ),
    pytest.param(
        ("spec", "table", "properties", "icefall.offsets"),
        "{}",
        "spec.table.properties['icefall.offsets']",
        ["written by Icefall's commits"],
        id="reserved-table-property",
    ),
    pytest.param(
        "spec.table.partitioning.0.field",
        "amount",
        "spec.table.partitioning[0].transform",
        ["hour cannot partition 'amount' of type decimal(18,4)", "timestamp, timestamptz"],
        id="transform-type",
    ),
    pytest.param(
        "spec.table.partitioning.0.field",
        "atx",
        "spec.table.partitioning[0].field",
        ["no column 'atx'", "did you mean 'at'"],
        id="partition-column-missing",
    ),
    pytest.param(
        "spec.table.sortOrder.0.field",
        "lines",
        "spec.table.sortOrder[0].field",
        ["'lines' is a list; sort by a primitive column"],
        id="sort-on-list",
    ),
    pytest.param(
        "spec.deadLetter.topic",
        "payments.v1",
        "spec.deadLetter.topic",
        ["must differ from the source topic"],
        id="dlq-loop",
    ),
    pytest.param(
        "spec.deadLetter.table.name",
        "payments",
        "spec.deadLetter.table.name",
        ["must differ from the table"],
        id="dlq-is-table",
    ),
    pytest.param(
        "spec.batch.minIntervalSeconds",
        60,
        "spec.batch.minIntervalSeconds",
        ["cannot meet freshness.targetSeconds 30"],
        id="interval-vs-freshness",
    ),
    pytest.param(
        "metadata.name",
        "Payments",
        "metadata.name",
        ["'Payments' is not valid", "lowercase"],
        id="object-name",
    ),
    pytest.param("spec.format", DELETE, "spec.format", ["is required"], id="missing-section"),
    pytest.param(
        "spec.table.partitioning",
        {"field": "at"},
        "spec.table.partitioning",
        ["expected a list"],
        id="list-type",
    ),
    pytest.param("spec.source", "kafka:9092", "spec.source", ["expected a mapping"], id="mapping-type"),
]


@pytest.mark.parametrize(("path", "value", "expected_path", "words"), BAD_INPUTS)
def test_bad_input_names_field_and_fix(
    path: str | tuple[str, ...], value: Any, expected_path: str, words: list[str]
) -> None:
    problems = problems_of(edit(path, value))
    assert expected_path in problems, problems
    for word in words:
        assert word in problems[expected_path], problems[expected_path]


def test_all_problems_reported_together_in_one_error() -> None:
    doc = edit("spec.freshness.targetSeconds", -1)
    doc = edit("spec.table.partitioning.0.transform", "hourly", doc)
    doc = edit("spec.source.security.password", "hunter2", doc)
    with pytest.raises(ManifestError) as caught:
        streaming_table_from_object(doc)
    text = str(caught.value)
    assert text.startswith("invalid StreamingTable manifest")
    assert "  - spec.freshness.targetSeconds: must be at least 1, got -1" in text
    assert "  - spec.table.partitioning[0].transform: 'hourly' is not a transform" in text
    assert "  - spec.source.security.password: inline secret values are not allowed" in text


def test_secret_values_never_appear_in_errors() -> None:
    doc = edit("spec.source.security.password", "hunter2-secret")
    doc = edit(("spec", "source", "properties", "sasl.jaas.config"), "password='jaas-secret'", doc)
    doc = edit("spec.table.catalog.uri", "postgresql://u:uri-secret@db/x", doc)
    with pytest.raises(ManifestError) as caught:
        streaming_table_from_object(doc)
    text = str(caught.value)
    for secret in ("hunter2-secret", "jaas-secret", "uri-secret"):
        assert secret not in text
    with pytest.raises(ValidationError) as raw:  # the raw pydantic error must not leak it either
        StreamingTable.model_validate(doc)
    for secret in ("hunter2-secret", "jaas-secret", "uri-secret"):
        assert secret not in str(raw.value)


@pytest.mark.parametrize(
    ("api_version", "kind", "expected"),
    [
        (
            "icefall.dev/v1",
            "StreamingTable",
            {"apiVersion": "'icefall.dev/v1' is not supported; use apiVersion: icefall.dev/v1alpha1"},
        ),
        (
            "apps/v1",
            "Deployment",
            {"kind": "'Deployment' is not a StreamingTable; this file must declare kind: StreamingTable"},
        ),
        (None, "StreamingTable", {"apiVersion": "is required; add apiVersion: icefall.dev/v1alpha1"}),
    ],
)
def test_wrong_api_version_or_kind(api_version: str | None, kind: str, expected: dict[str, str]) -> None:
    doc = edit("kind", kind)
    doc = edit("apiVersion", api_version if api_version is not None else DELETE, doc)
    problems = problems_of(doc)
    for path, message in expected.items():
        assert problems[path] == message
    if kind != "StreamingTable":
        assert set(problems) <= {"apiVersion", "kind"}  # a foreign object's spec is not picked apart


def test_yaml_syntax_error_has_line_and_column() -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest("apiVersion: icefall.dev/v1alpha1\nkind: [StreamingTable\n")
    (problem,) = caught.value.problems
    assert problem.path.startswith("line ")
    assert "not valid YAML" in problem.message


def test_duplicate_yaml_keys_are_an_error() -> None:
    text = EXAMPLE.read_text() + "  freshness:\n    targetSeconds: 3\n"
    with pytest.raises(ManifestError, match="duplicate key 'freshness'; keep only one"):
        parse_manifest(text)


def test_not_exactly_one_document() -> None:
    text = EXAMPLE.read_text()
    with pytest.raises(ManifestError, match="found 2 documents"):
        parse_manifest(text + "\n---\n" + text)
    with pytest.raises(ManifestError, match="found no document"):
        parse_manifest("# nothing\n")


def test_missing_file_is_a_manifest_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="cannot read"):
        load_manifest(tmp_path / "absent.yaml")


def test_api_object_with_server_fields_is_accepted() -> None:
    body = copy.deepcopy(FULL)
    body["metadata"].update(
        {"uid": "abc", "generation": 3, "resourceVersion": "7", "creationTimestamp": "2024-01-01T00:00:00Z"}
    )
    body["status"] = {"observedGeneration": 2, "dataLossRecords": 5, "futureField": 1}
    table = streaming_table_from_object(body)
    assert table.metadata.generation == 3
    assert table.status is not None and table.status.data_loss_records == 5


def keyed(mode: str | None, key: Any) -> dict[str, Any]:
    doc = copy.deepcopy(FULL)
    if mode is not None:
        doc["spec"]["mode"] = mode
    if key is not DELETE:
        doc["spec"]["key"] = key
    return doc


def test_keyed_modes_take_a_key_of_required_primitive_columns() -> None:
    st = streaming_table_from_object(keyed("upsert", ["id", "at"]))
    assert st.spec.mode is TableMode.UPSERT and st.spec.key == ["id", "at"]
    assert streaming_table_from_object(keyed("cdc", ["id"])).spec.mode is TableMode.CDC
    assert streaming_table_from_object(FULL).spec.mode is TableMode.APPEND  # the default


def test_cdc_orders_by_the_source_position_given() -> None:
    doc = keyed("cdc", ["id"])
    doc["spec"]["sequenceBy"] = ["source.file", "source.pos"]
    assert streaming_table_from_object(doc).spec.sequence_by == ["source.file", "source.pos"]
    assert streaming_table_from_object(keyed("cdc", ["id"])).spec.sequence_by is None  # Kafka's order


@pytest.mark.parametrize(
    ("mode", "sequence_by", "path", "words"),
    [
        ("upsert", ["source.lsn"], "spec.sequenceBy", "it applies to mode cdc: remove it, or set mode: cdc"),
        ("cdc", ["source..lsn"], "spec.sequenceBy[0]", "is not a path of field names, e.g. source.lsn"),
        ("cdc", ["after.updated_at"], "spec.sequenceBy[0]", "is not a position of the change: name a field"),
        ("cdc", ["ts_ms", "ts_ms"], "spec.sequenceBy[1]", "'ts_ms' is already in sequenceBy; remove one"),
        ("cdc", [], "spec.sequenceBy", "at least 1 item"),
        (
            "cdc",
            ["source", "source.lsn"],
            "spec.sequenceBy[0]",
            "holds, or is inside, another entry; keep one",
        ),
        ("cdc", None, "spec.rememberDeletesSeconds", "applies with sequenceBy (mode cdc); remove it"),
    ],
)
def test_bad_sequence_by_names_the_field_and_the_fix(
    mode: str, sequence_by: list[str] | None, path: str, words: str
) -> None:
    doc = keyed(mode, ["id"])
    if sequence_by is None:
        doc["spec"]["rememberDeletesSeconds"] = 60
    else:
        doc["spec"]["sequenceBy"] = sequence_by
    problems = problems_of(doc)
    assert path in problems, problems
    assert words in problems[path]


@pytest.mark.parametrize(
    ("mode", "key", "path", "words"),
    [
        ("upsert", DELETE, "spec.key", "mode upsert needs the columns that identify a row, e.g. key: [id]"),
        ("cdc", DELETE, "spec.key", "mode cdc needs"),
        (None, ["id"], "spec.key", "a key applies to mode upsert or cdc; remove it or set mode"),
        (
            "upsert",
            ["idd"],
            "spec.key[0]",
            "'idd' is not a top-level field of format.schema (did you mean 'id'?)",
        ),
        ("upsert", ["id", "id"], "spec.key[1]", "'id' is already in the key; remove one"),
        (
            "upsert",
            ["attrs"],
            "spec.key[0]",
            "'attrs' is a map; a key column is a primitive other than float",
        ),
        (
            "upsert",
            ["local_day"],
            "spec.key[0]",
            "'local_day' may be null; a key column must be set: add required",
        ),
        ("upsert", [], "spec.key", "at least 1 item"),
        ("merge", ["id"], "spec.mode", "'merge' is not allowed; use one of append, upsert, cdc"),
    ],
)
def test_bad_keys_name_the_field_and_the_fix(mode: str | None, key: Any, path: str, words: str) -> None:
    problems = problems_of(keyed(mode, key))
    assert path in problems, problems
    assert words in problems[path]
