"""Spark adapters: the session factory shared by ingestion, compaction, tests and benchmarks."""
