"""`spec.source.security` applied to the Kafka clients: librdkafka (confluent-kafka) and Spark's Kafka source.

Credentials are references (`SecretRef`). An `env` reference reads that variable of this process; a
`secretKeyRef` reads the variable the operator injects into its pods from that Secret key, named by
`icefall.plan.env.kafka_secret_env_name` (`ICEFALL_KAFKA_<FIELD>`), so both sides agree on the name.

Guarantees:
- A missing or empty variable raises `MissingSecretError` naming the spec field and the variable to set;
  no message built here ever contains a secret value.
- PLAINTEXT gives no settings at all. Without `caCert`, TLS trusts the system (librdkafka) or JVM (Spark)
  default trust store.
- The returned mappings hold secret values: pass them to the clients, never log or persist them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from icefall.api import SecretRef
from icefall.api.source import KafkaSecurity, SaslMechanism, SecurityProtocol
from icefall.plan.env import kafka_secret_env_name

_LOGIN_MODULES = {
    SaslMechanism.PLAIN: "org.apache.kafka.common.security.plain.PlainLoginModule",
    SaslMechanism.SCRAM_SHA_256: "org.apache.kafka.common.security.scram.ScramLoginModule",
    SaslMechanism.SCRAM_SHA_512: "org.apache.kafka.common.security.scram.ScramLoginModule",
}


class MissingSecretError(RuntimeError):
    """A credential referenced by `spec.source.security` is not available to this process."""


def spec_path(field: str) -> str:
    """`spec.source.security.<camelCase>` for a snake_case attribute of `KafkaSecurity`."""
    head, *rest = field.split("_")
    return "spec.source.security." + head + "".join(part.title() for part in rest)


def resolve_secret(ref: SecretRef, field: str, *, environ: Mapping[str, str] = os.environ) -> str:
    """The value of `spec.source.security.<field>` (`field` is the snake_case attribute, e.g. `ca_cert`)."""
    path = spec_path(field)
    if ref.env is not None:
        name = ref.env
        hint = f"set it or change {path}.env"
    else:
        assert ref.secret_key_ref is not None  # SecretRef guarantees exactly one
        name = kafka_secret_env_name(field)
        selector = ref.secret_key_ref
        hint = (
            f"the operator fills it from key {selector.key!r} of Secret {selector.name!r}; "
            "outside the cluster set it yourself, or reference the value with {env: NAME}"
        )
    value = environ.get(name)
    if value is None:
        raise MissingSecretError(f"{path}: environment variable {name} is not set ({hint})")
    if not value:
        raise MissingSecretError(f"{path}: environment variable {name} is empty ({hint})")
    return value


def _resolved(security: KafkaSecurity, environ: Mapping[str, str]) -> dict[str, str]:
    values = {}
    for field in ("username", "password", "ca_cert", "client_cert", "client_key"):
        ref: SecretRef | None = getattr(security, field)
        if ref is not None:
            values[field] = resolve_secret(ref, field, environ=environ)
    return values


def _sasl_mechanism(security: KafkaSecurity) -> SaslMechanism:
    assert security.sasl_mechanism is not None  # KafkaSecurity requires it with SASL
    return security.sasl_mechanism


def librdkafka_config(security: KafkaSecurity, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """confluent-kafka (librdkafka) properties for `security`; `{}` for PLAINTEXT."""
    if security.protocol is SecurityProtocol.PLAINTEXT:
        return {}
    values = _resolved(security, environ)
    config = {"security.protocol": security.protocol.value}
    if security.protocol.uses_sasl:
        config["sasl.mechanism"] = _sasl_mechanism(security).value
        config["sasl.username"] = values["username"]
        config["sasl.password"] = values["password"]
    for field, key in (
        ("ca_cert", "ssl.ca.pem"),
        ("client_cert", "ssl.certificate.pem"),
        ("client_key", "ssl.key.pem"),
    ):
        if field in values:
            config[key] = values[field]
    return config


def jaas_config(mechanism: SaslMechanism, username: str, password: str) -> str:
    """A `sasl.jaas.config` line; values are quoted with JSON escaping, which Kafka's JAAS parser reads."""
    user = json.dumps(username, ensure_ascii=False)
    secret = json.dumps(password, ensure_ascii=False)
    return f"{_LOGIN_MODULES[mechanism]} required username={user} password={secret};"


def spark_kafka_options(security: KafkaSecurity, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """Options for Spark's Kafka source (`kafka.`-prefixed consumer properties); `{}` for PLAINTEXT."""
    if security.protocol is SecurityProtocol.PLAINTEXT:
        return {}
    values = _resolved(security, environ)
    options = {"kafka.security.protocol": security.protocol.value}
    if security.protocol.uses_sasl:
        mechanism = _sasl_mechanism(security)
        options["kafka.sasl.mechanism"] = mechanism.value
        options["kafka.sasl.jaas.config"] = jaas_config(mechanism, values["username"], values["password"])
    if "ca_cert" in values:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.certificates"] = values["ca_cert"]
    if "client_cert" in values or "client_key" in values:
        options["kafka.ssl.keystore.type"] = "PEM"
        if "client_cert" in values:
            options["kafka.ssl.keystore.certificate.chain"] = values["client_cert"]
        if "client_key" in values:
            options["kafka.ssl.keystore.key"] = values["client_key"]
    return options
