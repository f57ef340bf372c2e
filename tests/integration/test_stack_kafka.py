"""The test broker is a real Kafka: records produced to chosen partitions come back with their offsets."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from icefall.devstack.kafka import KafkaBroker

pytestmark = pytest.mark.integration


def test_produce_and_consume_by_partition_and_offset(kafka: KafkaBroker) -> None:
    kafka.create_topic("smoke-kafka", partitions=3)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in range(30):
        producer.produce("smoke-kafka", key=f"k{i}", value=f"v{i}", partition=i % 3)
    assert producer.flush(30) == 0

    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "smoke", "enable.auto.commit": False}
    )
    for partition in range(3):
        low, high = consumer.get_watermark_offsets(TopicPartition("smoke-kafka", partition), timeout=10)
        assert (low, high) == (0, 10)
    # Read partition 1 from offset 4 only: explicit positions, no group offsets involved.
    consumer.assign([TopicPartition("smoke-kafka", 1, 4)])
    seen = []
    while len(seen) < 6:
        message = consumer.poll(10)
        assert message is not None, f"timed out after {len(seen)} records"
        assert message.error() is None
        seen.append((message.partition(), message.offset(), message.value().decode()))
    consumer.close()
    assert seen == [(1, offset, f"v{offset * 3 + 1}") for offset in range(4, 10)]


def test_partitions_can_be_added(kafka: KafkaBroker) -> None:
    kafka.create_topic("smoke-grow", partitions=1)
    kafka.add_partitions("smoke-grow", 4)
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "grow"})
    metadata = consumer.list_topics("smoke-grow", timeout=10)
    consumer.close()
    assert sorted(metadata.topics["smoke-grow"].partitions) == [0, 1, 2, 3]
