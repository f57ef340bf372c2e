"""Which configuration keys name code to load: refused from a table, dropped from what an endpoint says.

Iceberg's clients (pyiceberg and Iceberg Java), the JDBC drivers behind a sql catalog, Hadoop and the Kafka
consumer all load classes or modules by name from their properties: `py-io-impl`, `io-impl`,
`catalog-impl`, `metrics-reporter-impl`, `encryption.kms-impl`, `client.factory`,
`client.credentials-provider`, `write.location-provider.impl`, pgjdbc's `socketFactory`, Kafka's
`config.providers` and `*.class` settings, ... A StreamingTable's author, and every endpoint the table
names, are not trusted (docs/security.md), so none of them chooses code: Icefall's clients use fixed
implementations.

- `code_property_problem(key, value)`: why an Iceberg catalog or table property names code, or None. A
  deny-list by shape (any key with a word such as impl, class, factory, provider, interceptor,
  callback, plugin or loader; every `hadoop.*` key; `rest.auth.type` naming anything but a built-in
  scheme), because the catalogs' property sets are open (FileIOs, JDBC drivers and Hadoop add their own).
- `kafka_property_problem(key)`: why a Kafka consumer property may not be set, or None. An allow-list
  (`ALLOWED_CONSUMER_PROPERTIES`: fetch sizes, timeouts, backoffs, `client.rack`, `group.id`, ...), since
  the consumer's own configuration is closed and most of what is not tuning either is Icefall's or names
  classes.

Pure. Not guaranteed: that a property this module lets through is harmless in every FileIO or driver a
future Iceberg release adds; the allow-list side (Kafka) is the stricter one for that reason.
"""

from __future__ import annotations

import re

SECURITY_DOC = "docs/security.md"
CODE_REASON = (
    "class-valued properties are refused: Icefall never loads code a table names (see docs/security.md)"
)
#: Words of a key that mean its value is a class, a module or code to load (matched inside the lowered key,
#: so `socketFactory` and `sslhostnameverifier` are caught as well as `client.factory` and `io-impl`).
CODE_WORDS = (
    "impl",
    "class",
    "factory",
    "provider",
    "interceptor",
    "callback",
    "verifier",
    "plugin",
    "loader",
    "handler",
    "extension",  # SQLite's enable_load_extension
    "deserializ",  # MySQL's autoDeserialize (Java deserialization)
    "loadlocal",  # MySQL's allowLoadLocalInfile (reads the client's files)
    "loggerfile",  # pgjdbc's loggerFile (writes a file)
)
#: Keys that hold one of these words but name no code.
NOT_CODE = frozenset({"s3.write.storage-class"})
#: Keys whose value is a built-in scheme or, otherwise, a class name (Iceberg Java's AuthManagers).
AUTH_TYPE_KEYS = ("rest.auth.type", "rest.auth.sigv4.delegate-auth-type")
BUILT_IN_AUTH_TYPES = frozenset({"none", "basic", "oauth2", "sigv4", "google"})
#: The best-known class-valued keys, named exactly: the CRD's CEL rules look these up (a CEL rule cannot
#: afford to walk a map with patterns), the models refuse every key `code_property_problem` refuses.
KNOWN_CODE_KEYS = (
    "catalog-impl",
    "py-catalog-impl",
    "io-impl",
    "py-io-impl",
    "lock-impl",
    "metrics-reporter-impl",
    "encryption.kms-impl",
    "client.factory",
    "client.credentials-provider",
    "s3.client-factory-impl",
    "s3.retry-strategy-impl",
    "adls.token-credential-provider",
    "rest.client.tls.configurer-impl",
    "write.location-provider.impl",
    "write.py-location-provider.impl",
)
_HINTS = {
    "catalog-impl": "the catalog's client follows spec.table.catalog.type",
    "py-catalog-impl": "the catalog's client follows spec.table.catalog.type",
    "io-impl": "Icefall picks the FileIO from the warehouse's scheme",
    "py-io-impl": "Icefall picks the FileIO from the warehouse's scheme",
}


