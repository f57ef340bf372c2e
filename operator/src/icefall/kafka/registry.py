"""The schema registry of `spec.format.registry`, through confluent-kafka's `SchemaRegistryClient`.

Guarantees:
- `WriterSchemas.lookup` gives the writer schema (its text) of each schema id, or None for an id the
  registry does not know (HTTP 404) or whose schema is not of the spec's format (Avro, JSON Schema,
  Protobuf: as a base64 `FileDescriptorSet` with its well-known imports, `icefall.kafka.protobuf`).
  Answers are kept per process: a schema id never changes meaning. An unknown id is asked again in the
  next batch.
- A registry that cannot be reached, times out (`REQUEST_TIMEOUT_SECONDS`) or answers 408, 429 or 5xx
  raises `RegistryUnavailableError`: an outage, waited out by ingestion (`icefall.ingest.outages`), so no
  record goes to the dead-letter table because the registry was briefly down, and a batch is never
  decoded with a partial view of its schemas. Any other refusal (401, 403, ...) raises `RegistryError`:
  a configuration error, raised loudly.
- `registered` gives the writer schemas of the latest versions of subjects, each text from `lookup` of
  its id, so a schema is only ever used for the id the registry gives it; a subject the registry does not
  hold gives none. Only the latest: every id a writer knows is one more parse in each batch's plan and
  its fields are added to the table, so older versions are learnt only when a batch holds them.
- `latest_schema` is the subject's latest schema (the subject per `subjectNameStrategy`); a subject the
  registry does not hold, or whose latest schema is not of the spec's format, raises `RegistryError`
  naming it.

Proved against a real registry (Apicurio's Confluent-compatible API): tests/integration/test_registry.py.
Not supported: schemas with references to other subjects (the writer schema must be self-contained).

Credentials are references (`SecretRef`): an `env` reference reads that variable of this process; a
`secretKeyRef` reads `ICEFALL_REGISTRY_<USERNAME|PASSWORD>`, which the operator fills in the ingestion
driver's pod from the referenced Secret (`icefall.plan.env.secret_env_vars`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from icefall.api import (
    FormatType,
    SchemaRegistry,
    SecretRef,
    StreamingTable,
    StreamingTableSpec,
    SubjectNameStrategy,
    TableMode,
)
from icefall.api.avro import row_schema
from icefall.api.format import SCHEMA_TYPE_NAMES
from icefall.api.registry_schema import fields_from_registry_schema
from icefall.plan.env import registry_secret_env_name
from icefall.runtime.bounded import LRU

log = logging.getLogger(__name__)


class MissingRegistrySecretError(RuntimeError):
    """A credential referenced by `spec.format.registry` is not available to this process."""


#: Seconds one request to the registry may take (the client retries a failed one a few times first).
REQUEST_TIMEOUT_SECONDS = 30.0
#: Writer schemas a driver remembers (least recently used forgotten first, asked for again if seen again).
MAX_KNOWN_SCHEMAS = 4096
#: HTTP statuses of a registry that is there but cannot answer now (the client retries these too).
_UNAVAILABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class RegistryError(RuntimeError):
    """The registry refused a request (other than an unknown id), or does not hold what was asked."""


class RegistryUnavailableError(RegistryError):
    """The registry could not be reached, timed out, or answered 408, 429 or 5xx: an outage."""


def registry_failure(registry: SchemaRegistry, what: str, error: Exception) -> RegistryError:
    """The `RegistryError` (or `RegistryUnavailableError`) for `error`, raised by the client while asking
    for `what`."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    message = f"schema registry {registry.url}: {what}: {error}"
    if isinstance(error, SchemaRegistryError):
        if error.http_status_code in _UNAVAILABLE_STATUSES:
            return RegistryUnavailableError(message)
        return RegistryError(message)
    # The HTTP client's transport errors (connection refused or reset, timeouts, DNS) derive from its
    # TransportError; socket errors are OSErrors. Anything else is a bug, not an outage.
    transport = any(cls.__name__ == "TransportError" for cls in type(error).__mro__)
    if transport or isinstance(error, OSError):
        return RegistryUnavailableError(message)
    return RegistryError(message)


def _resolve(ref: SecretRef, field: str, environ: Mapping[str, str]) -> str:
    name = ref.env if ref.env is not None else registry_secret_env_name(field)
    value = environ.get(name)
    if not value:
        raise MissingRegistrySecretError(
            f"spec.format.registry.{field}: environment variable {name} is not set or empty"
        )
    return value


