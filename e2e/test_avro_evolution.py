"""An Avro topic whose producer adds a field mid-stream, ingested by the operator's driver Pod.

The operator runs as a process; the node runs the driver Pod as a container of the image we ship, against
the session's Kafka broker, the test stack's schema registry (Apicurio, Confluent-compatible API) and the
module's PostgreSQL catalog with its files in the object store (`lake`). Proves:
- a StreamingTable with `format.type: avro` and no inline schema gets its columns from the subject's latest
  schema, and its driver ingests the records confluent-kafka's `AvroSerializer` produced;
- when the producer moves to a schema with a new optional field while the driver runs, the field appears
  in the table in the batch that first carries it: the rows of the new producer hold its value, the rows
  before it null;
- every record is in the table exactly once, and `icefall verify`'s audit agrees by content.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.registry import SchemaRegistryServer
from icefall.testing.kubeapi import JsonApi
from icefall.testing.streams import assert_exactly_once, watermarks

from .conftest import Lake, NodeView, Operator, pod_logs, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.long,
]  # `make test-all`: the pieces are in test_schema_evolution.py

GROUP, VERSION, PLURAL = "icefall.dev", "v1alpha1", "streamingtables"
NAME, TABLE, TOPIC = "e2e-avro", "e2e_avro", "e2e-avro"
V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "com.shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "qty", "type": "int"}],
}
V2: dict[str, Any] = {
    **V1,
    "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}
PER_PRODUCER = 40


@pytest.fixture(autouse=True)
def operator_log_is_clean(operator: Operator) -> Iterator[None]:
    yield
    assert "Traceback" not in operator.log.read_text(errors="replace"), operator.tail()


def test_a_producers_new_field_reaches_the_table_exactly_once(  # noqa: PLR0917 (fixtures)
    rest: JsonApi,
    e2e_namespace: str,
    kafka: KafkaBroker,
    schema_registry: SchemaRegistryServer,
    node: NodeView,
    operator: Operator,
    lake: Lake,
    tmp_path: Path,
) -> None:
    kafka.create_topic(TOPIC, partitions=2)
    client = SchemaRegistryClient({"url": schema_registry.url})
    context = SerializationContext(TOPIC, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})

    def produce(schema: dict[str, Any], records: list[dict[str, Any]]) -> None:
        serialize = AvroSerializer(client, json.dumps(schema))
        for record in records:
            producer.produce(TOPIC, key=str(record["id"]), value=serialize(record, context))
        assert producer.flush(30) == 0

    produce(V1, [{"id": i, "qty": i} for i in range(PER_PRODUCER)])
    st: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "StreamingTable",
        "metadata": {"name": NAME, "namespace": e2e_namespace},
        "spec": {
            "source": {"bootstrapServers": kafka.bootstrap, "topic": TOPIC},
            "format": {"type": "avro", "registry": {"url": schema_registry.url}},
            "table": {"namespace": "it", "name": TABLE, "catalog": lake.block},
            "freshness": {"targetSeconds": 30},
        },
    }
    tables_path = f"/apis/{GROUP}/{VERSION}/namespaces/{e2e_namespace}/{PLURAL}"
    rest.call("POST", tables_path, st)
    catalog = lake.catalog.pyiceberg()

    def explain() -> str:
        status = (rest.get(f"{tables_path}/{NAME}") or {}).get("status")
        return f"{yaml.safe_dump(status)}{pod_logs(node, f'{NAME}-ingest')}\n--- operator\n{operator.tail()}"

    def committed() -> int:
        from icefall.commit import read_committed

        if not catalog.table_exists(("it", TABLE)):
            return 0
        return sum(read_committed(catalog.load_table(("it", TABLE))).offsets.values())

    wait_for("the v1 records in the table", lambda: committed() == PER_PRODUCER, timeout=420, details=explain)
    table = catalog.load_table(("it", TABLE))
    assert [f.name for f in table.schema().fields] == ["id", "qty", "_kafka"]

    started = time.monotonic()
    produce(V2, [{"id": i, "qty": i, "note": f"n{i}"} for i in range(PER_PRODUCER, 2 * PER_PRODUCER)])
    wait_for(
        "the v2 records in the table", lambda: committed() == 2 * PER_PRODUCER, timeout=180, details=explain
    )
    print(f"[e2e] the new field's records landed {time.monotonic() - started:.1f} s after they were produced")

    table.refresh()
    assert [(f.name, str(f.field_type), f.required) for f in table.schema().fields if f.name != "_kafka"] == [
        ("id", "long", True),
        ("qty", "int", True),
        ("note", "string", False),
    ]
    rows = sorted((r["id"], r["qty"], r["note"]) for r in table.scan().to_arrow().to_pylist())
    assert rows == [(i, i, None if i < PER_PRODUCER else f"n{i}") for i in range(2 * PER_PRODUCER)]
    assert_exactly_once(lake.catalog, TABLE, watermarks(kafka, TOPIC), set(), bootstrap=kafka.bootstrap)
    manifest = tmp_path / "table.yaml"
    manifest.write_text(yaml.safe_dump(st))
    verify = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "verify", "-f", str(manifest)],
        env={**os.environ, **lake.variables, "SPARK_LOCAL_IP": "127.0.0.1"}, cwd=tmp_path,
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
    assert "by content: OK" in verify.stdout, verify.stdout
