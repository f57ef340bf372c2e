"""`spec.source.security` becomes librdkafka and Spark Kafka settings; secret references resolve from the
environment (env refs directly, secretKeyRef through the variable the operator injects), and a missing one
fails naming the spec field and the variable, never showing a secret value. A client error that says the
brokers refused this client's settings (credentials, an untrusted broker certificate, a refused client
certificate, TLS against a plaintext listener) is a refusal naming the fields to fix; a TLS connection that
merely drops stays an outage."""

from __future__ import annotations

import re
from typing import Any

import pytest
from confluent_kafka import KafkaError

from icefall.api import SecretRef
from icefall.api.source import KafkaSecurity
from icefall.kafka.admin import refusal
from icefall.kafka.security import (
    MissingSecretError,
    librdkafka_config,
    resolve_secret,
    spark_kafka_options,
)
from icefall.plan.env import secret_env_vars
from icefall.spark.session import REDACTION_REGEX
from icefall.testing.streams import streaming_table

pytestmark = pytest.mark.unit

PASSWORD = 'p"a\\ss'  # a quote and a backslash: must be escaped in the JAAS line


def security(**fields: Any) -> KafkaSecurity:
    return KafkaSecurity.model_validate(fields)


def sasl(mechanism: str, protocol: str = "SASL_PLAINTEXT", **extra: Any) -> KafkaSecurity:
    return security(
        protocol=protocol,
        saslMechanism=mechanism,
        username={"env": "KAFKA_USER"},
        password={"env": "KAFKA_PASSWORD"},
        **extra,
    )


ENV = {
    "KAFKA_USER": "icefall",
    "KAFKA_PASSWORD": PASSWORD,
    "CA": "ca-pem",
    "CERT": "cert-pem",
    "KEY": "key-pem",
}


def test_plaintext_sets_nothing() -> None:
    assert librdkafka_config(security(), {}) == {}
    assert spark_kafka_options(security(), {}) == {}


@pytest.mark.parametrize(
    ("mechanism", "module"),
    [
        ("PLAIN", "org.apache.kafka.common.security.plain.PlainLoginModule"),
        ("SCRAM-SHA-256", "org.apache.kafka.common.security.scram.ScramLoginModule"),
        ("SCRAM-SHA-512", "org.apache.kafka.common.security.scram.ScramLoginModule"),
    ],
)
def test_sasl_plaintext(mechanism: str, module: str) -> None:
    sec = sasl(mechanism)
    assert librdkafka_config(sec, ENV) == {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": "icefall",
        "sasl.password": PASSWORD,
    }
    assert spark_kafka_options(sec, ENV) == {
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": mechanism,
        "kafka.sasl.jaas.config": f'{module} required username="icefall" password="p\\"a\\\\ss";',
    }


def test_ssl_with_ca_and_client_certificate() -> None:
    sec = security(protocol="SSL", caCert={"env": "CA"}, clientCert={"env": "CERT"}, clientKey={"env": "KEY"})
    assert librdkafka_config(sec, ENV) == {
        "security.protocol": "SSL",
        "ssl.ca.pem": "ca-pem",
        "ssl.certificate.pem": "cert-pem",
        "ssl.key.pem": "key-pem",
    }
    assert spark_kafka_options(sec, ENV) == {
        "kafka.security.protocol": "SSL",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.certificates": "ca-pem",
        "kafka.ssl.keystore.type": "PEM",
        "kafka.ssl.keystore.certificate.chain": "cert-pem",
        "kafka.ssl.keystore.key": "key-pem",
    }


def test_ssl_without_ca_uses_default_trust_store() -> None:
    assert librdkafka_config(security(protocol="SSL"), {}) == {"security.protocol": "SSL"}
    assert spark_kafka_options(security(protocol="SSL"), {}) == {"kafka.security.protocol": "SSL"}


def test_sasl_ssl_combines_both() -> None:
    sec = sasl("SCRAM-SHA-512", protocol="SASL_SSL", caCert={"env": "CA"})
    config = librdkafka_config(sec, ENV)
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.mechanism"] == "SCRAM-SHA-512"
    assert config["ssl.ca.pem"] == "ca-pem"
    assert "ssl.key.pem" not in config
    options = spark_kafka_options(sec, ENV)
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.ssl.truststore.certificates"] == "ca-pem"
    assert "ScramLoginModule" in options["kafka.sasl.jaas.config"]
    assert "kafka.ssl.keystore.type" not in options


def test_env_reference_reads_the_named_variable() -> None:
    ref = SecretRef.model_validate({"env": "MY_PW"})
    assert resolve_secret(ref, "password", environ={"MY_PW": "x"}) == "x"


