"""Icefall: Kafka topics in, compacted Apache Iceberg tables out, exactly once."""

__version__ = "0.1.0"
