"""The generated StreamingTable CRD on a real kube-apiserver: what admission accepts, fills in and refuses.

Proves:
- `kubectl apply --server-side -f crds/` installs the CRD and it becomes Established: the API server takes
  the schema as structural and every CEL rule within its static cost budget.
- `kubectl explain streamingtables.spec.source` shows the models' descriptions.
- every example under examples/ is accepted (a server-side dry run), as `icefall validate` says;
- examples/orders.yaml is accepted with `kubectl apply --server-side`; the API server fills in the
  defaults, and the stored object reads back through the models as the same StreamingTable that
  `load_manifest` builds from the file.
- Invalid specs are REJECTED at admission with a message naming the field. The real messages, as
  `kubectl apply --server-side` prints them after `The StreamingTable "<name>" is invalid:`:
  - spec.source.topic missing → `spec.source.topic: Required value`
  - freshness.targetSeconds 0 → `spec.freshness.targetSeconds: Invalid value: 0: ... should be greater
    than or equal to 1` (plus the minIntervalSeconds rule below, since 1 s > 0 s)
  - deletionPolicy Keep → `spec.deletionPolicy: Unsupported value: "Keep": supported values: "Retain",
    "Delete"`
  - a 41-character metadata.name → `metadata.name: Too long: may not be more than 40 bytes`
  - startingPosition type timestamp without timestampMs → `spec.source.startingPosition.timestampMs:
    Invalid value: type timestamp needs timestampMs (milliseconds since the epoch)`
  - timestampMs with type earliest → `...timestampMs: ... timestampMs only applies to type timestamp`
  - batch.minIntervalSeconds 60 with the 10 s target → `spec.batch.minIntervalSeconds: Invalid value:
    batches this far apart cannot meet freshness.targetSeconds; ...`
  - maxRecordsPerPartition above maxRecords → `spec.batch.maxRecordsPerPartition: ... larger than
    maxRecords; lower it or raise maxRecords`
  - deadLetter.topic equal to the source topic → `spec.deadLetter.topic: Invalid value: the dead-letter
    topic must differ from the source topic`
  - partition transform daily → `spec.table.partitioning[0].transform: Invalid value: "daily": ...
    should match '^(identity|year|month|day|hour|bucket\\[...'`
  - two time transforms on ts → `spec.table.partitioning: ... a column has two time transforms`
  - sortOrder naming id twice → `spec.table.sortOrder: ... a column appears twice in sortOrder`
  - column type integer → `spec.format.schema[0].type: Invalid value: "integer": ... should match ...`
  - column type time → the pattern message and `'time' cannot be written by the Iceberg Spark runtime`
  - a struct column without fields → `spec.format.schema[4].fields: ... a struct needs fields`
  - a map column with a struct key → `spec.format.schema[0].key.type: ... map keys must be a primitive
    type`
  - a struct member of type integer (level 2) → `spec.format.schema[4].fields[0].type: ... should match`
  - json without schema → `spec.format.schema: ... json needs the record's fields`; avro without registry
    → `spec.format.registry: ... add registry`; subjectNameStrategy record without recordName →
    `spec.format.registry.recordName: ... add recordName`
  - SASL_SSL without mechanism and credentials → one line each for saslMechanism, username, password:
    `spec.source.security.username: Invalid value: protocol SASL_SSL needs username; add it`
  - SSL with clientCert but no clientKey → `spec.source.security.clientCert: ... mutual TLS needs both`
  - a SecretRef with both secretKeyRef and env → `spec.source.security.username: ... set exactly one of
    secretKeyRef or env`
  - an inline username → `.spec.source.security.username: expected map, got &{bob}` (server-side apply
    cannot build its typed patch; the value is not a reference)
  - consumer property bootstrap.servers → `spec.source.properties: Invalid value: bootstrap.servers is
    set by Icefall; use the spec.source fields ...`; config.providers → `... config.providers is not on
    the allow-list of Kafka consumer properties a table may set ...`
  - a catalog's py-io-impl (or io-impl in secretProperties), a table's write.location-provider.impl →
    `spec.table.catalog.properties: Invalid value: py-io-impl: class-valued properties are refused:
    Icefall never loads code a table names ...`
  - table property icefall.offsets → `spec.table.properties: ... properties under 'icefall.' are written
    by Icefall's commits`
  - a sql catalog without warehouse → `spec.table.catalog.warehouse: ... needs a warehouse location`
  - a catalog URI with a password → `spec.table.catalog.uri: ... the URI carries a password` (the
    password itself is not echoed)
  - metadata.name 9lives without spec.table.name → `spec.table.name: ... metadata.name starts with a
    digit, so it does not make an Iceberg table name; set spec.table.name`
  - compaction.orphanMinAgeSeconds 60 → `spec.compaction.orphanMinAgeSeconds: Invalid value: 60: ... should
    be greater than or equal to 3600`
  - compaction.minReplicas 3 with maxReplicas 1 → `spec.compaction.minReplicas: Invalid value:
    minReplicas is more than maxReplicas; ...`
  - retention on column id (not time-partitioned) → `spec.retention.field: Invalid value: retention.field
    must be partitioned by hour, day, month or year: ...`
  - an unknown field spec.source.partitions → `.spec.source.partitions: field not declared in schema`
  - both spec.source.topic and topics → `spec.source.topics: Invalid value: ... name the topic to read
    (topic: <name>), the topics (topics: [...]) or a pattern (topicPattern: <regex>), one of them only`; a
    topicPattern beside topic → the same on `spec.source.topicPattern`; neither → `spec.source.topic: ...
    topic is required`; a key with topics or a topicPattern → `spec.key: ... a keyed table (mode upsert or
    cdc) reads one topic`; the dead-letter topic among the topics → `spec.deadLetter.topic: ... must differ
    from the source topic` (whether a topicPattern matches it is the operator's and `icefall validate`'s
    check: CEL's regular expressions are RE2's, not Java's or Python's)
  - spec.unrouted without routes → `spec.unrouted: ... unrouted applies with routes`; a keyed dynamic route →
    `spec.dynamicRoute: ... dynamicRoute needs mode append`; a route table's class-valued property →
    `spec.routes[0].table.properties...`
  - spec.table.name: null → `spec.table.name: Invalid value: "null": ... must be of type string`
  - mode upsert without a key, or a key with mode append → `spec.key: Invalid value: mode upsert and cdc
    need a key (the columns that identify a row), mode append has none`; mode merge → `spec.mode:
    Unsupported value: "merge": supported values: "append", "upsert", "cdc"`
- Unknown fields and nulls depend on the client. Server-side apply rejects both (above), whatever
  `--validate` says. Client-side `kubectl create`/`apply` rejects unknown fields by default
  (`--validate=strict`: `strict decoding error: unknown field "spec.source.partitions"`). A client that does
  not ask for strict field validation (`kubectl --validate=warn`, the Python client's default) gets the
  object created with the unknown field pruned (and a warning), and an explicit null pruned, so the
  models see the default.
- Updates: changing spec.source.topic, spec.table.namespace, spec.table.name, spec.table.catalog or
  spec.mode (and with it spec.key), or adding/removing the catalog or the table name, or going from
  spec.source.topic to topics or topicPattern, is REJECTED by CEL, e.g. `spec.source.topic: Invalid
  value: "orders-v2": spec.source.topic is immutable (a table follows one topic for its whole life); to
  change it, create a new StreamingTable`; changing freshness.targetSeconds, the list spec.source.topics or
  spec.source.topicPattern, is accepted.
- The status subresource takes a status built with the status models, and a reason this release does
  not know (a newer operator's: the CRD stores any CamelCase word), but rejects one that is not
  CamelCase; `kubectl get st` shows Ready, Freshness, the spec's Target, Lag and Files from it, `-o wide`
  adds Ready's reason and message, the Ingesting and Degraded reasons, the last commit's age, the
  compaction backlog and the snapshots; `kubectl get icefall` lists StreamingTables by category.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from icefall.api import (
    Condition,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    FreshnessStatus,
    KafkaSource,
    StreamingTableStatus,
    TableStatus,
    load_manifest,
    streaming_table_from_object,
)
from icefall.api.crd import CRD_NAME
from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.tools import tool_dir

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "orders.yaml"
NAMESPACE = "crd-admission"
Obj = dict[str, Any]


class Kubectl:
    def __init__(self, kube: KubeAPIServer) -> None:
        self.binary = str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl")
        self.env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "HOME": str(kube.workdir)}

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, *args], input=stdin, capture_output=True, text=True, env=self.env, timeout=60,
            check=False,
        )  # fmt: skip

    def ok(self, *args: str, stdin: str | None = None) -> str:
        result = self.run(*args, stdin=stdin)
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed:\n{result.stdout}{result.stderr}"
        return result.stdout

    def apply(self, obj: Obj) -> subprocess.CompletedProcess[str]:
        return self.run("apply", "--server-side", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(obj))

    def get(self, name: str) -> Obj:
        found: Obj = json.loads(self.ok("get", "st", name, "-n", NAMESPACE, "-o", "json"))
        return found


@pytest.fixture(scope="module")
def kubectl(kube: KubeAPIServer) -> Kubectl:
    tool = Kubectl(kube)
    tool.ok("apply", "--server-side", "-f", str(REPO / "crds"))
    # kubectl wait errors out ("accessor error: <nil>") instead of waiting when it reads the CRD before
    # the API server has given it any condition (seen once in a fresh-clone run): ask again until it waits.
    deadline = time.monotonic() + 60
    while (
        waited := tool.run("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    ).returncode:
        assert "accessor error" in waited.stderr and time.monotonic() < deadline, waited.stderr
        time.sleep(0.5)
    tool.ok("create", "namespace", NAMESPACE)
    return tool


def example(name: str) -> Obj:
    obj: Obj = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    obj["metadata"] = {"name": name}
    return obj


def _table(printed: str) -> dict[str, str]:
    """One row of `kubectl get` output, header -> value, cut at the header's column starts."""
    header, row = printed.rstrip("\n").splitlines()
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


