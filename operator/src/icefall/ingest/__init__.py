"""Ingestion: decode Kafka records with Spark (`decode`, with `keyed` for keyed tables and `reasons` for the
dead-letter reasons; `avro`; `framing` and `protobuf` for JSON Schema and Protobuf; `columns` names what
they return) and commit them exactly once (`engine.Ingestor`; `DESIGN.md` tells a batch's life); wait out
an unreachable service (`outages`); read the table plus the topic after it, decoded the same way
(`union_read`).

Nothing is imported here: the submodules import pyspark, which not every caller of `icefall.ingest` wants.
"""
