"""The schema registry of `spec.format.registry`, through confluent-kafka's `SchemaRegistryClient`.

Guarantees:
- `WriterSchemas.lookup` gives the writer schema (Avro JSON text) of each schema id, or None for an id the
  registry does not know (HTTP 404) or whose schema is not Avro. Known schemas are fetched once per
  process: a schema id never changes meaning. An unknown id is asked again in the next batch.
- Any other registry failure (unreachable, 5xx, 401) raises: a batch is never decoded with a partial view
  of its schemas, so no record goes to the dead-letter table because the registry was briefly down.
- `latest_schema` is the subject's latest Avro schema (the subject per `subjectNameStrategy`).

Credentials are references (`SecretRef`): an `env` reference reads that variable of this process; a
`secretKeyRef` reads `ICEFALL_REGISTRY_<USERNAME|PASSWORD>`, which the operator fills in the ingestion
driver's pod from the referenced Secret (`icefall.plan.env.secret_env_vars`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from icefall.api import FormatType, SchemaRegistry, SecretRef, StreamingTable
from icefall.api.avro import fields_from_avro
from icefall.plan.env import registry_secret_env_name


class MissingRegistrySecretError(RuntimeError):
    """A credential referenced by `spec.format.registry` is not available to this process."""


class RegistryError(RuntimeError):
    """The registry could not answer (unreachable, refused, an error other than an unknown id)."""


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


class WriterSchemas:
    """Writer schemas by id from one registry, cached per process."""

    def __init__(self, registry: SchemaRegistry, environ: Mapping[str, str] = os.environ) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self.registry = registry
        self._client = SchemaRegistryClient(client_config(registry, environ))
        self._known: dict[int, str] = {}

    def lookup(self, ids: Iterable[int]) -> dict[int, str | None]:
        """The Avro writer schema of each id; None for an id the registry does not know."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        found: dict[int, str | None] = {}
        for schema_id in ids:
            if schema_id not in self._known:
                try:
                    schema = self._client.get_schema(schema_id)
                except SchemaRegistryError as error:
                    if error.http_status_code == 404:
                        found[schema_id] = None
                        continue
                    raise RegistryError(f"schema registry {self.registry.url}: {error}") from error
                except Exception as error:
                    raise RegistryError(f"schema registry {self.registry.url}: {error}") from error
                if (schema.schema_type or "AVRO") != "AVRO" or schema.schema_str is None:
                    found[schema_id] = None
                    continue
                self._known[schema_id] = schema.schema_str
            found[schema_id] = self._known[schema_id]
        return found

    def latest_schema(self, topic: str) -> str:
        """The Avro text of the latest version of `topic`'s value subject."""
        subject = self.registry.subject(topic)
        try:
            registered = self._client.get_latest_version(subject)
        except Exception as error:
            raise RegistryError(
                f"schema registry {self.registry.url}: no latest schema for subject {subject!r}: {error}"
            ) from error
        return str(registered.schema.schema_str)


def with_registry_schema(
    st: StreamingTable, latest_schema: Callable[[str], str] | None = None
) -> StreamingTable:
    """`st` with `spec.format.schema` filled from the subject's latest registry schema, for a registry
    format without an inline schema (otherwise `st` itself). `latest_schema(topic)` gives that schema's
    text (default: `WriterSchemas(...).latest_schema`). The result is validated again, so the layout and
    key checks the spec could not make without columns are made here, with the same messages."""
    fmt = st.spec.format
    if fmt.type is FormatType.JSON or fmt.schema_known:
        return st
    assert fmt.registry is not None  # the spec requires it for registry formats
    latest = latest_schema if latest_schema is not None else WriterSchemas(fmt.registry).latest_schema
    fields = fields_from_avro(latest(st.spec.source.topic))
    document = st.model_dump(by_alias=True, exclude_none=True, mode="json")
    document["spec"]["format"]["schema"] = [
        f.model_dump(by_alias=True, exclude_none=True, mode="json") for f in fields
    ]
    return StreamingTable.model_validate(document)