# --- installing ------------------------------------------------------------------------------------------


def test_crd_is_established_and_structural(kubectl: Kubectl) -> None:
    crd = json.loads(kubectl.ok("get", "crd", CRD_NAME, "-o", "json"))
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    assert conditions.get("NonStructuralSchema", "False") == "False"
    assert crd["status"]["acceptedNames"]["shortNames"] == ["st"]


def test_kubectl_explain_shows_the_model_descriptions(kubectl: Kubectl) -> None:
    # The API server publishes a new CRD's OpenAPI a little after it is Established.
    deadline = time.monotonic() + 60
    while kubectl.run("explain", "streamingtables").returncode != 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    explained = " ".join(kubectl.ok("explain", "streamingtables.spec.source").split())
    by_alias = {info.alias: info for info in KafkaSource.model_fields.values()}
    for field in ("topic", "bootstrapServers", "startingPosition", "security", "properties"):
        description = by_alias[field].description or ""
        assert field in explained and " ".join(description.split()) in explained
    timestamp = " ".join(kubectl.ok("explain", "st.spec.source.startingPosition.timestampMs").split())
    assert "milliseconds since the Unix epoch" in timestamp


# --- accepting and defaulting ------------------------------------------------------------------------------


def test_example_is_accepted_and_defaults_are_filled(kubectl: Kubectl) -> None:
    obj = example("orders")
    applied = kubectl.apply(obj)
    assert applied.returncode == 0, applied.stderr
    stored = kubectl.get("orders")
    spec = stored["spec"]
    # Defaults the example leaves out, filled in by the API server from the CRD.
    assert spec["batch"] == {
        "maxRecords": 1_000_000,
        "minIntervalSeconds": 1,
        "pipelined": True,
        "maxCollectBytes": 64 << 20,
    }
    assert spec["source"]["security"] == {"protocol": "PLAINTEXT"}
    assert spec["deadLetter"]["maxRecordBytes"] == 1024 * 1024
    assert (spec["suspend"], spec["deletionPolicy"], spec["format"]["type"]) == (False, "Retain", "json")
    assert spec["transforms"] == {}
    assert spec["table"]["sortOrder"][0]["direction"] == "asc"
    assert all(column["required"] in (True, False) for column in spec["format"]["schema"])
    # ...and they mean what the models mean.
    assert streaming_table_from_object(stored).spec == load_manifest(EXAMPLE).spec


