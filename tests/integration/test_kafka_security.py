"""Kafka security end to end, one listener per setup on the stack's `secure_kafka` broker: TLS with the CA by
reference (SSL), mutual TLS (client certificate and key by reference), SCRAM-SHA-512 over TLS (SASL_SSL) and
SCRAM-SHA-256 (SASL_PLAINTEXT). For each, a real `icefall run --until-caught-up` fills the table exactly once
(checked record by record and by content), then `icefall verify` and `icefall read` connect with the same
manifest fields (librdkafka and Spark's Kafka source alike). Credentials travel only as `{env: NAME}`
references and never appear in the run's output. A client the brokers refuse (a CA that did not sign the
broker, no client certificate on a mutual-TLS listener, a wrong SCRAM password) gets one line that names
what to fix, never a traceback or a wait for a broker that is up. The operator reads no topic itself;
the driver's refusal reaches the table's conditions: its last words `KafkaCredentialsRefused: <the line>`
become Ingesting/Ready False and Degraded True with that reason and the fields (checked with a real
`icefall run` for an untrusted CA, and for each refusal from the error the driver's client raises).
SASL/PLAIN: test_kafka_sasl.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from icefall.api import ConditionReason, ConditionStatus, ConditionType, StreamingTable, load_manifest
from icefall.catalog import CatalogConfig
from icefall.commands.verify import verify_table
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.tls import Pki
from icefall.ingest.union_read import union_read
from icefall.kafka.admin import KafkaCredentialsRefusedError, TopicView
from icefall.kafka.security import librdkafka_config
from icefall.testing.driver_exit import conditions_after_exit, run_as_driver
from icefall.testing.plugin import SCRAM_USERS
from icefall.testing.streams import assert_exactly_once, manifest_text, produce, watermarks

pytestmark = pytest.mark.integration

CA = {"caCert": {"env": "TEST_KAFKA_CA"}}
CLIENT_CERT = {"clientCert": {"env": "TEST_KAFKA_CLIENT_CERT"}, "clientKey": {"env": "TEST_KAFKA_CLIENT_KEY"}}
CREDENTIALS = {"username": {"env": "TEST_KAFKA_USER"}, "password": {"env": "TEST_KAFKA_PASSWORD"}}

# (listener of secure_kafka, spec.source.security)
# mTLS and SASL_SSL in `make test` (the CA check, a client certificate, SCRAM over TLS); plain TLS and
# SASL_PLAINTEXT add no code path of Icefall's over those two: `long` (`make test-all`), for CI's time.
SETUPS = [
    pytest.param(("SSL", {"protocol": "SSL", **CA}), id="ssl", marks=pytest.mark.long),
    pytest.param(("MTLS", {"protocol": "SSL", **CA, **CLIENT_CERT}), id="mtls"),
    pytest.param(
        ("SASL_SSL", {"protocol": "SASL_SSL", "saslMechanism": "SCRAM-SHA-512", **CREDENTIALS, **CA}),
        id="sasl_ssl-scram-sha-512",
    ),
    pytest.param(
        ("SASL_PLAINTEXT", {"protocol": "SASL_PLAINTEXT", "saslMechanism": "SCRAM-SHA-256", **CREDENTIALS}),
        id="sasl_plaintext-scram-sha-256",
        marks=pytest.mark.long,
    ),
]


def secrets(broker: KafkaBroker, **changes: str) -> dict[str, str]:
    """The variables the manifests' `{env: ...}` references name, as `icefall run` finds them."""
    assert broker.tls is not None
    user, password = next(iter(SCRAM_USERS.items()))
    values = {
        "TEST_KAFKA_CA": broker.tls.ca_pem,
        "TEST_KAFKA_CLIENT_CERT": broker.tls.client.cert_pem,
        "TEST_KAFKA_CLIENT_KEY": broker.tls.client.key_pem,
        "TEST_KAFKA_USER": user,
        "TEST_KAFKA_PASSWORD": password,
    }
    return {**values, **changes}