def test_secret_key_ref_reads_the_variable_the_operator_injects() -> None:
    """Same name as `secret_env_vars` puts in the pod, for every Kafka secret field."""
    manifest = """
apiVersion: icefall.dev/v1alpha1
kind: StreamingTable
metadata: {name: t}
spec:
  source:
    bootstrapServers: "k:9092"
    topic: t
    security:
      protocol: SASL_SSL
      saslMechanism: PLAIN
      username: {secretKeyRef: {name: kafka, key: user}}
      password: {secretKeyRef: {name: kafka, key: pw}}
      caCert: {secretKeyRef: {name: kafka, key: ca}}
      clientCert: {secretKeyRef: {name: kafka, key: cert}}
      clientKey: {secretKeyRef: {name: kafka, key: key}}
  format: {type: json, schema: [{name: id, type: long}]}
  table: {namespace: it, name: t}
"""
    from icefall.api import load_manifest

    spec = load_manifest(manifest).spec
    kafka_env, _, problems = secret_env_vars(spec)
    assert not problems
    environ = {env.name: f"value-of-{env.key}" for env in kafka_env}
    assert set(environ) == {
        "ICEFALL_KAFKA_USERNAME",
        "ICEFALL_KAFKA_PASSWORD",
        "ICEFALL_KAFKA_CA_CERT",
        "ICEFALL_KAFKA_CLIENT_CERT",
        "ICEFALL_KAFKA_CLIENT_KEY",
    }
    assert librdkafka_config(spec.source.security, environ) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "value-of-user",
        "sasl.password": "value-of-pw",
        "ssl.ca.pem": "value-of-ca",
        "ssl.certificate.pem": "value-of-cert",
        "ssl.key.pem": "value-of-key",
    }


def test_missing_env_variable_names_field_and_variable() -> None:
    with pytest.raises(MissingSecretError) as raised:
        librdkafka_config(sasl("PLAIN"), {"KAFKA_USER": "icefall"})
    message = str(raised.value)
    assert message.startswith("spec.source.security.password: environment variable KAFKA_PASSWORD is not set")


def test_missing_injected_variable_names_field_secret_and_variable() -> None:
    ref = SecretRef.model_validate({"secretKeyRef": {"name": "kafka", "key": "ca"}})
    with pytest.raises(MissingSecretError) as raised:
        resolve_secret(ref, "ca_cert", environ={})
    message = str(raised.value)
    assert message.startswith("spec.source.security.caCert: environment variable ICEFALL_KAFKA_CA_CERT")
    assert "'kafka'" in message and "'ca'" in message


def test_empty_variable_is_an_error() -> None:
    with pytest.raises(MissingSecretError, match="KAFKA_USER is empty"):
        spark_kafka_options(sasl("PLAIN"), {"KAFKA_USER": "", "KAFKA_PASSWORD": PASSWORD})


def test_errors_never_contain_secret_values() -> None:
    secret = "hunter2-very-secret"
    with pytest.raises(MissingSecretError) as raised:
        # The username is set; the password is missing: the message must not echo what is set.
        librdkafka_config(sasl("PLAIN"), {"KAFKA_USER": secret, "CA": secret})
    assert secret not in str(raised.value)
    assert secret not in repr(raised.value)


def test_streaming_table_helper_defaults_to_plaintext() -> None:
    st = streaming_table("t", "topic", "127.0.0.1:9092")
    assert librdkafka_config(st.spec.source.security, {}) == {}


# librdkafka's own texts, as seen against the stack's broker (tests/integration/test_kafka_security.py).
REFUSALS = [
    (
        KafkaError._AUTHENTICATION,
        "SASL authentication error: Authentication failed during authentication due to invalid credentials "
        "with SASL mechanism SCRAM-SHA-512",
        "username, password",
    ),
    (
        KafkaError._SSL,
        "SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate "
        "could not be verified",
        "spec.source.security.caCert",
    ),
    (
        KafkaError._TRANSPORT,
        "Receive failed: error:0A000412:SSL routines::ssl/tls alert bad certificate: SSL alert number 42",
        "spec.source.security.clientCert and clientKey",
    ),
    (
        KafkaError._TRANSPORT,
        "SSL handshake failed: Disconnected: SSL connection closed by peer: connecting to a PLAINTEXT broker "
        "listener?",
        "spec.source.security.protocol",
    ),
]


@pytest.mark.parametrize(("code", "text", "fields"), REFUSALS)
def test_a_refusal_names_the_fields_to_fix(code: int, text: str, fields: str) -> None:
    refused = refusal(KafkaError(code, text))
    assert refused is not None
    assert fields in refused.message("127.0.0.1:9093", "orders", text)


@pytest.mark.parametrize(
    "text",
    [
        "Disconnected: SSL connection closed by peer (after 3ms in state SSL_HANDSHAKE)",
        "Connect to ipv4#127.0.0.1:9093 failed: Connection refused",
    ],
)
def test_a_dropped_connection_is_no_refusal(text: str) -> None:
    assert refusal(KafkaError(KafkaError._TRANSPORT, text)) is None


def test_spark_redacts_every_kafka_option_that_carries_a_secret() -> None:
    """Spark redacts an option whose key or value matches `spark.redaction.regex` (in plans, logs and its UI):
    the password (in the JAAS line) and the client's private key must; the public certificates need not."""
    sec = sasl(
        "SCRAM-SHA-512",
        "SASL_SSL",
        caCert={"env": "CA"},
        clientCert={"env": "CERT"},
        clientKey={"env": "KEY"},
    )
    environ = {**ENV, "KEY": "-----BEGIN PRIVATE KEY-----\nMIIE...\n-----END PRIVATE KEY-----\n"}
    options = spark_kafka_options(sec, environ)
    redacted = {key for key, value in options.items() if re.search(REDACTION_REGEX, f"{key}\n{value}")}
    assert {"kafka.sasl.jaas.config", "kafka.ssl.keystore.key"} <= redacted