def test_every_example_is_accepted_as_icefall_validate_says(kubectl: Kubectl) -> None:
    """What `icefall validate` calls valid, the API server accepts: every example under examples/ (the
    Secret beside it included), server-side, as a dry run. (The other way round, every refusal below is
    refused by validate too: tests/unit/test_cli_validate.py.)"""
    files = [
        path
        for path in sorted(REPO.joinpath("examples").glob("*.yaml"))
        if any(d and d.get("kind") == "StreamingTable" for d in yaml.safe_load_all(path.read_text()))
    ]
    assert len(files) >= 16
    # A namespace of their own: NAMESPACE holds tables other tests made under the examples' names, which
    # an apply would update (and the immutable fields refuse), not create.
    kubectl.run("create", "namespace", "examples")
    for path in files:
        kubectl.ok("apply", "--server-side", "--dry-run=server", "-n", "examples", "-f", str(path))


# --- rejecting -------------------------------------------------------------------------------------------

Mutation = Callable[[Obj], object]


def _spec(obj: Obj) -> Obj:
    spec: Obj = obj["spec"]
    return spec


def _topics(obj: Obj, topics: list[str]) -> Obj:
    """`obj`'s spec reading `topics` instead of its topic."""
    _spec(obj)["source"].pop("topic", None)
    _spec(obj)["source"]["topics"] = topics
    return _spec(obj)


def _pattern(obj: Obj, pattern: str) -> Obj:
    """`obj`'s spec reading the topics `pattern` selects instead of its topic."""
    _spec(obj)["source"].pop("topic", None)
    _spec(obj)["source"]["topicPattern"] = pattern
    return _spec(obj)


def _catalog(**extra: Any) -> Mutation:
    return lambda o: _spec(o)["table"].__setitem__("catalog", {"name": "lake", **extra})


