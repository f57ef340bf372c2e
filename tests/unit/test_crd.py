"""The checked-in CRD is exactly what the models generate, and it is a CRD the API server can take.

Proves: `crds/streamingtables.icefall.dev.yaml` equals `render_crd()` byte for byte (when it does not, the
failure says to run `make crds`) and rendering is deterministic; the schema is structural (every node has
a type; no `$ref`, `anyOf`/`oneOf`/`allOf`/`not`, `title`, `nullable` or `additionalProperties: false`;
`properties` and `additionalProperties` never share a node; root metadata restricts only `name`); every
property has a description; defaults are valid for their node and mean what the models mean (a minimal
manifest defaulted the way the API server defaults reads back as the same StreamingTable, and every
defaulted object is the model's default); identity fields carry `self == oldSelf`; every CEL rule has a
message; the `type` pattern agrees with the model's type parser; condition reasons are a CamelCase
pattern, not an enum (a newer operator's reasons pass an older CRD), with this release's listed; the
recursive schema is typed to `TYPED_SCHEMA_DEPTH` and kept unchecked below; names, printer columns and
the status subresource are the documented ones; unions that have no structural form are refused.

What the API server does with the schema (admission, CEL cost, pruning) is proven in
tests/integration/test_crd_admission.py.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import Field

from icefall.api import (
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    VERSION,
    SchemaField,
    StreamingTable,
    parse_manifest,
    streaming_table_from_object,
)
from icefall.api.base import ApiModel
from icefall.api.crd import CRD_PATH, HEADER, build_crd, render_crd
from icefall.api.crd_schema import TYPE_PATTERN, TYPED_SCHEMA_DEPTH, structural_schema
from icefall.api.status import REASON_MAX_LENGTH, REASON_PATTERN, ConditionReason

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
Node = dict[str, Any]


@pytest.fixture(scope="module")
def crd() -> Node:
    return build_crd()


@pytest.fixture(scope="module")
def root(crd: Node) -> Node:
    schema: Node = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def walk(node: Node, path: str = "") -> Iterator[tuple[str, Node]]:
    """Every schema node with a readable path (`.spec.format.schema[*].fields[*]`)."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[*]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{*}}")


def at(root: Node, path: str) -> Node:
    """The node at a dotted path; `[*]` steps into array items."""
    node = root
    for part in re.findall(r"[^.\[\]]+|\[\*\]", path):
        node = node["items"] if part == "[*]" else node["properties"][part]
    return node


# --- drift -----------------------------------------------------------------------------------------------


def test_checked_in_crd_matches_the_models() -> None:
    checked_in = (REPO / CRD_PATH).read_text(encoding="utf-8")
    assert checked_in == render_crd(), (
        f"{CRD_PATH} is out of date with the models in operator/src/icefall/api; run `make crds` "
        "and commit the result"
    )


def test_rendering_is_deterministic_and_self_describing(crd: Node) -> None:
    text = render_crd()
    assert text == render_crd(build_crd())
    assert text.startswith(HEADER) and "do not edit" in HEADER and "make crds" in HEADER
    assert "&id" not in text and "*id" not in text  # no YAML anchors: every node is spelled out
    assert yaml.safe_load(text) == crd


def test_crd_stays_small_enough_for_client_side_apply(crd: Node) -> None:
    # `kubectl apply` without --server-side stores the whole object in an annotation capped at 256 KiB.
    assert len(json.dumps(crd, separators=(",", ":"))) < 200 * 1024


# --- structural schema ------------------------------------------------------------------------------------


def test_schema_is_structural(root: Node) -> None:
    forbidden = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "nullable", "const"}
    for path, node in walk(root):
        assert not forbidden & node.keys(), f"{path or '(root)'}: {sorted(forbidden & node.keys())}"
        assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path
        assert node.get("additionalProperties") is not False, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if node["type"] == "array":
            assert "items" in node, path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            # Kept as written; only a pod volume also declares a typed part (its name, beside the source).
            assert node["type"] == "object", path
            assert "properties" not in node or path.endswith(".volumes[*]"), path
        for required in node.get("required", []):
            assert required in node.get("properties", {}), f"{path}: required {required} is not a property"


def test_metadata_restricts_only_the_name(root: Node) -> None:
    assert root["properties"]["metadata"] == {
        "type": "object",
        "properties": {"name": root["properties"]["metadata"]["properties"]["name"]},
    }
    name = root["properties"]["metadata"]["properties"]["name"]
    assert name["maxLength"] == 40 and name["pattern"].startswith("^[a-z0-9]")


def test_every_property_has_a_description(root: Node) -> None:
    missing = [
        f"{path}.{prop}"
        for path, node in walk(root)
        for prop, schema in node.get("properties", {}).items()
        if f"{path}.{prop}" != ".metadata" and not schema.get("description", "").strip()
    ]
    # The API server refuses a description on metadata itself; it is the standard ObjectMeta.
    assert not missing, f"properties without a description: {missing}"


