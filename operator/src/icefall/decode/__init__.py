"""Decoding: how a Kafka record becomes a table row, or a dead letter with its reason (`DESIGN.md` here).

- `decode`: `Decoder`, a batch of records (Spark's Kafka columns) into good rows and bad rows; the JSON and
  JSON Schema paths, `transforms`, and what each output holds.
- `avro`: Confluent-framed Avro (`AvroDecoding`, the writer schemas a batch is decoded with); `protobuf`:
  Confluent-framed Protobuf into the JSON path; `framing`: the Confluent wire format's header, its schema
  ids and the reasons a frame is refused.
- `keyed`: the expressions of keyed tables (`spec.mode` upsert, cdc): deletes, row images, the Kafka key,
  `spec.sequenceBy`; `reasons`: why a value does not fit its field, as dead-letter reasons; `columns`: the
  names of a decoded batch's columns (no Spark).
- `schemas`: which columns records decode into, and what the table must change to follow its writer
  schemas (`SchemaFollower`); `known_writers`: the writer schemas one writer has met (pure).
- `route_decoding`: `OwnDecoders`, the routes that decode their records with their own schema or key.

Everything here works on a record's bytes and the spec (plus the registry's writer schemas): no batch
plan, offsets, commit or table state; `icefall.ingest` uses it, it never imports `icefall.ingest`.
Nothing is imported here: most submodules import pyspark, which not every caller wants.
"""