REJECTED: list[tuple[str, Mutation, list[str]]] = [
    ("missing-topic", lambda o: _spec(o)["source"].pop("topic"), ["spec.source.topic", "topic is required"]),
    (
        "topic-and-topics",
        lambda o: _spec(o)["source"].__setitem__("topics", ["orders-eu", "orders-us"]),
        ["spec.source.topics: Invalid value", "or a pattern (topicPattern: <regex>), one of them only"],
    ),
    (
        "keyed-topics",
        lambda o: _topics(o, ["a", "b"]).update(mode="upsert", key=["id"]),
        ["spec.key: Invalid value", "a keyed table (mode upsert or cdc) reads one topic"],
    ),
    (
        "topic-and-pattern",
        lambda o: _spec(o)["source"].__setitem__("topicPattern", "orders-.*"),
        ["spec.source.topicPattern: Invalid value", "or a pattern (topicPattern: <regex>), one of them only"],
    ),
    (
        "keyed-pattern",
        lambda o: _pattern(o, "orders-.*").update(mode="upsert", key=["id"]),
        ["spec.key: Invalid value", "a keyed table (mode upsert or cdc) reads one topic"],
    ),
    (
        "dead-letter-among-topics",
        lambda o: _topics(o, ["a", "b"]).update(deadLetter={"topic": "b"}),
        ["spec.deadLetter.topic: Invalid value", "the dead-letter topic must differ from the source topic"],
    ),
    (
        "unrouted-without-routes",
        lambda o: _spec(o).__setitem__("unrouted", "DeadLetter"),
        ["spec.unrouted: Invalid value", "unrouted applies with routes"],
    ),
    (
        "keyed-dynamic-route",
        lambda o: _spec(o).update(mode="upsert", key=["id"], dynamicRoute={"from": "Key"}),
        ["spec.dynamicRoute: Invalid value", "dynamicRoute needs mode append", "list the tables in routes"],
    ),
    (
        "route-code-property",
        lambda o: _spec(o).__setitem__(
            "routes",
            [
                {
                    "table": {"name": "x", "properties": {"write.py-location-provider.impl": "e.L"}},
                    "when": "true",
                }
            ],
        ),
        ["spec.routes[0].table.properties"],
    ),
    (
        "freshness-zero",
        lambda o: _spec(o).__setitem__("freshness", {"targetSeconds": 0}),
        ["spec.freshness.targetSeconds: Invalid value: 0", "greater than or equal to 1"],
    ),
    (
        "bad-enum",
        lambda o: _spec(o).__setitem__("deletionPolicy", "Keep"),
        ['spec.deletionPolicy: Unsupported value: "Keep": supported values: "Retain", "Delete"'],
    ),
    (
        "x" * 41,
        lambda o: None,
        ["metadata.name: Too long: may not be more than 40 bytes"],
    ),
    (
        "timestamp-without-ms",
        lambda o: _spec(o)["source"].__setitem__("startingPosition", {"type": "timestamp"}),
        ["spec.source.startingPosition.timestampMs: Invalid value: type timestamp needs timestampMs"],
    ),
    (
        "ms-without-timestamp",
        lambda o: _spec(o)["source"].__setitem__("startingPosition", {"timestampMs": 1700000000000}),
        ["spec.source.startingPosition.timestampMs: Invalid value: timestampMs only applies to type"],
    ),
    (
        "interval-over-target",
        lambda o: _spec(o).__setitem__("batch", {"minIntervalSeconds": 60}),
        ["spec.batch.minIntervalSeconds: Invalid value: batches this far apart cannot meet freshness"],
    ),
    (
        "partition-limit-over-total",
        lambda o: _spec(o).__setitem__("batch", {"maxRecords": 10, "maxRecordsPerPartition": 11}),
        ["spec.batch.maxRecordsPerPartition: Invalid value: larger than maxRecords"],
    ),
    (
        "dead-letter-topic-is-source",
        lambda o: _spec(o)["deadLetter"].__setitem__("topic", "orders"),
        ["spec.deadLetter.topic: Invalid value: the dead-letter topic must differ from the source topic"],
    ),
    (
        "bad-transform",
        lambda o: _spec(o)["table"]["partitioning"][0].__setitem__("transform", "daily"),
        ['spec.table.partitioning[0].transform: Invalid value: "daily"', "should match"],
    ),
    (
        "two-time-transforms",
        lambda o: _spec(o)["table"]["partitioning"].append({"field": "ts", "transform": "hour"}),
        ["spec.table.partitioning: Invalid value: a column has two time transforms"],
    ),
    (
        "sort-twice",
        lambda o: _spec(o)["table"].__setitem__("sortOrder", [{"field": "id"}, {"field": "id"}]),
        ["spec.table.sortOrder: Invalid value: a column appears twice in sortOrder"],
    ),
    (
        "bad-type",
        lambda o: _spec(o)["format"]["schema"][0].__setitem__("type", "integer"),
        ['spec.format.schema[0].type: Invalid value: "integer"', "should match"],
    ),
    (
        "time-type",
        lambda o: _spec(o)["format"]["schema"][0].__setitem__("type", "time"),
        ["spec.format.schema[0].type: Invalid value: 'time' cannot be written by the Iceberg Spark runtime"],
    ),
    (
        "struct-without-fields",
        lambda o: _spec(o)["format"]["schema"][4].pop("fields"),
        ["spec.format.schema[4].fields: Invalid value: a struct needs fields"],
    ),
    (
        "struct-map-key",
        lambda o: _spec(o)["format"]["schema"].__setitem__(
            0,
            {
                "name": "m",
                "type": "map",
                "key": {"type": "struct", "fields": [{"name": "a", "type": "int"}]},
                "value": {"type": "string"},
            },
        ),
        ["spec.format.schema[0].key.type: Invalid value: map keys must be a primitive type"],
    ),
    (
        "nested-bad-type",
        lambda o: _spec(o)["format"]["schema"][4]["fields"][0].__setitem__("type", "integer"),
        ['spec.format.schema[4].fields[0].type: Invalid value: "integer"', "should match"],
    ),
    (
        "sasl-without-credentials",
        lambda o: _spec(o)["source"].__setitem__("security", {"protocol": "SASL_SSL"}),
        [
            f"spec.source.security.{name}: Invalid value: protocol SASL_SSL needs {name}; add it"
            for name in ("saslMechanism", "username", "password")
        ],
    ),
    (
        "half-mutual-tls",
        lambda o: _spec(o)["source"].__setitem__(
            "security", {"protocol": "SSL", "clientCert": {"env": "CLIENT_CERT"}}
        ),
        ["spec.source.security.clientCert: Invalid value: mutual TLS needs both clientCert and clientKey"],
    ),
    (
        "secret-ref-with-both",
        lambda o: _spec(o)["source"].__setitem__(
            "security",
            {
                "protocol": "SASL_SSL",
                "saslMechanism": "PLAIN",
                "username": {"env": "KAFKA_USER", "secretKeyRef": {"name": "kafka", "key": "user"}},
                "password": {"env": "KAFKA_PASSWORD"},
            },
        ),
        ["spec.source.security.username: Invalid value: set exactly one of secretKeyRef or env"],
    ),
    (
        "inline-username",
        lambda o: _spec(o)["source"].__setitem__(
            "security",
            {"protocol": "SASL_SSL", "saslMechanism": "PLAIN", "username": "bob", "password": {"env": "P"}},
        ),
        [".spec.source.security.username: expected map"],
    ),
    (
        "managed-consumer-property",
        lambda o: _spec(o)["source"].__setitem__("properties", {"bootstrap.servers": "other:9092"}),
        ["spec.source.properties: Invalid value: bootstrap.servers is set by Icefall"],
    ),
    (
        "consumer-config-provider",
        lambda o: _spec(o)["source"].__setitem__("properties", {"config.providers": "file"}),
        [
            "spec.source.properties: Invalid value: config.providers is not on the allow-list of Kafka "
            "consumer properties a table may set"
        ],
    ),
    (
        "catalog-py-io-impl",
        _catalog(
            uri="sqlite:////var/lib/icefall/catalog.db",
            warehouse="/w",
            properties={"py-io-impl": "evil.Boom"},
            secretProperties={"io-impl": {"env": "IO"}},
        ),
        [
            "spec.table.catalog.properties: Invalid value: py-io-impl: class-valued properties are refused: "
            "Icefall never loads code a table names",
            "spec.table.catalog.secretProperties: Invalid value: io-impl: class-valued",
        ],
    ),
    (
        "table-location-provider",
        lambda o: _spec(o)["table"]["properties"].__setitem__("write.location-provider.impl", "evil.Where"),
        ["spec.table.properties: Invalid value: write.location-provider.impl: class-valued properties"],
    ),
    (
        "reserved-table-property",
        lambda o: _spec(o)["table"]["properties"].__setitem__("icefall.offsets", "{}"),
        ["spec.table.properties: Invalid value: properties under 'icefall.' are written by Icefall"],
    ),
    (
        "sql-catalog-without-warehouse",
        _catalog(uri="sqlite:////var/lib/icefall/catalog.db"),
        ["spec.table.catalog.warehouse: Invalid value: a sql catalog needs a warehouse location"],
    ),
    (
        "password-in-catalog-uri",
        _catalog(uri="postgresql://icefall:hunter2@db:5432/iceberg", warehouse="s3://lake/warehouse"),
        ["spec.table.catalog.uri: Invalid value: the URI carries a password"],
    ),
    (
        "9lives",
        lambda o: _spec(o)["table"].pop("name", None),
        ["spec.table.name: Invalid value: metadata.name starts with a digit", "set spec.table.name"],
    ),
    (
        "unknown-field",
        lambda o: _spec(o)["source"].__setitem__("partitions", [0]),
        [".spec.source.partitions: field not declared in schema"],
    ),
    (
        "orphan-window-too-short",
        lambda o: _spec(o).__setitem__("compaction", {"orphanMinAgeSeconds": 60}),
        ["spec.compaction.orphanMinAgeSeconds: Invalid value: 60", "greater than or equal to 3600"],
    ),
    (
        "replicas-inverted",
        lambda o: _spec(o).__setitem__("compaction", {"minReplicas": 3, "maxReplicas": 1}),
        ["spec.compaction.minReplicas: Invalid value: minReplicas is more than maxReplicas"],
    ),
    (
        "retention-not-time-partitioned",
        lambda o: _spec(o).__setitem__("retention", {"field": "id", "maxAgeSeconds": 86400}),
        ["spec.retention.field: Invalid value: retention.field must be partitioned by hour, day, month"],
    ),
    (
        "upsert-without-key",
        lambda o: _spec(o).__setitem__("mode", "upsert"),
        ["spec.key: Invalid value: mode upsert and cdc need a key (the columns that identify a row)"],
    ),
    (
        "key-in-append-mode",
        lambda o: _spec(o).__setitem__("key", ["id"]),
        ["spec.key: Invalid value: mode upsert and cdc need a key", "mode append has none"],
    ),
    (
        "sequence-by-in-upsert-mode",
        lambda o: _spec(o).update(mode="upsert", key=["id"], sequenceBy=["source.lsn"]),
        ["spec.sequenceBy: Invalid value: sequenceBy orders Debezium change events; it applies to mode cdc"],
    ),
    (
        "remember-deletes-without-sequence-by",
        lambda o: _spec(o).update(mode="cdc", key=["id"], rememberDeletesSeconds=60),
        ["spec.rememberDeletesSeconds: Invalid value: rememberDeletesSeconds applies with sequenceBy"],
    ),
    (
        "mode-unknown",
        lambda o: _spec(o).__setitem__("mode", "merge"),
        ['spec.mode: Unsupported value: "merge": supported values: "append", "upsert", "cdc"'],
    ),
    (
        "json-without-schema",
        lambda o: _spec(o)["format"].pop("schema"),
        ["spec.format.schema: Invalid value", "json needs the record's fields"],
    ),
    (
        "avro-without-registry",
        lambda o: _spec(o)["format"].__setitem__("type", "avro"),
        ["spec.format.registry: Invalid value", "add registry"],
    ),
    (
        "record-strategy-no-name",
        lambda o: _spec(o).__setitem__(
            "format", {"type": "avro", "registry": {"url": "http://r:8081", "subjectNameStrategy": "record"}}
        ),
        ["spec.format.registry.recordName: Invalid value", "add recordName"],
    ),
    (
        "null-table-name",
        lambda o: _spec(o)["table"].__setitem__("name", None),
        ['spec.table.name: Invalid value: "null"', "must be of type string"],
    ),
]


