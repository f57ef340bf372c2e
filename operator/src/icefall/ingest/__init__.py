"""Ingestion: decode Kafka records with Spark (`decode`, `avro`; `columns` names what both return) and
commit them exactly once (`engine.Ingestor`; `DESIGN.md` tells a batch's life).

Nothing is imported here: the submodules import pyspark, which not every caller of `icefall.ingest` wants.
"""
