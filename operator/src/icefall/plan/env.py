"""The environment contract between the operator's pods and their entry points. Pure: no client, no I/O.

Both sides import the names from here, so they cannot drift apart:
- credentials: `secret_env_vars` names one env var per secret reference of the spec
  (`ICEFALL_KAFKA_<FIELD>`, `ICEFALL_REGISTRY_<FIELD>`, `ICEFALL_CATALOG_<KEY>`), rendered as
  `secretKeyRef`s; `icefall.kafka` and `icefall.catalog` read them back by the same names;
- the pod's own identity from the downward API (`ENV_POD_NAME`, `ENV_POD_NAMESPACE`, `ENV_POD_IP`);
- `ENV_SPARK_CONF`: the Spark configuration the operator rendered (`spark_conf_env`), read back by the
  entry point (`spark_conf_from`);
- `NODE_IDENTITY_OFF`: no AWS SDK in the pod (Iceberg's S3FileIO in the JVM, pyarrow's S3 client under
  pyiceberg and the Delta log) asks the instance metadata service for the node's role; a table reaches
  S3 with the keys it references or its pods' own identity (IRSA, EKS Pod Identity), never the node's.

Guarantees: no secret value is ever in a manifest: only the Secret's name and key. Not guaranteed: that the
referenced Secrets exist (a missing one keeps the pod in CreateContainerConfigError). `env` references
(`SecretRef.env`) cannot be honoured in a cluster: they come back as problems and are left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from icefall.api import Problem, SecretRef, StreamingTableSpec
from icefall.plan.names import digest

Manifest = dict[str, Any]

#: JSON object of Spark configuration (str → str) the entry point passes to its SparkSession; it holds
#: `$(ICEFALL_POD_NAME)` / `$(ICEFALL_POD_IP)` references that the kubelet expands.
ENV_SPARK_CONF = "ICEFALL_SPARK_CONF"
ENV_POD_NAME = "ICEFALL_POD_NAME"
ENV_POD_NAMESPACE = "ICEFALL_POD_NAMESPACE"
ENV_POD_IP = "ICEFALL_POD_IP"
#: In every table pod unless the operator setting `allow_node_identity` is on; spec.pods may not set it
#: (`icefall.api.pods.RESERVED_ENV_NAMES`).
NODE_IDENTITY_OFF: dict[str, str] = {"name": "AWS_EC2_METADATA_DISABLED", "value": "true"}


@dataclass(frozen=True)
class SecretEnv:
    """One credential handed to a pod: env var `name` from key `key` of Secret `secret`."""

    path: str  # the spec field, e.g. spec.source.security.password
    name: str
    secret: str
    key: str

    def manifest(self) -> Manifest:
        return {"name": self.name, "valueFrom": {"secretKeyRef": {"name": self.secret, "key": self.key}}}


_KAFKA_SECRET_FIELDS = ("username", "password", "ca_cert", "client_cert", "client_key")
_REGISTRY_SECRET_FIELDS = ("username", "password")


def kafka_secret_env_name(attr: str) -> str:
    """The env var carrying `spec.source.security.<attr>` (snake_case attribute) in the operator's pods."""
    return f"ICEFALL_KAFKA_{attr.upper()}"


def registry_secret_env_name(attr: str) -> str:
    """The env var carrying `spec.format.registry.<attr>` (username, password) in the operator's pods."""
    return f"ICEFALL_REGISTRY_{attr.upper()}"


def secret_env_vars(spec: StreamingTableSpec) -> tuple[list[SecretEnv], list[SecretEnv], list[Problem]]:
    """Env vars carrying the spec's secret references: (Kafka and schema registry ones, catalog ones,
    problems).

    The entry points call this with the spec they read, so both sides agree on the names:
    `ICEFALL_KAFKA_<FIELD>` for `spec.source.security.<field>`, `ICEFALL_REGISTRY_<FIELD>` for
    `spec.format.registry.<field>` (the ingestion driver's, with the Kafka ones) and
    `ICEFALL_CATALOG_<KEY>` for `spec.table.catalog.secretProperties[<key>]` (non-alphanumerics become
    `_`; keys that collide after that all get a hash suffix). `env` references are problems: only
    `icefall run` can honour them.
    """
    problems: list[Problem] = []
    kafka = _honoured([*_kafka_refs(spec), *_registry_refs(spec)], problems)
    catalog = _honoured(_catalog_refs(spec), problems)
    return kafka, catalog, problems


