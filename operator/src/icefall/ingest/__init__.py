"""Ingestion: Kafka records into the table exactly once (`engine.Ingestor`; `DESIGN.md` tells a batch's life).

Nothing is imported here: the submodules import pyspark, which not every caller of `icefall.ingest` wants.
"""