def icefall(*args: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "icefall.cli", *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("setup", SETUPS)
def test_icefall_run_over_a_secured_listener_is_exactly_once(  # noqa: PLR0917 (fixtures)
    secure_kafka: KafkaBroker,
    spark: SparkSession,
    catalog_config: CatalogConfig,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    setup: tuple[str, dict[str, Any]],
) -> None:
    listener, security = setup
    slug = listener.lower()
    topic, name = f"it-secure-{slug}", f"secure_{slug}"
    secure_kafka.create_topic(topic, partitions=2)
    bad = produce(secure_kafka, topic, 0, 120, bad_every=30)  # the fixtures' producer: PLAINTEXT
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text(name, topic, secure_kafka.bootstrap_of(listener), security=security))
    assert "BEGIN" not in manifest.read_text()  # references only
    env = secrets(secure_kafka)
    lake = str(catalog_config.database.parent)  # the run writes the tables this session's Spark reads
    run = icefall(
        "run", "-f", str(manifest), "--state-dir", lake, "--no-maintenance", "--until-caught-up",
        "--lease-timeout", "5", "--master", "local[1]", env=env,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    leaks = [env["TEST_KAFKA_PASSWORD"], env["TEST_KAFKA_CLIENT_KEY"].splitlines()[1]]
    assert not [secret for secret in leaks if secret in output]
    high = watermarks(secure_kafka, topic)
    assert_exactly_once(catalog_config, name, high, bad, bootstrap=secure_kafka.bootstrap, spark=spark)

    # `icefall verify` and `icefall read`, in this process, over the same secured listener.
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    st = load_manifest(manifest.read_text())
    report = verify_table(st, catalog_config, spark=spark)
    assert report.ok, report.render()
    produce(secure_kafka, topic, 120, 10)
    with union_read(st, catalog_config, spark=spark) as fresh:
        assert fresh.cut.tail_records == 10
        assert fresh.to_spark().count() == 120 - len(bad) + 10


# (listener, spec.source.security, variables changed, what the error must name)
REFUSED = [
    pytest.param(
        "SSL", {"protocol": "SSL", **CA}, {"TEST_KAFKA_CA": Pki.other_ca()},
        "spec.source.security.caCert", id="untrusted-ca",
    ),
    pytest.param(
        "MTLS", {"protocol": "SSL", **CA}, {}, "spec.source.security.clientCert", id="no-client-certificate",
    ),
    pytest.param(
        "SASL_SSL", {"protocol": "SASL_SSL", "saslMechanism": "SCRAM-SHA-512", **CREDENTIALS, **CA},
        {"TEST_KAFKA_PASSWORD": "wrong-password"}, "spec.source.security (username, password",
        id="wrong-scram-password",
    ),
]  # fmt: skip


def assert_refused_in_conditions(st: StreamingTable, last_words: str, names: str) -> None:
    """A driver of `st` that exited with `last_words` makes its conditions say KafkaCredentialsRefused and
    name `names`."""
    refused = ConditionReason.KAFKA_CREDENTIALS_REFUSED
    conditions = conditions_after_exit(st, exit_code=1, last_words=last_words)
    false, true = ConditionStatus.FALSE, ConditionStatus.TRUE
    assert conditions[ConditionType.INGESTING][:2] == (false, refused), conditions
    assert conditions[ConditionType.DEGRADED][:2] == (true, refused), conditions
    assert conditions[ConditionType.READY][:2] == (false, refused), conditions
    message = conditions[ConditionType.INGESTING][2]
    assert names in message and "wrong-password" not in message and "PRIVATE KEY" not in message, message


@pytest.mark.parametrize(("listener", "security", "changes", "names"), REFUSED)
def test_a_refused_client_is_told_what_to_fix(
    secure_kafka: KafkaBroker, listener: str, security: dict[str, Any], changes: dict[str, str], names: str
) -> None:
    """What `icefall status`, `verify` and the driver use (a TopicView with the manifest's settings) fails
    with a `KafkaCredentialsRefusedError` naming the fields to check; the driver leaves it as its last words
    (`KafkaCredentialsRefused: <error>`, icefall.cli), which the operator's status turns into the reason
    KafkaCredentialsRefused, not KafkaUnavailable."""
    topic = f"it-refused-{listener.lower()}"
    secure_kafka.create_topic(topic)
    st = load_manifest(
        manifest_text("refused", topic, secure_kafka.bootstrap_of(listener), security=security)
    )
    config = librdkafka_config(st.spec.source.security, secrets(secure_kafka, **changes))
    view = TopicView(st.spec.source.bootstrap_servers, topic, config)
    with view, pytest.raises(KafkaCredentialsRefusedError) as raised:
        view.watermarks(timeout=5)
    message = str(raised.value)
    assert names in message, message
    assert "wrong-password" not in message and "PRIVATE KEY" not in message
    last_words = f"KafkaCredentialsRefused: {message}"  # as icefall.cli writes it (the next test runs it)
    assert_refused_in_conditions(st, last_words, names)


def test_icefall_run_with_an_untrusted_ca_stops_with_one_line(
    secure_kafka: KafkaBroker, catalog_config: CatalogConfig, tmp_path: Path
) -> None:
    """Not an outage to wait out: `icefall run` exits 1 with one line naming caCert, no traceback; as a
    driver, the same line after `KafkaCredentialsRefused: ` is its termination message, and the operator's
    status says KafkaCredentialsRefused with it."""
    topic = "it-refused-run"
    secure_kafka.create_topic(topic)
    produce(secure_kafka, topic, 0, 5)
    manifest = tmp_path / "table.yaml"
    manifest.write_text(
        manifest_text(
            "refused_run", topic, secure_kafka.bootstrap_of("SSL"), security={"protocol": "SSL", **CA}
        )
    )
    env = secrets(secure_kafka, TEST_KAFKA_CA=Pki.other_ca())
    termination_log = tmp_path / "termination-log"
    run = run_as_driver(
        ["run", "-f", str(manifest), "--state-dir", str(tmp_path / "state"), "--no-maintenance",
         "--until-caught-up", "--max-seconds", "120", "--master", "local[1]"],
        env, termination_log,
    )  # fmt: skip
    assert run.returncode == 1, (run.stdout + run.stderr)[-4000:]
    assert "Traceback" not in run.stderr, run.stderr[-4000:]
    assert "retrying in" not in run.stderr, run.stderr[-4000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("icefall: Kafka at"), last
    assert "does not trust" in last and "spec.source.security.caCert" in last, last
    last_words = termination_log.read_text()
    assert last_words.strip() == "KafkaCredentialsRefused: " + last.removeprefix("icefall: "), last_words
    st = load_manifest(manifest.read_text())
    assert_refused_in_conditions(st, last_words, "spec.source.security.caCert")
