"""The CRD's CEL rules (`x-kubernetes-validations`): which model or property each one sits on.

`MODEL_RULES` holds the rules on model objects, by model name (`SchemaField` rules apply to top-level
columns only); `PROPERTY_RULES` those on single properties, by (model, property). They make identity fields
immutable (`self == oldSelf` on the topic, the catalog, the namespace and the table name, plus rules that
forbid adding or removing the optional ones) and mirror the cheap cross-field checks of the models,
reusing the models' own regexes and key lists.

Guarantees: every rule has a message. The API server estimates each rule's worst case from
maxItems/maxLength and refuses a CRD over its budget, so rules iterate only bounded lists (partitioning,
sortOrder, the top-level columns) and check maps by looking keys up (the one walk of a map, the `icefall.`
prefix check on table properties, is cheap enough). Not guaranteed: that they reject everything the
models reject (see `icefall.api.crd`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from icefall.api.code_properties import (
    ALLOWED_CONSUMER_PROPERTIES,
    CODE_REASON,
    KNOWN_CODE_KEYS,
    SECURITY_DOC,
)
from icefall.api.pods import (
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    RESERVED_MOUNT_PATHS,
    RESERVED_VOLUME_NAMES,
    RESERVED_VOLUME_PREFIX,
)
from icefall.api.schema import TIME_UNSUPPORTED_MESSAGE
from icefall.api.source import MANAGED_CONSUMER_PROPERTIES
from icefall.api.table import RESERVED_PROPERTY_PREFIX, SQL_URI_RE, URI_PASSWORD_RE


@dataclass(frozen=True)
class Rule:
    """One `x-kubernetes-validations` entry; `field_path` is relative to the schema node it sits on."""

    rule: str
    message: str | None = None
    message_expression: str | None = None
    field_path: str | None = None

    def to_dict(self) -> dict[str, str]:
        out = {"rule": self.rule}
        if self.message is not None:
            out["message"] = self.message
        if self.message_expression is not None:
            out["messageExpression"] = self.message_expression
        if self.field_path is not None:
            out["fieldPath"] = self.field_path
        return out


def _cel_regex(regex: re.Pattern[str]) -> str:
    """A Python regex as a CEL raw string literal for `matches()` (RE2 reads these patterns alike)."""
    flags = "(?i)" if regex.flags & re.IGNORECASE else ""
    if "'" in regex.pattern:
        raise ValueError(f"cannot quote {regex.pattern!r} for CEL")
    return f"r'{flags}{regex.pattern}'"


def _immutable(path: str, why: str) -> Rule:
    return Rule(
        "self == oldSelf",
        message=f"{path} is immutable ({why}); to change it, create a new StreamingTable",
    )


def _fixed_presence(field: str, path: str) -> Rule:
    return Rule(
        f"has(self.{field}) == has(oldSelf.{field})",
        message=(
            f"{path} cannot be added or removed after creation; to change it, create a new StreamingTable"
        ),
        field_path=f".{field}",
    )


_ONE_FORM = (
    "name the topic to read (topic: <name>), the topics (topics: [...]) or a pattern (topicPattern: "
    "<regex>), one of them only"
)
_SASL = "['SASL_PLAINTEXT', 'SASL_SSL']"
_SASL_ON = f"(has(self.protocol) && self.protocol in {_SASL})"
_TLS = "['SSL', 'SASL_SSL']"
_TIME_TRANSFORMS = "['year', 'month', 'day', 'hour']"
_TABLE_FORMAT = "(has(self.format) ? self.format : 'iceberg')"


def _sasl_part(name: str) -> Rule:
    return Rule(
        f"{_SASL_ON} ? has(self.{name}) : !has(self.{name})",
        message_expression=(
            f"{_SASL_ON} ? 'protocol ' + self.protocol + ' needs {name}; add it' : "
            f"'{name} is only used with SASL; remove it or set protocol: SASL_SSL'"
        ),
        field_path=f".{name}",
    )


def _tls_part(name: str) -> Rule:
    return Rule(
        f"(has(self.protocol) && self.protocol in {_TLS}) || !has(self.{name})",
        message=f"{name} is only used with TLS; remove it or set protocol: SSL or SASL_SSL",
        field_path=f".{name}",
    )


def _type_is(kinds: str) -> str:
    return f"self.type.trim() in {kinds}"


def _only(part: str, kind: str, present: str | None = None) -> Rule:
    present = present or f"has(self.{part})"
    return Rule(
        f"!({present}) || self.type.trim() == '{kind}'",
        message=f"only a {kind} has {part}; remove it or set type: {kind}",
        field_path=f".{part}",
    )


# Parts of a schema type must match its kind (mirrors `icefall.api.schema._check_parts`).
_TYPE_NODE_RULES = (
    _only("fields", "struct"),
    _only("element", "list"),
    _only("elementRequired", "list", "has(self.elementRequired) && self.elementRequired"),
    _only("key", "map"),
    _only("value", "map"),
    _only("valueRequired", "map", "has(self.valueRequired) && self.valueRequired"),
    Rule(
        "self.type.trim() != 'struct' || has(self.fields)",
        message="a struct needs fields; add a list of {name, type} entries",
        field_path=".fields",
    ),
    Rule(
        "self.type.trim() != 'list' || has(self.element)",
        message="a list needs an element type, e.g. element: {type: string}",
        field_path=".element",
    ),
    Rule(
        "self.type.trim() != 'map' || has(self.key)",
        message="a map needs a key type, e.g. key: {type: string}",
        field_path=".key",
    ),
    Rule(
        "self.type.trim() != 'map' || has(self.value)",
        message="a map needs a value type, e.g. value: {type: string}",
        field_path=".value",
    ),
    Rule(
        "!has(self.key) || !(self.key.type.trim() in ['struct', 'list', 'map'])",
        message="map keys must be a primitive type, e.g. string",
        field_path=".key.type",
    ),
    Rule("self.type.trim() != 'time'", message=TIME_UNSUPPORTED_MESSAGE, field_path=".type"),
)


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{item}'" for item in items) + "]"


_MANAGED_KEYS = "[" + ", ".join(f"'{key}'" for key in sorted(MANAGED_CONSUMER_PROPERTIES)) + "]"
_ALLOWED_CONSUMER = _cel_list(tuple(sorted(ALLOWED_CONSUMER_PROPERTIES)))
_CATALOG_CODE_KEYS = _cel_list(tuple(k for k in KNOWN_CODE_KEYS if not k.startswith("write.")))
_TABLE_CODE_KEYS = _cel_list(tuple(k for k in KNOWN_CODE_KEYS if k.startswith("write.")))


def _no_code_keys(keys: str, field: str) -> Rule:
    """The best-known class-valued keys, looked up in the map `field` (cheap, unlike walking it)."""
    return Rule(
        f"!has(self.{field}) || !{keys}.exists(k, k in self.{field})",
        message_expression=f"{keys}.filter(k, k in self.{field})[0] + ': {CODE_REASON}; remove it'",
        field_path=f".{field}",
    )


#: Rules on model objects, by model name. `SchemaField` rules apply to top-level columns only.
MODEL_RULES: Mapping[str, tuple[Rule, ...]] = {
    "StreamingTable": (
        Rule(
            "has(self.spec.table.name) || !self.metadata.name.matches('^[0-9]')",
            message=(
                "metadata.name starts with a digit, so it does not make an Iceberg table name; "
                "set spec.table.name"
            ),
            field_path=".spec.table.name",
        ),
    ),
    "Format": (
        Rule(
            "self.type != 'json' || (has(self.schema) && size(self.schema) > 0)",
            message="json needs the record's fields; add schema: [{name, type}, ...]",
            field_path=".schema",
        ),
        Rule(
            "self.type != 'json' || !has(self.registry)",
            message="json records carry no schema id; remove registry or set type: avro",
            field_path=".registry",
        ),
        Rule(
            "self.type == 'json' || has(self.registry)",
            message="records of a registry format are framed by a schema registry: add registry: {url: ...}",
            field_path=".registry",
        ),
    ),
    "SchemaRegistry": (
        Rule(
            "has(self.username) == has(self.password)",
            message="basic auth needs both username and password",
            field_path=".password",
        ),
        Rule(
            "!has(self.subjectNameStrategy) || self.subjectNameStrategy == 'topic' || has(self.recordName)",
            message="record and topic-record name the subject after the record: add recordName",
            field_path=".recordName",
        ),
    ),
    "StreamingTableSpec": (
        Rule(
            # A pattern's match is the operator's check (`KafkaSource.reads`): CEL's matches() is RE2.
            "!has(self.deadLetter) || !has(self.deadLetter.topic) || (has(self.source.topic) ? "
            "self.deadLetter.topic != self.source.topic : "
            "!has(self.source.topics) || !(self.deadLetter.topic in self.source.topics))",
            message="the dead-letter topic must differ from the source topic",
            field_path=".deadLetter.topic",
        ),
        Rule(
            # batch and freshness always hold their defaulted scalars when the spec is validated.
            "!has(self.batch) || !has(self.freshness) || "
            "self.batch.minIntervalSeconds <= self.freshness.targetSeconds",
            message=(
                "batches this far apart cannot meet freshness.targetSeconds; lower "
                "batch.minIntervalSeconds or raise freshness.targetSeconds"
            ),
            field_path=".batch.minIntervalSeconds",
        ),
        Rule(
            # partitioning has at most 16 items: a bounded scan.
            "!has(self.retention) || (has(self.table) && has(self.table.partitioning) && "
            "self.table.partitioning.exists(p, p.field == self.retention.field && has(p.transform) && "
            "p.transform in ['hour', 'day', 'month', 'year']))",
            message=(
                "retention.field must be partitioned by hour, day, month or year: add {field: <column>, "
                "transform: day} to table.partitioning, or name a column partitioned that way"
            ),
            field_path=".retention.field",
        ),
        Rule(
            "(has(self.mode) && self.mode != 'append') == has(self.key)",
            message="mode upsert and cdc need a key (the columns that identify a row), mode append has none",
            field_path=".key",
        ),
        _fixed_presence("key", "spec.key"),
        Rule(
            "!has(self.unrouted) || (has(self.routes) && size(self.routes) > 0) || has(self.dynamicRoute)",
            message="unrouted applies with routes or dynamicRoute; remove it, or add routes",
            field_path=".unrouted",
        ),
        Rule(
            "!has(self.dynamicRoute) || !has(self.mode) || self.mode == 'append'",
            message=(
                "dynamicRoute needs mode append for now: keyed tables route with spec.routes; remove "
                "dynamicRoute, or list the tables in routes"
            ),
            field_path=".dynamicRoute",
        ),
        Rule(
            "(!has(self.source.topics) && !has(self.source.topicPattern)) || !has(self.key) "
            "|| (has(self.routes) && size(self.routes) > 0)",
            message=(
                "a keyed table (mode upsert or cdc) reads one topic: Kafka orders the changes of a key "
                "within a partition of one topic only; use source.topic, mode append, or routes (a table "
                "per topic: a condition on _kafka.topic)"
            ),
            field_path=".key",
        ),
        Rule(
            "!has(self.sequenceBy) || (has(self.mode) && self.mode == 'cdc')",
            message="sequenceBy orders Debezium change events; it applies to mode cdc",
            field_path=".sequenceBy",
        ),
        _fixed_presence("sequenceBy", "spec.sequenceBy"),
        Rule(
            "!has(self.rememberDeletesSeconds) || has(self.sequenceBy)",
            message="rememberDeletesSeconds applies with sequenceBy (mode cdc)",
            field_path=".rememberDeletesSeconds",
        ),
    ),
    "CompactionSpec": (
        Rule(
            # Both are defaulted scalars when the spec is validated.
            "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
            message="minReplicas is more than maxReplicas; lower minReplicas or raise maxReplicas",
            field_path=".minReplicas",
        ),
    ),
    "BatchSpec": (
        Rule(
            "!has(self.maxRecordsPerPartition) || self.maxRecordsPerPartition <= self.maxRecords",
            message="larger than maxRecords; lower it or raise maxRecords",
            field_path=".maxRecordsPerPartition",
        ),
    ),
    "KafkaSource": (
        Rule(
            # Map lookups of a fixed list of keys: cheap however large the map (iterating it is not).
            f"!has(self.properties) || !{_MANAGED_KEYS}.exists(k, k in self.properties)",
            message_expression=(
                f"{_MANAGED_KEYS}.filter(k, k in self.properties)[0] + ' is set by Icefall; use the "
                "spec.source fields (bootstrapServers, security, startingPosition) instead'"
            ),
            field_path=".properties",
        ),
        Rule(
            # A walk of the map, bounded by its maxProperties.
            f"!has(self.properties) || self.properties.all(k, k in {_ALLOWED_CONSUMER})",
            message_expression=(
                f"self.properties.filter(k, !(k in {_ALLOWED_CONSUMER}))[0] + ' is not on the allow-list "
                f"of Kafka consumer properties a table may set (see {SECURITY_DOC}); remove it'"
            ),
            field_path=".properties",
        ),
        Rule(
            "has(self.topic) || has(self.topics) || has(self.topicPattern)",
            message=(
                "topic is required: the Kafka topic to read (or topics: [...] or topicPattern: <regex> to "
                "read several)"
            ),
            field_path=".topic",
        ),
        Rule(
            "!has(self.topic) || !has(self.topics)",
            message=_ONE_FORM,
            field_path=".topics",
        ),
        Rule(
            "!has(self.topicPattern) || (!has(self.topic) && !has(self.topics))",
            message=_ONE_FORM,
            field_path=".topicPattern",
        ),
        _fixed_presence("topic", "spec.source.topic"),
        _fixed_presence("topics", "spec.source.topics"),
        _fixed_presence("topicPattern", "spec.source.topicPattern"),
    ),
    "StartingPosition": (
        Rule(
            "!has(self.type) || self.type != 'timestamp' || has(self.timestampMs)",
            message="type timestamp needs timestampMs (milliseconds since the epoch)",
            field_path=".timestampMs",
        ),
        Rule(
            "(has(self.type) && self.type == 'timestamp') || !has(self.timestampMs)",
            message="timestampMs only applies to type timestamp; remove it or set type: timestamp",
            field_path=".timestampMs",
        ),
    ),
    "KafkaSecurity": (
        *(_sasl_part(name) for name in ("saslMechanism", "username", "password")),
        *(_tls_part(name) for name in ("caCert", "clientCert", "clientKey")),
        Rule(
            "has(self.clientCert) == has(self.clientKey)",
            message="mutual TLS needs both clientCert and clientKey",
            field_path=".clientCert",
        ),
    ),
    "SecretRef": (
        Rule("has(self.secretKeyRef) != has(self.env)", message="set exactly one of secretKeyRef or env"),
    ),
    "CatalogSpec": (
        Rule(
            "self.type != 'sql' || has(self.warehouse)",
            message="a sql catalog needs a warehouse location; add warehouse",
            field_path=".warehouse",
        ),
        Rule(
            f"self.type != 'sql' || self.uri.matches({_cel_regex(SQL_URI_RE)})",
            message=(
                "a sql catalog URI is a database URL such as postgresql://host:5432/db "
                "or sqlite:////path/catalog.db"
            ),
            field_path=".uri",
        ),
        Rule(
            "self.type != 'rest' || self.uri.startsWith('http://') || self.uri.startsWith('https://')",
            message="a rest catalog URI starts with http:// or https://",
            field_path=".uri",
        ),
        Rule(
            f"!self.uri.matches({_cel_regex(URI_PASSWORD_RE)})",
            message=(
                "the URI carries a password; remove it and reference the password in "
                "secretProperties.password"
            ),
            field_path=".uri",
        ),
        _no_code_keys(_CATALOG_CODE_KEYS, "properties"),
        _no_code_keys(_CATALOG_CODE_KEYS, "secretProperties"),
    ),
    "RouteTable": (_no_code_keys(_TABLE_CODE_KEYS, "properties"),),
    "TableSpec": (
        _no_code_keys(_TABLE_CODE_KEYS, "properties"),
        _fixed_presence("catalog", "spec.table.catalog"),
        _fixed_presence("name", "spec.table.name"),
        _fixed_presence("location", "spec.table.location"),
        Rule(
            f"{_TABLE_FORMAT} == {_TABLE_FORMAT.replace('self', 'oldSelf')}",
            message=(
                "spec.table.format is immutable (the table's files are written in it); to change it, create "
                "a new StreamingTable"
            ),
            field_path=".format",
        ),
        Rule(
            f"!has(self.location) || {_TABLE_FORMAT} == 'delta'",
            message="location applies to format delta; an Iceberg table lives where its catalog puts it",
            field_path=".location",
        ),
        Rule(
            f"!has(self.catalog) || {_TABLE_FORMAT} != 'delta'",
            message=(
                "a catalog is not supported with format delta yet: a Delta table is named by its location; "
                "remove spec.table.catalog"
            ),
            field_path=".catalog",
        ),
        Rule(
            f"!has(self.properties) || self.properties.all(k, !k.startsWith('{RESERVED_PROPERTY_PREFIX}'))",
            message=(
                f"properties under '{RESERVED_PROPERTY_PREFIX}' are written by Icefall's commits; remove them"
            ),
            field_path=".properties",
        ),
        Rule(
            "!has(self.partitioning) || self.partitioning.all(a, self.partitioning.exists_one(b, "
            "b.field == a.field && (b.transform == a.transform || "
            "(a.transform.startsWith('bucket[') && b.transform.startsWith('bucket[')) || "
            "(a.transform.startsWith('truncate[') && b.transform.startsWith('truncate[')))))",
            message="a column has the same transform twice in partitioning; remove one",
            field_path=".partitioning",
        ),
        Rule(
            f"!has(self.partitioning) || self.partitioning.all(a, !(a.transform in {_TIME_TRANSFORMS}) || "
            f"self.partitioning.exists_one(b, b.field == a.field && b.transform in {_TIME_TRANSFORMS}))",
            message="a column has two time transforms in partitioning; use one of hour, day, month or year",
            field_path=".partitioning",
        ),
        Rule(
            "!has(self.sortOrder) || self.sortOrder.all(a, self.sortOrder.exists_one(b, b.field == a.field))",
            message="a column appears twice in sortOrder; remove one",
            field_path=".sortOrder",
        ),
    ),
    "SchemaField": _TYPE_NODE_RULES,
    # Pod templates: per-item rules on bounded lists (maxItems), no walk of a map.
    "PodTemplates": (
        Rule(
            "!has(self.executor) || !has(self.executor.serviceAccountAnnotations)",
            message=(
                "executors run as the driver's ServiceAccount; set serviceAccountAnnotations in driver or "
                "common"
            ),
            field_path=".executor.serviceAccountAnnotations",
        ),
    ),
    "EnvVar": (
        Rule(
            f"!(self.name in {_cel_list(RESERVED_ENV_NAMES)}) && "
            f"!{_cel_list(RESERVED_ENV_PREFIXES)}.exists(p, self.name.startsWith(p))",
            message_expression=(
                "self.name + ' is set by the operator; pick another name (not ICEFALL_SPARK_CONF, HOME, or "
                "ICEFALL_POD_*, ICEFALL_KAFKA_*, ICEFALL_CATALOG_*, ICEFALL_REGISTRY_*)'"
            ),
            field_path=".name",
        ),
        Rule("!has(self.value) || !has(self.valueFrom)", message="set value or valueFrom, not both"),
    ),
    "EnvVarSource": (
        Rule(
            "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), "
            "has(self.resourceFieldRef)].filter(x, x).size() == 1",
            message="set exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef",
        ),
    ),
    "Volume": (
        Rule(
            f"!(self.name in {_cel_list(RESERVED_VOLUME_NAMES)}) && "
            f"!self.name.startsWith('{RESERVED_VOLUME_PREFIX}')",
            message_expression=(
                "self.name + ' is a volume of the operator or of Spark; pick another name (not tmp, "
                "spark-local, executor-template or spark-*)'"
            ),
            field_path=".name",
        ),
    ),
    "VolumeMount": (
        Rule(
            f"!{_cel_list(RESERVED_MOUNT_PATHS)}.exists(p, self.mountPath == p || self.mountPath == p + '/')",
            message_expression=(
                "self.mountPath + ' is where the operator or Spark mounts its own volume; mount elsewhere'"
            ),
            field_path=".mountPath",
        ),
    ),
}

#: Rules on single properties, by (model, property).
PROPERTY_RULES: Mapping[tuple[str, str], tuple[Rule, ...]] = {
    ("KafkaSource", "topic"): (
        _immutable("spec.source.topic", "a table follows one topic for its whole life"),
    ),
    ("StreamingTableSpec", "mode"): (_immutable("spec.mode", "it decides what the rows mean"),),
    ("StreamingTableSpec", "key"): (_immutable("spec.key", "it identifies the rows"),),
    ("StreamingTableSpec", "sequenceBy"): (
        _immutable("spec.sequenceBy", "it decides which change of a key wins"),
    ),
    ("TableSpec", "catalog"): (_immutable("spec.table.catalog", "it holds the table"),),
    ("TableSpec", "namespace"): (_immutable("spec.table.namespace", "it identifies the table"),),
    ("TableSpec", "name"): (_immutable("spec.table.name", "it identifies the table"),),
    ("TableSpec", "location"): (_immutable("spec.table.location", "it holds the table"),),
}
