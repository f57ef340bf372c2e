"""Kafka adapters: topic metadata, watermarks and offset look-ups (confluent-kafka), DLQ producer."""
