"""Ingestion: commit decoded Kafka records exactly once (`engine.Ingestor`; `DESIGN.md` tells a batch's
life); wait out an unreachable service (`outages`); read the table plus the topic after it, decoded the
same way (`union_read`). How a record becomes a row is `icefall.decode`'s (its `DESIGN.md`).

Nothing is imported here: the submodules import pyspark, which not every caller of `icefall.ingest` wants.
"""