def code_property_problem(key: str, value: str | None = None) -> str | None:
    """Why the catalog or table property `key` (with `value`, when known) names code to load, or None.

    `value` matters for `rest.auth.type` only: a built-in scheme is fine, anything else is a class name;
    with `value` None (a secret reference) the key is refused."""
    lowered = key.lower()
    if lowered.startswith("header."):
        return None  # an HTTP header sent to the catalog, never loaded
    if lowered.startswith("hadoop."):
        return (
            "Hadoop configuration is refused: its keys name classes (fs.*.impl, credential providers, "
            "codecs) and Icefall's FileIOs need none; remove it"
        )
    if lowered in AUTH_TYPE_KEYS:
        if value is not None and value.strip().lower() in BUILT_IN_AUTH_TYPES:
            return None
        schemes = ", ".join(sorted(BUILT_IN_AUTH_TYPES))
        return f"names an authentication class unless it is one of {schemes}; {CODE_REASON}; remove it"
    if lowered in NOT_CODE or not any(word in lowered for word in CODE_WORDS):
        return None
    hint = _HINTS.get(lowered)
    return f"{CODE_REASON}: {hint}; remove it" if hint else f"{CODE_REASON}; remove it"


# -- Kafka ---------------------------------------------------------------------------------------------

#: Kafka consumer properties a table may set (without Spark's `kafka.` prefix): tuning that changes how
#: fast and how patiently records are fetched, never what is read, how it is decoded, or what code runs.
ALLOWED_CONSUMER_PROPERTIES = frozenset(
    {
        "fetch.min.bytes",
        "fetch.max.bytes",
        "fetch.max.wait.ms",
        "max.partition.fetch.bytes",
        "max.poll.records",
        "receive.buffer.bytes",
        "send.buffer.bytes",
        "request.timeout.ms",
        "default.api.timeout.ms",
        "connections.max.idle.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "retry.backoff.ms",
        "retry.backoff.max.ms",
        "socket.connection.setup.timeout.ms",
        "socket.connection.setup.timeout.max.ms",
        "metadata.max.age.ms",
        "metadata.recovery.strategy",
        "metadata.recovery.rebootstrap.trigger.ms",
        "client.dns.lookup",
        "client.rack",
        "client.id",
        "group.id",  # Kafka ACLs may require one; the group is never joined (partitions are assigned)
        "check.crcs",
    }
)
#: Consumer settings that load classes or configuration providers by name, refused with that reason
#: (everything else off the allow-list is refused as such).
KAFKA_CODE_KEYS = frozenset(
    {
        "config.providers",
        "partition.assignment.strategy",
        "metric.reporters",
        "security.providers",
        "interceptor.classes",
        "key.deserializer",
        "value.deserializer",
        "sasl.jaas.config",
        "sasl.login.class",
        "sasl.login.callback.handler.class",
        "sasl.client.callback.handler.class",
        "ssl.engine.factory.class",
    }
)
_KAFKA_CODE_RE = re.compile(r"^config\.providers\.|\.class(es)?$|\.classes\.|callback|factory|provider")


def kafka_names_code(key: str) -> bool:
    """The consumer property `key` names a class, a config provider or a login module to load."""
    return key in KAFKA_CODE_KEYS or _KAFKA_CODE_RE.search(key) is not None


def kafka_property_problem(key: str) -> str | None:
    """Why `spec.source.properties` may not set the consumer property `key` (no `kafka.` prefix), or
    None when it is on the allow-list."""
    if key in ALLOWED_CONSUMER_PROPERTIES:
        return None
    if kafka_names_code(key):
        return (
            f"{key} names classes or configuration providers to load: Icefall never loads code a table "
            f"names (see {SECURITY_DOC}); remove it"
        )
    return (
        f"{key} is not on the allow-list of Kafka consumer properties a table may set (fetch sizes, "
        f"timeouts, backoffs, client.rack, client.id, group.id; see {SECURITY_DOC}); remove it"
    )
