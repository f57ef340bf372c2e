"""The StreamingTable CustomResourceDefinition, generated from the pydantic models.

`make crds` runs `python -m icefall.api.crd` and checks the result in as
`crds/streamingtables.icefall.dev.yaml`; a unit test fails when that file drifts from `build_crd()`.

How the models' JSON schema becomes a Kubernetes structural schema:
- `$ref`s are inlined; a property's own description wins over the referenced model's docstring.
- `anyOf [X, null]` becomes X: an optional field is simply absent (no field is `nullable`, so `has()` in
  CEL means "set"). An explicit `null` is pruned on create/update (the models read the same default);
  server-side apply refuses it instead.
- `title` and `additionalProperties: false` are dropped: unknown fields are pruned by the API server, or
  refused by server-side apply and by clients asking for strict field validation (kubectl's default);
  maps keep `additionalProperties: <value schema>`; a free-form map or object (`dict[str, Any]`, a model
  with `extra="allow"`: the affinity terms and volume sources of `spec.pods`, whose full Kubernetes schemas
  would outweigh the rest of the CRD) becomes `x-kubernetes-preserve-unknown-fields: true`, beside any
  declared properties; a `const` becomes a one-value `enum`.
  Any keyword the conversion does not know makes `build_crd` fail rather than emit something unchecked.
- Defaults: every scalar default of the models. An object field whose default is the model with its own
  defaults gets `default: {}`, so the API server fills in the nested defaults (`kubectl get -o yaml` shows
  the effective freshness target, starting position, ...). `None` and empty list/map defaults are left
  out: absent means the same. `elementRequired`/`valueRequired` get no server default because they only
  apply to lists and maps, and would otherwise be stored on every column.
- The recursive schema-field model is spelled out to `TYPED_SCHEMA_DEPTH` levels (top-level columns are
  level 1), not to `MAX_NESTING_DEPTH`: each level multiplies the nodes by four (fields, element, key,
  value), so eight levels would be ~22,000 copies and tens of megabytes, far over what etcd stores and
  what `kubectl explain` can load. Below that depth the parts are `x-kubernetes-preserve-unknown-fields`:
  kept as written, so the models (run by the operator and by `icefall run`) still see and check them.
- Column `type` strings get a pattern that mirrors the model's type parser (`TYPE_PATTERN`).
- `x-kubernetes-validations` (CEL) make identity fields immutable (`self == oldSelf` on the topic, the
  catalog, the namespace and the table name, plus rules that forbid adding or removing the optional ones)
  and mirror the cheap cross-field checks of the models (`_RULES`, reusing the models' own regexes and
  key lists). The API server estimates each rule's worst case from maxItems/maxLength and refuses a CRD
  over its budget, so rules iterate only bounded lists (partitioning, sortOrder, the top-level columns)
  and check maps by looking keys up (the one walk of a map, the `icefall.` prefix check on table
  properties, is cheap enough).

Guarantees: `build_crd()` is pure and deterministic, and `render_crd()` is byte-stable; every property has
a description; every CEL rule has a message; the CEL cost stays within the API server's static budget
(the integration test applies the CRD to a real API server, which enforces that).

Not guaranteed: that the API server rejects everything the models reject. Left to the models (the
operator reports them as `Ready=False` with reason `InvalidSpec`; `icefall run` refuses to start):
checks that need the whole schema (partition and sort columns exist and fit their transform, duplicate
column names, nesting depth), number ranges inside strings (decimal precision, bucket counts), property
keys that look secret or carry `kafka.`/`ssl.`/`sasl.` prefixes, blank transform expressions, a dead-letter
table equal to the table, schema parts below `TYPED_SCHEMA_DEPTH`, and the columns' part rules below level
1 (their CEL cost would multiply by every enclosing unbounded list). In `spec.pods`: map keys (label and
annotation keys reserved by the operator, resource names; CEL would walk each map), a mount naming a
volume the template lacks, request above limit, duplicate names, and the source part of a volume.
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, NoDefault
from pydantic_core import core_schema

from icefall.api.pods import (
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    RESERVED_MOUNT_PATHS,
    RESERVED_VOLUME_NAMES,
    RESERVED_VOLUME_PREFIX,
)
from icefall.api.schema import NESTED_TYPES, PRIMITIVE_TYPES, TIME_UNSUPPORTED_MESSAGE
from icefall.api.source import MANAGED_CONSUMER_PROPERTIES
from icefall.api.spec import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, StreamingTable
from icefall.api.table import RESERVED_PROPERTY_PREFIX, SQL_URI_RE, URI_PASSWORD_RE

CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_PATH = f"crds/{CRD_NAME}.yaml"
CATEGORIES = ("icefall",)
HEADER = "# generated by `make crds` from operator/src/icefall/api; do not edit\n"

#: Levels of the recursive schema-field model spelled out in the CRD; deeper parts are kept unchecked.
TYPED_SCHEMA_DEPTH = 3
_RECURSIVE_MODELS = frozenset({"SchemaField", "TypeSpec"})
#: Fields without a server-side default (see the module docstring), as (model, property).
_NO_SERVER_DEFAULT = frozenset(
    {(model, field) for model in _RECURSIVE_MODELS for field in ("elementRequired", "valueRequired")}
)

# A type string as `icefall.api.schema.parse_type` accepts it for a spec (no `time`). Looser than the
# model on numbers (decimal precision and scale, fixed length), which the model checks.
_SPEC_TYPE_NAMES = [t for t in (*PRIMITIVE_TYPES, *NESTED_TYPES) if t != "time"]
TYPE_PATTERN = (
    r"^\s*("
    + "|".join(sorted(_SPEC_TYPE_NAMES, key=lambda t: (-len(t), t)))
    + r"|decimal\(\s*[0-9]+\s*,\s*[0-9]+\s*\)|fixed\[\s*[0-9]+\s*\])\s*$"
)
#: Patterns the models check in validators rather than declare, as (model, property) → pattern.
_EXTRA_PATTERNS: Mapping[tuple[str, str], str] = {
    ("SchemaField", "type"): TYPE_PATTERN,
    ("TypeSpec", "type"): TYPE_PATTERN,
}

# Keywords copied as they are (besides `x-kubernetes-*` extensions); any other keyword is an error.
_KEPT = frozenset(
    {
        "description",
        "type",
        "default",
        "enum",
        "format",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "required",
    }
)
_FORMATS = frozenset({"date-time", "date", "int32", "int64", "byte", "duration"})


# --- CEL rules ------------------------------------------------------------------------------------------


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


_SASL = "['SASL_PLAINTEXT', 'SASL_SSL']"
_SASL_ON = f"(has(self.protocol) && self.protocol in {_SASL})"
_TLS = "['SSL', 'SASL_SSL']"
_TIME_TRANSFORMS = "['year', 'month', 'day', 'hour']"


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

#: Rules on model objects, by model name. `SchemaField` rules apply to top-level columns only.
_RULES: Mapping[str, tuple[Rule, ...]] = {
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
        Rule(
            "self.type in ['json', 'avro']",
            message_expression="self.type + ' is not supported yet; use avro or json'",
            field_path=".type",
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
            "!has(self.deadLetter) || !has(self.deadLetter.topic) || "
            "self.deadLetter.topic != self.source.topic",
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
    ),
    "TableSpec": (
        _fixed_presence("catalog", "spec.table.catalog"),
        _fixed_presence("name", "spec.table.name"),
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
_PROPERTY_RULES: Mapping[tuple[str, str], tuple[Rule, ...]] = {
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
}


# --- JSON schema → structural schema --------------------------------------------------------------------


class _DefaultsFromFactories(GenerateJsonSchema):
    """Reports `default_factory` defaults too: a model instance as the fields that differ from its defaults
    (so `{}` for a plain `Model()`), a non-empty collection as itself; `None` and empty collections as no
    default at all."""

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        default = super().get_default_value(schema)
        factory = schema.get("default_factory")
        if default is NoDefault and factory is not None and not schema.get("default_factory_takes_data"):
            default = factory()  # type: ignore[call-arg]
        if isinstance(default, BaseModel):
            return default.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        if default is None or (isinstance(default, list | dict | tuple | set) and not default):
            return NoDefault
        return default


def _description(text: str) -> str:
    """Docstrings wrap lines inside paragraphs; join them, keep paragraph breaks."""
    paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)


@dataclass
class _Converter:
    defs: Mapping[str, Any]
    used_rules: set[str | tuple[str, str]]

    def convert(self, node: Mapping[str, Any], *, model: str | None = None, depth: int = 0) -> dict[str, Any]:  # noqa: C901, PLR0912 (one branch per JSON Schema keyword)
        """Convert one schema node; `model` names the model whose definition `node` is (for rules)."""
        node = dict(node)
        if "$ref" in node:
            name = node.pop("$ref").rsplit("/", 1)[-1]
            if name in _RECURSIVE_MODELS:
                depth += 1
                if depth > TYPED_SCHEMA_DEPTH:
                    return self._unchecked(node.get("description") or self.defs[name].get("description", ""))
            # The property's own keywords (description, default) win over the definition's.
            return self.convert({**self.defs[name], **node}, model=name, depth=depth)
        if "anyOf" in node:
            choices = [c for c in node.pop("anyOf") if c != {"type": "null"}]
            if len(choices) != 1:
                raise ValueError(f"only 'X or null' unions can become a structural schema, got {choices}")
            return self.convert({**choices[0], **node}, model=model, depth=depth)
        if node.get("default", NoDefault) is None:
            del node["default"]
        if "const" in node:
            node["enum"] = [node.pop("const")]
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("title", "$defs"):  # $defs: already inlined where referenced
                continue
            if key == "properties":
                out[key] = {
                    prop: self._property(model, prop, schema, depth) for prop, schema in value.items()
                }
            elif key == "items":
                out[key] = self.convert(value, depth=depth)
            elif key == "additionalProperties":
                if isinstance(value, dict) and value:
                    out[key] = self.convert(value, depth=depth)
                elif value is True or value == {}:  # free-form: kept as written (see the module docstring)
                    out["x-kubernetes-preserve-unknown-fields"] = True
                elif value is not False:
                    raise ValueError(f"additionalProperties: {value!r} has no structural form")
            elif key == "format":
                if value in _FORMATS:
                    out[key] = value
            elif key == "description":
                out[key] = _description(value)
            elif key in _KEPT or (key.startswith("x-kubernetes-") and key != "x-kubernetes-validations"):
                out[key] = copy.deepcopy(value)
            else:
                raise ValueError(f"JSON schema keyword {key!r} has no structural CRD form (model {model})")
        if "type" not in out:
            raise ValueError(f"schema without a type (model {model}): {node}")
        rules = self._rules(model, depth)
        if rules:
            out["x-kubernetes-validations"] = [r.to_dict() for r in rules]
        return out

    def _property(
        self, model: str | None, prop: str, schema: Mapping[str, Any], depth: int
    ) -> dict[str, Any]:
        converted = self.convert(schema, depth=depth)
        if model is None:
            return converted
        if (model, prop) in _NO_SERVER_DEFAULT:
            converted.pop("default", None)
        if (pattern := _EXTRA_PATTERNS.get((model, prop))) is not None:
            converted["pattern"] = pattern
        if rules := _PROPERTY_RULES.get((model, prop)):
            self.used_rules.add((model, prop))
            converted.setdefault("x-kubernetes-validations", []).extend(r.to_dict() for r in rules)
        return converted

    def _rules(self, model: str | None, depth: int) -> tuple[Rule, ...]:
        if model is None or model not in _RULES:
            return ()
        if model == "SchemaField" and depth != 1:
            return ()  # see "Not guaranteed" in the module docstring
        self.used_rules.add(model)
        return _RULES[model]

    @staticmethod
    def _unchecked(description: str) -> dict[str, Any]:
        note = (
            f"From nesting level {TYPED_SCHEMA_DEPTH + 1} on, the API server stores this as written "
            "and the operator checks it."
        )
        return {
            "type": "object",
            "description": f"{_description(description)} {note}".strip(),
            "x-kubernetes-preserve-unknown-fields": True,
        }


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
            "description": "Status of the Ready condition: True when the table follows the topic.",
        },
        {
            "name": "Reason",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
            "description": "Why the table is or is not ready.",
            "priority": 1,
        },
        {
            "name": "Freshness",
            "type": "number",
            "jsonPath": ".status.freshness.seconds",
            "description": "Seconds between now and the newest record committed to the table.",
        },
        {
            "name": "Target",
            "type": "integer",
            "jsonPath": ".spec.freshness.targetSeconds",
            "description": "The freshness target in seconds (FreshnessMet is False above it).",
        },
        {
            "name": "Lag",
            "type": "integer",
            "jsonPath": ".status.freshness.lagRecords",
            "description": "Records in Kafka not yet in the table.",
        },
        {
            "name": "Files",
            "type": "integer",
            "jsonPath": ".status.table.files",
            "description": "Data files in the table's current snapshot.",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        # -o wide: what an on-call engineer reads next.
        {
            "name": "Ingesting",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ingesting")].reason',
            "description": "Why ingestion is where it is (CaughtUp, CatchingUp, WaitingForLease, ...).",
            "priority": 1,
        },
        {
            "name": "Degraded",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Degraded")].reason',
            "description": "Healthy, or what needs a person (DataLoss, TopicRecreated, BadRecordHalted...).",
            "priority": 1,
        },
        {
            "name": "Last-Commit",
            "type": "date",
            "jsonPath": ".status.freshness.lastCommitTime",
            "description": "How long ago the last ingestion commit landed.",
            "priority": 1,
        },
        {
            "name": "Backlog",
            "type": "integer",
            "jsonPath": ".status.table.compactionBacklog",
            "description": "Compaction and maintenance work items waiting.",
            "priority": 1,
        },
        {
            "name": "Snapshots",
            "type": "integer",
            "jsonPath": ".status.table.snapshots",
            "description": "Snapshots retained in the table's metadata.",
            "priority": 1,
        },
        {
            "name": "Message",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].message',
            "description": "The Ready condition's message: what is wrong, and what to do about it.",
            "priority": 1,
        },
    ]


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A model's JSON schema as a Kubernetes structural schema, with the CEL rules of `_RULES`.

    Raises `ValueError` for what has no structural form (unions other than "X or null", unknown keywords).
    """
    return _convert(model)[0]