_Ref = tuple[SecretRef, str, str]  # the reference, its spec path, its env var


def credential_references(spec: StreamingTableSpec) -> list[tuple[str, SecretRef]]:
    """Every credential reference of the spec (Kafka, schema registry, catalog), with its spec path: what
    only the table's own pods (or `icefall run`) may resolve, never the operator."""
    refs = [*_kafka_refs(spec), *_registry_refs(spec), *_catalog_refs(spec)]
    return [(path, ref) for ref, path, _ in refs]


def _kafka_refs(spec: StreamingTableSpec) -> list[_Ref]:
    return _secret_refs(
        spec.source.security,
        _KAFKA_SECRET_FIELDS,
        lambda attr: f"spec.source.security.{_camel(attr)}",
        kafka_secret_env_name,
    )


def _registry_refs(spec: StreamingTableSpec) -> list[_Ref]:
    registry = spec.format.registry
    if registry is None:
        return []
    return _secret_refs(
        registry,
        _REGISTRY_SECRET_FIELDS,
        lambda attr: f"spec.format.registry.{attr}",
        registry_secret_env_name,
    )


def _secret_refs(
    holder: object, fields: Iterable[str], path: Callable[[str], str], env_name: Callable[[str], str]
) -> list[_Ref]:
    """The SecretRefs `holder` sets among `fields`, each with its spec path and its env var."""
    refs: list[_Ref] = []
    for attr in fields:
        ref: SecretRef | None = getattr(holder, attr)
        if ref is not None:
            refs.append((ref, path(attr), env_name(attr)))
    return refs


def _catalog_refs(spec: StreamingTableSpec) -> list[_Ref]:
    if spec.table.catalog is None:
        return []
    properties = spec.table.catalog.secret_properties
    plain = {key: re.sub(r"[^A-Za-z0-9]", "_", key).upper() for key in properties}
    seen: dict[str, int] = {}
    for slug in plain.values():
        seen[slug] = seen.get(slug, 0) + 1
    refs: list[_Ref] = []
    for key in sorted(properties):
        slug = plain[key] if seen[plain[key]] == 1 else f"{plain[key]}_{digest(key)[:6].upper()}"
        path = f"spec.table.catalog.secretProperties[{key}]"
        refs.append((properties[key], path, f"ICEFALL_CATALOG_{slug}"))
    return refs


def _honoured(refs: list[_Ref], problems: list[Problem]) -> list[SecretEnv]:
    """The env vars of the `secretKeyRef` references; an `env` reference becomes a problem instead."""
    found: list[SecretEnv] = []
    for ref, path, name in refs:
        if ref.secret_key_ref is None:
            problems.append(
                Problem(
                    path,
                    f"env reference {ref.env!r} works only with `icefall run`; in a cluster reference a "
                    "Secret: {secretKeyRef: {name: <secret>, key: <key>}}",
                )
            )
        else:
            found.append(SecretEnv(path, name, ref.secret_key_ref.name, ref.secret_key_ref.key))
    return found


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(part.title() for part in rest)


def spark_conf_env(conf: Mapping[str, str]) -> Manifest:
    """The `ICEFALL_SPARK_CONF` env var carrying `conf` (compact JSON, sorted keys)."""
    return {"name": ENV_SPARK_CONF, "value": json.dumps(conf, sort_keys=True, separators=(",", ":"))}


def spark_conf_from(environ: Mapping[str, str]) -> dict[str, str]:
    """The Spark configuration the operator rendered into this pod's environment (empty outside a pod)."""
    conf: dict[str, str] = json.loads(environ.get(ENV_SPARK_CONF) or "{}")
    return conf
