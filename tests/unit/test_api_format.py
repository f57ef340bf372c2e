"""`spec.format`: json keeps its inline schema; avro, jsonSchema and protobuf go through a schema registry.

Proves: json still needs `schema` and refuses a registry; avro needs `registry` and may leave `schema` out
(then layout and key checks wait for the registry schema), in every mode; jsonSchema likewise, its map
keys strings as json's; protobuf likewise, with recordName naming its message; the subject follows the
naming strategy; basic auth and recordName mistakes name the field and the fix. Does not prove anything
about a running registry (tests/integration does).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from icefall.api import FormatType, ManifestError, SubjectNameStrategy, parse_manifest

pytestmark = pytest.mark.unit

BASE: dict[str, Any] = {
    "apiVersion": "icefall.dev/v1alpha1",
    "kind": "StreamingTable",
    "metadata": {"name": "orders"},
    "spec": {
        "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
        "format": {"type": "avro", "registry": {"url": "http://registry:8081"}},
        "table": {"name": "orders", "namespace": "shop"},
    },
}


def _with_format(fmt: dict[str, Any], **spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["spec"]["format"] = fmt
    doc["spec"].update(spec)
    return doc


def _error(doc: dict[str, Any]) -> str:
    import yaml

    with pytest.raises(ManifestError) as info:
        parse_manifest(yaml.safe_dump(doc))
    return str(info.value)


def _load(doc: dict[str, Any]) -> Any:
    import yaml

    return parse_manifest(yaml.safe_dump(doc))


def test_avro_without_inline_schema_loads_with_topic_strategy() -> None:
    st = _load(BASE)
    fmt = st.spec.format
    assert fmt.type is FormatType.AVRO
    assert not fmt.schema_known
    assert fmt.registry.subject_name_strategy is SubjectNameStrategy.TOPIC
    assert fmt.registry.subject("orders") == "orders-value"


def test_avro_without_schema_defers_layout_checks() -> None:
    doc = _with_format(BASE["spec"]["format"])
    doc["spec"]["table"]["partitioning"] = [{"field": "ts", "transform": "day"}]
    st = _load(doc)
    assert st.spec.table.partitioning[0].field == "ts"


def test_keyed_modes_load_with_avro_and_check_the_key_once_columns_are_known() -> None:
    upsert = _load(_with_format(BASE["spec"]["format"], mode="upsert", key=["id"]))
    assert upsert.spec.key == ["id"]  # no inline schema: the key is checked against the registry's
    cdc = _load(_with_format(BASE["spec"]["format"], mode="cdc", key=["id"], sequenceBy=["source.lsn"]))
    assert cdc.spec.sequence_by == ["source.lsn"]
    inline = {**BASE["spec"]["format"], "schema": [{"name": "id", "type": "long"}]}
    message = _error(_with_format(inline, mode="upsert", key=["id"]))
    assert "spec.key[0]" in message and "add required: true" in message


@pytest.mark.parametrize(
    ("strategy", "subject"),
    [("record", "com.shop.Order"), ("topic-record", "orders-com.shop.Order")],
)
def test_record_strategies_name_the_subject_after_the_record(strategy: str, subject: str) -> None:
    registry = {"url": "http://r:8081", "subjectNameStrategy": strategy, "recordName": "com.shop.Order"}
    st = _load(_with_format({"type": "avro", "registry": registry}))
    assert st.spec.format.registry.subject("orders") == subject


def test_record_strategy_needs_record_name() -> None:
    message = _error(
        _with_format({"type": "avro", "registry": {"url": "http://r:8081", "subjectNameStrategy": "record"}})
    )
    assert "spec.format.registry.recordName" in message
    assert "add recordName" in message


def test_basic_auth_needs_both_references() -> None:
    registry = {"url": "http://r:8081", "username": {"env": "REGISTRY_USER"}}
    message = _error(_with_format({"type": "avro", "registry": registry}))
    assert "spec.format.registry.password" in message


def test_inline_registry_password_is_refused_without_echo() -> None:
    registry = {"url": "http://r:8081", "username": {"env": "U"}, "password": "hunter2"}
    message = _error(_with_format({"type": "avro", "registry": registry}))
    assert "spec.format.registry.password" in message
    assert "hunter2" not in message


def test_avro_needs_a_registry() -> None:
    message = _error(_with_format({"type": "avro"}))
    assert "spec.format.registry" in message
    assert "add registry" in message


def test_registry_url_must_be_http() -> None:
    message = _error(_with_format({"type": "avro", "registry": {"url": "registry:8081"}}))
    assert "spec.format.registry.url" in message


def test_json_schema_is_read_through_a_registry_and_may_leave_schema_out() -> None:
    st = _load(_with_format({"type": "jsonSchema", "registry": {"url": "http://r:8081"}}))
    assert st.spec.format.type is FormatType.JSON_SCHEMA and not st.spec.format.schema_known
    assert st.spec.format.type.schema_type == "JSON"
    assert "add registry" in _error(_with_format({"type": "jsonSchema"}))
    registry = {"type": "jsonSchema", "registry": {"url": "http://r:8081"}}
    message = _error(_with_format(registry, mode="upsert", key=["id"]))
    assert "not supported with format jsonSchema yet" in message
    bad_key = {"name": "m", "type": "map", "key": {"type": "long"}, "value": {"type": "string"}}
    fmt = {"type": "jsonSchema", "registry": {"url": "http://r:8081"}, "schema": [bad_key]}
    assert "JSON object keys are strings" in _error(_with_format(fmt))


def test_protobuf_is_read_through_a_registry_with_the_record_strategies() -> None:
    registry = {"url": "http://r:8081", "subjectNameStrategy": "record", "recordName": "shop.v1.Order"}
    st = _load(_with_format({"type": "protobuf", "registry": registry}))
    assert st.spec.format.type.schema_type == "PROTOBUF"
    assert st.spec.format.registry.subject("orders") == "shop.v1.Order"
    assert "add registry" in _error(_with_format({"type": "protobuf"}))


def test_json_still_needs_its_schema_and_no_registry() -> None:
    message = _error(_with_format({"type": "json", "registry": {"url": "http://r:8081"}}))
    assert "spec.format.schema" in message
    assert "spec.format.registry" in message