@pytest.mark.parametrize(("name", "mutate", "expected"), REJECTED, ids=[case[0][:24] for case in REJECTED])
def test_invalid_spec_is_rejected_at_admission(
    kubectl: Kubectl, name: str, mutate: Mutation, expected: list[str]
) -> None:
    obj = example(name)
    mutate(obj)
    result = kubectl.apply(obj)
    assert result.returncode != 0, f"{name} was accepted:\n{result.stdout}"
    for fragment in expected:
        assert fragment in result.stderr, f"expected {fragment!r} in:\n{result.stderr}"
    assert "hunter2" not in result.stderr
    assert kubectl.run("get", "st", name, "-n", NAMESPACE).returncode != 0  # nothing was stored


def test_unknown_fields_and_nulls_are_pruned_for_lenient_clients(
    kubectl: Kubectl, kube: KubeAPIServer
) -> None:
    obj = example("lenient")
    _spec(obj)["source"]["partitions"] = [0]
    strict = kubectl.run("create", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(obj))
    assert strict.returncode != 0 and 'strict decoding error: unknown field "spec.source.partitions"' in (
        strict.stderr
    )
    warned = kubectl.run("create", "--validate=warn", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(obj))
    assert warned.returncode == 0 and 'unknown field "spec.source.partitions"' in warned.stderr
    assert "partitions" not in kubectl.get("lenient")["spec"]["source"]

    api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(kube.kubeconfig)))
    nulls = example("nulls")
    _spec(nulls)["table"]["name"] = None
    _spec(nulls)["source"]["startingPosition"]["timestampMs"] = None
    api.create_namespaced_custom_object("icefall.dev", "v1alpha1", NAMESPACE, "streamingtables", nulls)
    stored = kubectl.get("nulls")
    assert "name" not in stored["spec"]["table"]
    assert stored["spec"]["source"]["startingPosition"] == {"type": "earliest"}
    assert streaming_table_from_object(stored).table_name == "nulls"