def test_unions_without_a_structural_form_are_refused() -> None:
    class Either(ApiModel):
        value: int | str = Field(description="An int or a string.")

    with pytest.raises(ValueError, match="'X or null' unions"):
        structural_schema(Either)


def test_optional_fields_are_plain_types_without_null(root: Node) -> None:
    name = at(root, "spec.table.name")
    assert name["type"] == "string" and "default" not in name
    assert "default" not in at(root, "spec.source.startingPosition.timestampMs")
    assert at(root, "spec.table.properties")["additionalProperties"] == {"type": "string"}
    secret = at(root, "spec.table.catalog.secretProperties")["additionalProperties"]
    assert set(secret["properties"]) == {"secretKeyRef", "env"}


# --- defaults --------------------------------------------------------------------------------------------


def apply_defaults(schema: Node, value: Any) -> Any:
    """Default like the API server: fill absent properties that have a default, then descend."""
    if isinstance(value, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key in value:
            value[key] = apply_defaults(schema["additionalProperties"], value[key])
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(schema["items"], item) for item in value]
    return value


MINIMAL = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: clicks}
spec:
  source: {bootstrapServers: "kafka:9092", topic: clicks}
  format:
    schema:
      - {name: id, type: long}
      - {name: tags, type: list, element: {type: string}}
      - {name: where, type: struct, fields: [{name: city, type: string}]}
