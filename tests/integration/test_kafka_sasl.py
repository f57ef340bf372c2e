"""`spec.source.security` reaches every Kafka client: against a broker that only lets SASL/PLAIN clients in
on its SASL listener (the stack's `secure_kafka`; test_kafka_security.py has TLS, SCRAM and mutual TLS), a
table whose credentials are `env` references is filled with exactly the produced records (Spark's Kafka
source, the metadata consumer) and verified by the auditor (`icefall verify`), and a wrong password fails
loudly instead of ingesting nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from icefall.api import StreamingTable, load_manifest
from icefall.catalog import CatalogConfig
from icefall.commands.verify import verify_table
from icefall.commit.lease import FileLease
from icefall.devstack.kafka import KafkaBroker
from icefall.ingest.engine import Ingestor
from icefall.kafka.admin import KafkaUnavailableError
from icefall.testing.plugin import PLAIN_USERS
from icefall.testing.streams import drain, manifest_text, table_offsets

pytestmark = pytest.mark.integration

USER, PASSWORD = next(iter(PLAIN_USERS.items()))
SECURITY = {
    "protocol": "SASL_PLAINTEXT",
    "saslMechanism": "PLAIN",
    "username": {"env": "TEST_KAFKA_USER"},
    "password": {"env": "TEST_KAFKA_PASSWORD"},
}


def sasl_table(name: str, topic: str, bootstrap: str) -> StreamingTable:
    return load_manifest(manifest_text(name, topic, bootstrap, security=SECURITY))


def produce_sasl(broker: KafkaBroker, topic: str, count: int) -> None:
    producer = Producer(
        {
            "bootstrap.servers": broker.sasl_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": USER,
            "sasl.password": PASSWORD,
        }
    )
    for i in range(count):
        value = {"id": i, "customer": f"c{i % 3}", "amount": 1.5, "ts": "2026-11-22T10:00:00Z"}
        producer.produce(topic, key=str(i), value=json.dumps(value))
    assert producer.flush(30) == 0


def test_sasl_plain_ingestion_reads_every_record(
    secure_kafka: KafkaBroker,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEST_KAFKA_USER", USER)
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", PASSWORD)
    secure_kafka.create_topic("it-sasl", partitions=2)
    produce_sasl(secure_kafka, "it-sasl", 40)
    st = sasl_table("orders_sasl", "it-sasl", secure_kafka.sasl_bootstrap)
    ingestor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "lease.json", "sasl-writer"))
    ingestor.start(lease_timeout=10)
    try:
        reports = drain(ingestor)
    finally:
        ingestor.close()
    assert sum(r.records_read for r in reports) == 40
    main, dlq = table_offsets(catalog_config, "orders_sasl")
    assert sum(main.values()) == len(main) == 40
    assert not dlq
    report = verify_table(st, catalog_config)  # `icefall verify` connects with the same credentials
    assert report.ok, report.render()


def test_wrong_password_fails_loudly(
    secure_kafka: KafkaBroker,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEST_KAFKA_USER", USER)
    monkeypatch.setenv("TEST_KAFKA_PASSWORD", "wrong-password")
    secure_kafka.create_topic("it-sasl-denied")
    produce_sasl(secure_kafka, "it-sasl-denied", 5)
    st = sasl_table("orders_sasl_denied", "it-sasl-denied", secure_kafka.sasl_bootstrap)
    ingestor = Ingestor(st, catalog_config, spark, FileLease(tmp_path / "lease.json", "sasl-writer"))
    ingestor.start(lease_timeout=10)
    try:
        with pytest.raises(KafkaUnavailableError) as raised:
            ingestor.run_batch()
    finally:
        ingestor.close()
    assert "refused the credentials" in str(raised.value)
    assert "spec.source.security" in str(raised.value)
    assert "wrong-password" not in str(raised.value)