# --- updating --------------------------------------------------------------------------------------------

IMMUTABLE: list[tuple[str, Mutation, str]] = [
    (
        "topic",
        lambda o: _spec(o)["source"].__setitem__("topic", "orders-v2"),
        'spec.source.topic: Invalid value: "orders-v2": spec.source.topic is immutable',
    ),
    (
        "namespace",
        lambda o: _spec(o)["table"].__setitem__("namespace", "shop2"),
        'spec.table.namespace: Invalid value: "shop2": spec.table.namespace is immutable',
    ),
    (
        "name",
        lambda o: _spec(o)["table"].__setitem__("name", "orders2"),
        'spec.table.name: Invalid value: "orders2": spec.table.name is immutable',
    ),
    (
        "name-removed",
        lambda o: _spec(o)["table"].pop("name"),
        "spec.table.name: Invalid value: spec.table.name cannot be added or removed after creation",
    ),
    (
        "catalog",
        lambda o: _spec(o)["table"]["catalog"].__setitem__("warehouse", "/elsewhere"),
        "spec.table.catalog: Invalid value: spec.table.catalog is immutable",
    ),
    (
        "catalog-removed",
        lambda o: _spec(o)["table"].pop("catalog"),
        "spec.table.catalog: Invalid value: spec.table.catalog cannot be added or removed after creation",
    ),
    (
        "mode",
        lambda o: _spec(o).update(mode="upsert", key=["id"]),
        'spec.mode: Invalid value: "upsert": spec.mode is immutable',
    ),
    (
        "topic-to-topics",
        lambda o: _topics(o, ["orders"]),
        "spec.source.topic: Invalid value: spec.source.topic cannot be added or removed after creation",
    ),
    (
        "topic-to-pattern",
        lambda o: _pattern(o, "orders.*"),
        "spec.source.topicPattern: Invalid value: spec.source.topicPattern cannot be added or removed after "
        "creation",
    ),
]


