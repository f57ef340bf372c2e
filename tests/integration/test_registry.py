"""`icefall.kafka.registry.WriterSchemas` against a real schema registry (Apicurio, Confluent-compatible API).

Proves, with schemas registered by confluent-kafka's own `SchemaRegistryClient` and `AvroSerializer`:
- `lookup` gives the Avro writer schema of the ids in framed records (several versions of one subject),
  None for an id the registry does not know and None for the id of a JSON Schema or a Protobuf schema;
- `latest_schema` finds the schema the serializer registered under each subject name strategy (topic,
  record, topic-record: `SchemaRegistry.subject` names the subjects as confluent-kafka's strategies do), and
  a subject the registry lacks, or whose latest schema is not Avro, is a `RegistryError` that is not an
  outage;
- a registry that cannot be reached (a closed port) is `RegistryUnavailableError`, which
  `icefall.ingest.outages.classify` calls an outage of the registry;
- the registry enforces BACKWARD compatibility (the test stack starts it so, as Confluent's default is): a v2
  adding an optional field is accepted, a v2 adding a required field without a default is refused (409),
  so a topic's records stay readable with the latest schema, as ingestion assumes.

Not proved here: decoding (test_avro_decode.py) and ingestion (test_avro_ingest.py) with these schemas.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka.schema_registry import (
    Schema,
    SchemaRegistryClient,
    record_subject_name_strategy,
    topic_record_subject_name_strategy,
    topic_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from icefall.api import SchemaRegistry
from icefall.devstack.procs import free_port
from icefall.devstack.registry import SchemaRegistryServer
from icefall.ingest.outages import classify
from icefall.kafka.registry import RegistryError, RegistryUnavailableError, WriterSchemas
from icefall.plan.outages import Service

pytestmark = pytest.mark.integration

V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "com.shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}],
}
V2: dict[str, Any] = {
    **V1,
    "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}
NOT_AN_ID = 2**31 - 1  # the largest id the wire format's 4 bytes hold


def schema_id(framed: bytes) -> int:
    assert framed[0] == 0
    return int.from_bytes(framed[1:5], "big")


def serialize(
    client: SchemaRegistryClient, topic: str, schema: dict[str, Any], record: dict[str, Any], **conf: Any
) -> bytes:
    serializer = AvroSerializer(client, json.dumps(schema), conf=conf or None)
    value = serializer(record, SerializationContext(topic, MessageField.VALUE))
    assert value is not None
    return value


def writer_schemas(url: str, **registry: Any) -> WriterSchemas:
    return WriterSchemas(SchemaRegistry.model_validate({"url": url, **registry}))


def test_lookup_gives_the_writer_schema_of_each_registered_id(schema_registry: SchemaRegistryServer) -> None:
    client = SchemaRegistryClient({"url": schema_registry.url})
    topic = "it-registry-lookup"
    v1 = schema_id(serialize(client, topic, V1, {"id": 1, "amount": 1.5}))
    v2 = schema_id(serialize(client, topic, V2, {"id": 2, "amount": 2.5, "note": "n"}))
    assert v1 != v2
    found = writer_schemas(schema_registry.url).lookup([v1, v2, NOT_AN_ID])
    assert set(found) == {v1, v2, NOT_AN_ID}
    assert found[NOT_AN_ID] is None
    assert json.loads(found[v1] or "") == V1
    assert json.loads(found[v2] or "") == V2


def test_ids_of_json_schema_and_protobuf_schemas_are_not_writer_schemas(
    schema_registry: SchemaRegistryServer,
) -> None:
    client = SchemaRegistryClient({"url": schema_registry.url})
    json_schema = {"type": "object", "properties": {"id": {"type": "integer"}}}
    json_id = client.register_schema("it-registry-json-value", Schema(json.dumps(json_schema), "JSON"))
    proto = 'syntax = "proto3";\npackage com.shop;\n\nmessage Order {\n  int64 id = 1;\n}\n'
    proto_id = client.register_schema("it-registry-proto-value", Schema(proto, "PROTOBUF"))
    registry = writer_schemas(schema_registry.url)
    assert registry.lookup([json_id, proto_id]) == {json_id: None, proto_id: None}
    with pytest.raises(
        RegistryError, match="the latest schema of subject 'it-registry-json-value' is JSON, not Avro"
    ) as raised:
        registry.latest_schema("it-registry-json")
    assert classify(raised.value) is None


@pytest.mark.parametrize(
    ("strategy", "client_strategy", "subject"),
    [
        ("topic", topic_subject_name_strategy, "{topic}-value"),
        ("record", record_subject_name_strategy, "com.shop.{name}"),
        ("topic-record", topic_record_subject_name_strategy, "{topic}-com.shop.{name}"),
    ],
)
def test_latest_schema_follows_each_subject_name_strategy(
    schema_registry: SchemaRegistryServer, strategy: str, client_strategy: Any, subject: str
) -> None:
    client = SchemaRegistryClient({"url": schema_registry.url})
    # A record name per strategy: the record strategy's subject is shared by every topic.
    name = f"Order{strategy.replace('-', '').title()}"
    topic = f"it-registry-strategy-{strategy}"
    v1 = {**V1, "name": name}
    v2 = {**V2, "name": name}
    for schema, record in ((v1, {"id": 1, "amount": 1.0}), (v2, {"id": 2, "amount": 2.0, "note": None})):
        framed = serialize(client, topic, schema, record, **{"subject.name.strategy": client_strategy})
    assert [s for s in client.get_subjects() if name in s or s.startswith(f"{topic}-")] == [
        subject.format(topic=topic, name=name)
    ]
    registry = writer_schemas(
        schema_registry.url,
        subjectNameStrategy=strategy,
        **({"recordName": f"com.shop.{name}"} if strategy != "topic" else {}),
    )
    assert registry.registry.subject(topic) == subject.format(topic=topic, name=name)
    assert json.loads(registry.latest_schema(topic)) == v2
    assert json.loads(registry.lookup([schema_id(framed)])[schema_id(framed)] or "") == v2


def test_a_subject_the_registry_lacks_is_a_configuration_error(schema_registry: SchemaRegistryServer) -> None:
    with pytest.raises(
        RegistryError, match="the latest schema of subject 'it-registry-none-value'"
    ) as raised:
        writer_schemas(schema_registry.url).latest_schema("it-registry-none")
    assert not isinstance(raised.value, RegistryUnavailableError)
    assert classify(raised.value) is None


def test_a_registry_that_cannot_be_reached_is_an_outage() -> None:
    url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"  # nothing listens there
    registry = writer_schemas(url)
    with pytest.raises(RegistryUnavailableError, match=r"schema id 1: .*[Cc]onnection refused") as raised:
        registry.lookup([1])
    found = classify(raised.value)
    assert found is not None and found.service is Service.REGISTRY
    with pytest.raises(RegistryUnavailableError):
        registry.latest_schema("it-registry-closed")


def test_backward_compatibility_is_enforced(schema_registry: SchemaRegistryServer) -> None:
    client = SchemaRegistryClient({"url": schema_registry.url})
    subject = "it-registry-compat-value"
    client.register_schema(subject, Schema(json.dumps(V1), "AVRO"))
    client.register_schema(subject, Schema(json.dumps(V2), "AVRO"))  # an optional field with a default
    required = {**V1, "fields": [*V1["fields"], {"name": "customer", "type": "string"}]}
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(required), "AVRO"))
    assert refused.value.http_status_code == 409
    assert [v for v in client.get_versions(subject)] == [1, 2]
    assert json.loads(writer_schemas(schema_registry.url).latest_schema("it-registry-compat")) == V2