def client_config(registry: SchemaRegistry, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The `SchemaRegistryClient` configuration of `registry` (basic auth resolved from its references)."""
    config = {"url": registry.url}
    if registry.username is not None and registry.password is not None:
        user = _resolve(registry.username, "username", environ)
        password = _resolve(registry.password, "password", environ)
        config["basic.auth.user.info"] = f"{user}:{password}"
    return config


class Registry(Protocol):
    """What ingestion asks a registry: writer schemas by id, and a topic's latest schema."""

    def lookup(self, ids: Iterable[int]) -> dict[int, str | None]: ...

    def latest_schema(self, topic: str) -> str: ...

    def registered(self, subjects: Iterable[str]) -> dict[int, str]: ...


class WriterSchemas:
    """Writer schemas by id from one registry, cached per process: those of `format_type` (default Avro)."""

    def __init__(
        self,
        registry: SchemaRegistry,
        environ: Mapping[str, str] = os.environ,
        *,
        format_type: FormatType = FormatType.AVRO,
    ) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.registry = registry
        self.schema_type = format_type.schema_type
        self.kind = SCHEMA_TYPE_NAMES[self.schema_type]
        config = {**client_config(registry, environ), "timeout": REQUEST_TIMEOUT_SECONDS}
        self._client = SchemaRegistryClient(config)
        # None: the id's schema is not of `schema_type`. Bounded: a topic's records may name any number of
        # ids; a forgotten one is asked for again.
        self._known: LRU[int, str | None] = LRU(MAX_KNOWN_SCHEMAS)
        # Protobuf: a registry that can (Confluent's) serves the schema as a serialized descriptor.
        self._format = "serialized" if format_type is FormatType.PROTOBUF else None

    def _usable(self, schema_id: int, text: str) -> str | None:
        """The writer schema as the decoders read it: Protobuf's as a descriptor set (None when it cannot
        be made: its records are dead letters, an unknown id, and the log says why)."""
        if self.schema_type != "PROTOBUF":
            return text
        from icefall.api.protobuf_schema import ProtobufSchemaError
        from icefall.kafka.protobuf import descriptor_set_text

        try:
            return descriptor_set_text(text)
        except ProtobufSchemaError as error:
            log.warning("schema registry %s: schema id %d: %s", self.registry.url, schema_id, error)
            return None

    def lookup(self, ids: Iterable[int]) -> dict[int, str | None]:
        """The writer schema of each id; None for an id the registry does not know, or of another type."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        found: dict[int, str | None] = {}
        for schema_id in ids:
            if schema_id in self._known:
                found[schema_id] = self._known.get(schema_id)
                continue
            try:
                schema = self._client.get_schema(schema_id, fmt=self._format)
            except SchemaRegistryError as error:
                if error.http_status_code == 404:
                    found[schema_id] = None
                    continue
                raise registry_failure(self.registry, f"schema id {schema_id}", error) from error
            except Exception as error:
                raise registry_failure(self.registry, f"schema id {schema_id}", error) from error
            ours = (schema.schema_type or "AVRO") == self.schema_type and schema.schema_str is not None
            usable = self._usable(schema_id, str(schema.schema_str)) if ours else None
            self._known.put(schema_id, usable)
            found[schema_id] = usable
        return found

    def registered(self, subjects: Iterable[str]) -> dict[int, str]:
        """The writer schemas (of this format) of the latest version of each of `subjects`: what a writer
        decodes its first batch with, so that no Spark job reads the batch for its ids. A subject the
        registry does not hold adds none."""
        ids = {i for i in map(self._latest_id, subjects) if i is not None}
        # The text of each id comes from the id itself, as for any record's: never a version's text.
        return {i: text for i, text in self.lookup(sorted(ids)).items() if text is not None}

    def _latest_id(self, subject: str) -> int | None:
        """The schema id of the latest version of `subject` (None: the registry does not hold it)."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        what = f"the latest version of subject {subject!r}"
        try:
            found = self._client.get_latest_version(subject, fmt=self._format)
        except SchemaRegistryError as error:
            if error.http_status_code == 404:
                return None
            raise registry_failure(self.registry, what, error) from error
        except Exception as error:
            raise registry_failure(self.registry, what, error) from error
        return int(found.schema_id) if found.schema_id is not None else None

    def latest_schema(self, topic: str) -> str:
        """The text of the latest version of `topic`'s record subject (`SchemaRegistry.subject`)."""
        subject = self.registry.subject(topic)
        try:
            registered = self._client.get_latest_version(subject, fmt=self._format)
        except Exception as error:
            raise registry_failure(
                self.registry, f"the latest schema of subject {subject!r}", error
            ) from error
        schema = registered.schema
        kind = schema.schema_type or "AVRO"
        if kind != self.schema_type or schema.schema_str is None:
            raise RegistryError(
                f"schema registry {self.registry.url}: the latest schema of subject {subject!r} is "
                f"{kind}, not {self.kind}"
            )
        if self.schema_type != "PROTOBUF":
            return str(schema.schema_str)
        from icefall.api.protobuf_schema import ProtobufSchemaError
        from icefall.kafka.protobuf import descriptor_set_text

        try:
            return descriptor_set_text(schema.schema_str)
        except ProtobufSchemaError as error:
            raise RegistryError(
                f"schema registry {self.registry.url}: the latest schema of subject {subject!r}: {error}"
            ) from error


def writer_subjects(spec: StreamingTableSpec) -> tuple[list[str], list[str]]:
    """The subjects whose latest schemas a writer learns at start (`WriterSchemas.registered`): each
    named topic's value subject, and for a keyed Avro table its `<topic>-key` subject (topic strategy:
    Kafka Connect's and Debezium's AvroConverter register keys there). `topicPattern`'s topics are not
    known at start: their ids are met as batches are written."""
    registry = spec.format.registry
    if registry is None:
        return [], []
    topics = spec.source.topic_names
    values = list(dict.fromkeys(registry.subject(t) for t in topics))
    keyed_avro = spec.mode is not TableMode.APPEND and spec.format.type is FormatType.AVRO
    by_topic = registry.subject_name_strategy is SubjectNameStrategy.TOPIC
    keys = [f"{t}-key" for t in topics] if keyed_avro and by_topic else []
    return values, keys


def registered_writers(registry: Registry, spec: StreamingTableSpec) -> tuple[dict[int, str], dict[int, str]]:
    """The writer schemas of the latest versions of `spec`'s subjects (`writer_subjects`): values', keys'."""
    values, keys = writer_subjects(spec)
    return registry.registered(values), registry.registered(keys) if keys else {}


def with_registry_schema(
    st: StreamingTable, latest_schema: Callable[[str], str] | None = None
) -> StreamingTable:
    """`st` with `spec.format.schema` filled from the subject's latest registry schema, for a registry
    format without an inline schema (otherwise `st` itself). `latest_schema(topic)` gives that schema's
    text (default: `WriterSchemas(...).latest_schema`). The result is validated again, so the layout and
    key checks the spec could not make without columns are made here, with the same messages."""
    fields = _registry_fields(st.spec, latest_schema)
    if fields is None:
        return st
    document = st.model_dump(by_alias=True, exclude_none=True, mode="json")
    document["spec"]["format"]["schema"] = fields
    return StreamingTable.model_validate(document)


def spec_with_registry_schema(
    spec: StreamingTableSpec, latest_schema: Callable[[str], str] | None = None
) -> StreamingTableSpec:
    """`with_registry_schema` of a spec alone: the fields ingestion derives at start, for whoever decodes
    the topic's records outside ingestion (`icefall verify`'s auditor)."""
    fields = _registry_fields(spec, latest_schema)
    if fields is None:
        return spec
    document = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    document["format"]["schema"] = fields
    return StreamingTableSpec.model_validate(document)


def _registry_fields(
    spec: StreamingTableSpec, latest_schema: Callable[[str], str] | None
) -> list[dict[str, object]] | None:
    """The `format.schema` entries of the subject's latest schema (for cdc, of its Debezium envelope's row
    record: `row_schema`); None when the spec has its fields."""
    fmt = spec.format
    if fmt.type is FormatType.JSON or fmt.schema_known:
        return None
    assert fmt.registry is not None  # the spec requires it for registry formats
    if latest_schema is None:
        latest_schema = WriterSchemas(fmt.registry, format_type=fmt.type).latest_schema
    text = latest_schema(spec.source.first_topic)  # of several topics: the first one's subject
    # cdc: the table's columns are the row record of Debezium's (Avro) envelope, not the envelope.
    fields = fields_from_registry_schema(fmt, row_schema(text) if spec.mode is TableMode.CDC else text)
    return [f.model_dump(by_alias=True, exclude_none=True, mode="json") for f in fields]