@pytest.fixture(scope="module")
def existing(kubectl: Kubectl) -> Obj:
    obj = example("identity")
    _spec(obj)["table"]["catalog"] = {"name": "lake", "uri": "sqlite:////tmp/catalog.db", "warehouse": "/w"}
    applied = kubectl.apply(obj)
    assert applied.returncode == 0, applied.stderr
    return obj


@pytest.mark.parametrize(("field", "mutate", "expected"), IMMUTABLE, ids=[case[0] for case in IMMUTABLE])
def test_identity_fields_cannot_change(
    kubectl: Kubectl, existing: Obj, field: str, mutate: Mutation, expected: str
) -> None:
    changed = copy.deepcopy(existing)
    mutate(changed)
    result = kubectl.apply(changed)
    assert result.returncode != 0, f"changing {field} was accepted"
    assert expected in result.stderr and "create a new StreamingTable" in result.stderr, result.stderr


def test_sequence_by_cannot_change_nor_be_added(kubectl: Kubectl) -> None:
    obj = example("cdc-sequence")
    _spec(obj).update(mode="cdc", key=["id"], sequenceBy=["source.lsn"])
    applied = kubectl.apply(obj)
    assert applied.returncode == 0, applied.stderr
    _spec(obj)["sequenceBy"] = ["source.ts_ms"]
    result = kubectl.apply(obj)
    assert result.returncode != 0
    assert "spec.sequenceBy is immutable (it decides which change of a key wins)" in result.stderr
    _spec(obj).pop("sequenceBy")
    result = kubectl.apply(obj)
    assert result.returncode != 0
    assert "spec.sequenceBy cannot be added or removed after creation" in result.stderr


def test_catalog_cannot_be_added_later(kubectl: Kubectl) -> None:
    obj = example("late-catalog")
    assert kubectl.apply(obj).returncode == 0
    _spec(obj)["table"]["catalog"] = {"name": "lake", "uri": "https://catalog:8181"}
    result = kubectl.apply(obj)
    assert result.returncode != 0
    assert "spec.table.catalog: Invalid value: spec.table.catalog cannot be added or removed" in result.stderr


def test_mutable_fields_can_change(kubectl: Kubectl, existing: Obj) -> None:
    changed = copy.deepcopy(existing)
    _spec(changed)["freshness"] = {"targetSeconds": 30}
    _spec(changed)["suspend"] = True
    result = kubectl.apply(changed)
    assert result.returncode == 0, result.stderr
    stored = kubectl.get("identity")
    assert stored["spec"]["freshness"] == {"targetSeconds": 30} and stored["spec"]["suspend"] is True
    assert stored["metadata"]["generation"] == 2