def _convert(model: type[BaseModel]) -> tuple[dict[str, Any], set[str | tuple[str, str]]]:
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_DefaultsFromFactories)
    converter = _Converter(defs=raw.get("$defs", {}), used_rules=set())
    return converter.convert(raw, model=model.__name__), converter.used_rules


def build_crd() -> dict[str, Any]:
    """The StreamingTable CustomResourceDefinition (apiextensions.k8s.io/v1) as a plain dict."""
    root, used_rules = _convert(StreamingTable)
    name_schema = root["properties"]["metadata"]["properties"]["name"]
    root["required"] = ["spec"]
    root["properties"].update(
        {
            "apiVersion": {
                "type": "string",
                "description": f"The API version of this object: {GROUP}/{VERSION}.",
            },
            "kind": {"type": "string", "description": f"The kind of this object: {KIND}."},
            # The API server owns metadata: a CRD may restrict only name (and generateName), and may not
            # even describe metadata itself.
            "metadata": {"type": "object", "properties": {"name": name_schema}},
        }
    )
    unused = (set(_RULES) | set(_PROPERTY_RULES)) - used_rules
    if unused:
        raise ValueError(f"CEL rules for models or fields that no longer exist: {sorted(map(str, unused))}")
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "icefall"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Never writes YAML anchors/aliases, however the dict shares objects."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_crd(crd: Mapping[str, Any] | None = None) -> str:
    """The CRD as the YAML text checked in under crds/ (header comment included)."""
    body = yaml.dump(
        dict(crd if crd is not None else build_crd()),
        Dumper=_Dumper,
        sort_keys=True,
        default_flow_style=False,
        allow_unicode=True,
        width=110,
    )
    return HEADER + body


def main(write: Callable[[str], object] = sys.stdout.write) -> None:
    write(render_crd())


if __name__ == "__main__":
    main()
