"""Pure decisions: given observations (and a clock value), compute what to do next.

Nothing in this package performs I/O or imports a client for Kafka, Spark, Kubernetes or an Iceberg
catalog; it depends only on `icefall.api`. Every function is deterministic in its arguments, so the
risky branches (offset planning, batch sizing) are tested without any component running.
"""