def test_the_list_of_topics_can_change(kubectl: Kubectl) -> None:
    obj = example("listed")
    _topics(obj, ["orders-eu"])
    assert kubectl.apply(obj).returncode == 0
    _spec(obj)["source"]["topics"] = ["orders-eu", "orders-us"]
    result = kubectl.apply(obj)
    assert result.returncode == 0, result.stderr
    assert kubectl.get("listed")["spec"]["source"]["topics"] == ["orders-eu", "orders-us"]


def test_the_topic_pattern_can_change(kubectl: Kubectl) -> None:
    obj = example("patterned")
    _pattern(obj, "orders-eu")["dynamicRoute"] = {"from": "Topic"}  # a table per topic: routes read patterns
    assert kubectl.apply(obj).returncode == 0
    _spec(obj)["source"]["topicPattern"] = "orders-(eu|us)"
    result = kubectl.apply(obj)
    assert result.returncode == 0, result.stderr
    assert kubectl.get("patterned")["spec"]["source"]["topicPattern"] == "orders-(eu|us)"


# --- status ----------------------------------------------------------------------------------------------


def test_status_subresource_and_printer_columns(kubectl: Kubectl) -> None:
    assert kubectl.apply(example("with-status")).returncode == 0
    status = StreamingTableStatus(
        observed_generation=1,
        conditions=[
            Condition(
                type=ConditionType.READY,
                status=ConditionStatus.TRUE,
                reason=ConditionReason.RUNNING,
                message="following orders",
                last_transition_time=datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
                observed_generation=1,
            ),
            Condition(
                type=ConditionType.DEGRADED,
                status=ConditionStatus.FALSE,
                reason=ConditionReason.HEALTHY,
                last_transition_time=datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
            ),
        ],
        freshness=FreshnessStatus(
            seconds=2.5,
            lag_records=42,
            partition_lag={0: 40, 1: 2},
            last_commit_time=datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
        ),
        table=TableStatus(files=7, avg_file_size_bytes=1024, snapshots=3, compaction_backlog=4),
        table_count=3,
    )
    patch = {"status": status.model_dump(mode="json", by_alias=True, exclude_none=True)}
    kubectl.ok(
        "patch", "st", "with-status", "-n", NAMESPACE, "--subresource=status", "--type=merge",
        "-p", json.dumps(patch),
    )  # fmt: skip
    stored = kubectl.get("with-status")
    assert StreamingTableStatus.model_validate(stored["status"]) == status

    row = kubectl.ok("get", "st", "with-status", "-n", NAMESPACE).splitlines()
    assert row[0].split() == ["NAME", "READY", "FRESHNESS", "TARGET", "LAG", "FILES", "TABLES", "AGE"]
    assert row[1].split()[:7] == ["with-status", "True", "2.5", "10", "42", "7", "3"]
    wide = _table(kubectl.ok("get", "st", "with-status", "-n", NAMESPACE, "-o", "wide"))
    assert list(wide) == [
        "NAME", "READY", "REASON", "FRESHNESS", "TARGET", "LAG", "FILES", "TABLES", "AGE",
        "INGESTING", "DEGRADED", "LAST-COMMIT", "BACKLOG", "SNAPSHOTS", "MESSAGE",
    ]  # fmt: skip
    assert (wide["REASON"], wide["DEGRADED"], wide["BACKLOG"], wide["SNAPSHOTS"]) == (
        "Running",
        "Healthy",
        "4",
        "3",
    )
    assert wide["INGESTING"] == "" and wide["MESSAGE"] == "following orders"
    assert wide["LAST-COMMIT"].endswith(("d", "y")), wide  # an age, like AGE
    assert "streamingtable.icefall.dev/with-status" in kubectl.ok(
        "get", "icefall", "-n", NAMESPACE, "-o", "name"
    )

    # A reason this release does not know (a newer operator's) is stored; one not in CamelCase is not.
    newer = copy.deepcopy(patch)
    newer["status"]["conditions"][0]["reason"] = "ReasonOfANewerRelease"
    kubectl.ok(
        "patch", "st", "with-status", "-n", NAMESPACE, "--subresource=status", "--type=merge",
        "-p", json.dumps(newer),
    )  # fmt: skip
    assert kubectl.get("with-status")["status"]["conditions"][0]["reason"] == "ReasonOfANewerRelease"
    bad = copy.deepcopy(patch)
    bad["status"]["conditions"][0]["reason"] = "all good"
    rejected = kubectl.run(
        "patch", "st", "with-status", "-n", NAMESPACE, "--subresource=status", "--type=merge",
        "-p", json.dumps(bad),
    )  # fmt: skip
    assert rejected.returncode != 0
    assert 'status.conditions[0].reason: Invalid value: "all good"' in rejected.stderr, rejected.stderr