"""


def test_server_defaults_mean_the_model_defaults(root: Node) -> None:
    manifest = yaml.safe_load(MINIMAL)
    defaulted = apply_defaults(root, copy.deepcopy(manifest))
    assert streaming_table_from_object(defaulted) == parse_manifest(MINIMAL)
    spec = defaulted["spec"]
    assert spec["freshness"] == {"targetSeconds": 10}
    assert spec["batch"] == {
        "maxRecords": 1_000_000,
        "minIntervalSeconds": 1,
        "maxCollectBytes": 64 * 1024 * 1024,
        "pipelined": True,
    }
    assert spec["source"]["startingPosition"] == {"type": "earliest"}
    assert spec["source"]["security"] == {"protocol": "PLAINTEXT"}
    assert spec["deadLetter"] == {"table": {"enabled": True}, "maxRecordBytes": 1024 * 1024}
    assert spec["table"] == {"format": "iceberg", "namespace": "default"}
    assert (spec["suspend"], spec["deletionPolicy"], spec["format"]["type"]) == (False, "Retain", "json")
    # Only what applies to every column is stored on every column.
    assert spec["format"]["schema"][0] == {"name": "id", "type": "long", "required": False}


def test_every_default_is_valid_for_its_node(root: Node) -> None:
    python_types: dict[str, type] = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "boolean": bool,
    }
    seen = 0
    for path, node in walk(root):
        if "default" not in node:
            continue
        seen += 1
        default: Any = node["default"]
        assert isinstance(default, python_types[node["type"]]), path
        assert "enum" not in node or default in node["enum"], path
        if node["type"] == "integer":
            assert node.get("minimum", default) <= default <= node.get("maximum", default), path
        if node["type"] == "object":
            assert not set(node.get("required", [])) - set(node["default"]), (
                f"{path}: default lacks required fields"
            )
    assert seen > 20


# --- CEL rules -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["spec.source.topic", "spec.table.catalog", "spec.table.namespace", "spec.table.name"]
)
def test_identity_fields_are_immutable(root: Node, path: str) -> None:
    rules = at(root, path)["x-kubernetes-validations"]
    immutable = [r for r in rules if r["rule"] == "self == oldSelf"]
    assert len(immutable) == 1
    assert immutable[0]["message"].startswith(f"{path} is immutable")
    assert "create a new StreamingTable" in immutable[0]["message"]


def test_optional_identity_fields_cannot_appear_or_disappear(root: Node) -> None:
    rules = {r["rule"]: r for r in at(root, "spec.table")["x-kubernetes-validations"]}
    for field in ("catalog", "name"):
        rule = rules[f"has(self.{field}) == has(oldSelf.{field})"]
        assert rule["fieldPath"] == f".{field}" and f"spec.table.{field}" in rule["message"]


def test_every_rule_has_a_message(root: Node) -> None:
    count = 0
    for path, node in walk(root):
        for rule in node.get("x-kubernetes-validations", []):
            count += 1
            assert rule.get("message") or rule.get("messageExpression"), f"{path}: {rule['rule']}"
            assert set(rule) <= {"rule", "message", "messageExpression", "fieldPath"}, path
    assert count >= 30


def test_column_rules_sit_on_top_level_columns_only(root: Node) -> None:
    """Nested levels sit in unbounded lists, where the API server would estimate their cost too high."""
    assert len(at(root, "spec.format.schema[*]")["x-kubernetes-validations"]) >= 10
    assert "x-kubernetes-validations" not in at(root, "spec.format.schema[*].fields[*]")
    assert "x-kubernetes-validations" not in at(root, "spec.format.schema[*].element")


# --- the recursive schema ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "boolean", "int", "long", "float", "double", "date", "timestamp", "timestamptz", "string", "uuid",
        "binary", "struct", "list", "map", "decimal(10,2)", "decimal( 38 , 0 )", "fixed[16]", " long ",
    ],
)  # fmt: skip
def test_type_pattern_accepts_what_the_model_accepts(text: str) -> None:
    SchemaField.model_validate({"name": "c", "type": text, **_parts(text.strip())})  # the model accepts it...
    assert re.fullmatch(TYPE_PATTERN, text)  # ...and so does the API server


@pytest.mark.parametrize("text", ["time", "integer", "Long", "decimal(10)", "fixed[]", "list<string>", ""])
def test_type_pattern_rejects_what_the_model_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        SchemaField.model_validate({"name": "c", "type": text})
    assert not re.fullmatch(TYPE_PATTERN, text)


def _parts(kind: str) -> Node:
    parts: dict[str, Node] = {
        "struct": {"fields": [{"name": "a", "type": "int"}]},
        "list": {"element": {"type": "int"}},
        "map": {"key": {"type": "string"}, "value": {"type": "int"}},
    }
    return parts.get(kind, {})


def test_schema_fields_are_typed_to_the_documented_depth(root: Node) -> None:
    level = at(root, "spec.format.schema[*]")
    for _ in range(TYPED_SCHEMA_DEPTH - 1):
        assert level["properties"]["type"]["pattern"] == TYPE_PATTERN
        level = level["properties"]["fields"]["items"]
    assert level["properties"]["type"]["pattern"] == TYPE_PATTERN  # the last typed level
    for part in ("element", "key", "value"):
        deeper = level["properties"][part]
        assert deeper["x-kubernetes-preserve-unknown-fields"] is True
        assert "operator checks it" in deeper["description"]
    assert level["properties"]["fields"]["items"]["x-kubernetes-preserve-unknown-fields"] is True


# --- names, columns, subresources ------------------------------------------------------------------------


def test_names_columns_and_subresources(crd: Node, root: Node) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}" and spec["group"] == GROUP
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == KIND and spec["names"]["shortNames"] == list(SHORT_NAMES) == ["st"]
    assert spec["names"]["categories"] == ["icefall"]
    (version,) = spec["versions"]
    assert version["name"] == VERSION and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) == 0] == [
        "Ready", "Freshness", "Target", "Lag", "Files", "Tables", "Age",
    ]  # fmt: skip
    assert [c["name"] for c in version["additionalPrinterColumns"] if c.get("priority", 0) == 1] == [
        "Reason", "Ingesting", "Degraded", "Last-Commit", "Backlog", "Snapshots", "Message",
    ]  # fmt: skip
    assert columns["Target"]["jsonPath"] == ".spec.freshness.targetSeconds"
    assert columns["Degraded"]["jsonPath"] == '.status.conditions[?(@.type=="Degraded")].reason'
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Freshness"]["jsonPath"] == ".status.freshness.seconds"
    assert columns["Lag"]["jsonPath"] == ".status.freshness.lagRecords"
    assert columns["Files"]["jsonPath"] == ".status.table.files"
    assert columns["Tables"]["jsonPath"] == ".status.tableCount"  # how many tables it writes
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"].split("[")[0].removeprefix(".")
        if not path.startswith("metadata"):
            at(root, path)  # the column points at a field the schema declares
    conditions = at(root, "status.conditions")
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]


def test_the_model_and_the_crd_agree_on_required_fields(root: Node) -> None:
    assert root["required"] == ["spec"]
    assert set(at(root, "spec")["required"]) == {"source", "format"}
    # topic or topics: exactly one, by a rule (`icefall.api.crd_rules`)
    assert set(at(root, "spec.source")["required"]) == {"bootstrapServers"}
    assert StreamingTable.model_fields["spec"].is_required()


def test_condition_reasons_are_camel_case_words_not_an_enum(root: Node) -> None:
    """Helm never upgrades a CRD: a reason a newer operator adds must pass an older CRD, so the CRD stores
    any CamelCase word and lists this release's reasons in its description; the model keeps the enum."""
    condition = root["properties"]["status"]["properties"]["conditions"]["items"]["properties"]
    reason = condition["reason"]
    assert "enum" not in reason and reason["pattern"] == REASON_PATTERN, reason
    assert reason["maxLength"] == REASON_MAX_LENGTH
    for known in ConditionReason:
        assert re.fullmatch(REASON_PATTERN, known.value) and len(known.value) <= REASON_MAX_LENGTH
        assert re.search(rf"\b{known.value}\b", reason["description"]), known
    for refused in ("", "allGood", "All Good", "All_Good", "Ready!", "A" * (REASON_MAX_LENGTH + 1)):
        assert not (re.fullmatch(REASON_PATTERN, refused) and len(refused) <= REASON_MAX_LENGTH), refused
    assert "enum" in condition["type"], "a new condition type is an API change"
