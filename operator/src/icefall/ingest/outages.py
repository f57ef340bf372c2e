"""Which errors mean "a service is unreachable", and one outage followed from its first failure to its end.

`classify(error)` answers Kafka, the catalog, the object store, the schema registry, or None (a real
failure: raise it). It looks at the exception, its causes and, for errors from the JVM (Spark, Iceberg
Java), the Java exception text.
Seen from the real servers stopped (tests/integration/test_outages.py): librdkafka `_TRANSPORT` and
`_TIMED_OUT` (as `KafkaUnavailableError`), psycopg2's `OperationalError` through SQLAlchemy, pyarrow's S3
`OSError` "AWS Error NETWORK_CONNECTION ... curlCode: 7", and Spark's JdbcCatalog `UncheckedSQLException:
Failed to get table`. The other Java markers (Kafka's Java client, the AWS SDK, the REST client) follow
those clients' exception names and were not seen yet: the Python clients meet an outage first.

- Kafka: `KafkaUnavailableError` from `icefall.kafka.admin` (librdkafka: `_TRANSPORT`, `_TIMED_OUT`,
  `_ALL_BROKERS_DOWN`) except refused credentials; a librdkafka `KafkaException` with one of those codes;
  Spark's Kafka source: `org.apache.kafka.common.errors.TimeoutException` and friends;
- the catalog: DB-API / SQLAlchemy `OperationalError` (PostgreSQL: "Connection refused", "server closed the
  connection unexpectedly"), `requests` connection errors of the REST client, and from Spark the JDBC
  driver's connection errors (`PSQLException`, `SQLTransientConnectionException`, `SQLNonTransientConnection
  Exception`) or the Iceberg REST client's `RESTException`/`ServiceUnavailableException`;
- the object store: pyarrow's `OSError` "AWS Error NETWORK_CONNECTION" (curl could not connect or timed
  out), pyarrow's GCS `OSError` "google::cloud::Status(UNAVAILABLE ... CURL error [7]" (seen with
  fake-gcs-server stopped, after `icefall.catalog.gcs_io`'s bounded retries), pyarrow's Azure `OSError`
  "Azure Error: [] Fail to get a new connection" (seen with Azurite stopped) and from Spark the AWS SDK's
  `SdkClientException` ("Unable to execute HTTP request"); Iceberg Java's GCSFileIO and ADLSFileIO errors
  are not classified yet (a GCS or Azure outage seen first by Spark is raised);
- the Kubernetes API server (a driver's commit Lease): `KubeAPIUnavailableError` from
  `icefall.commit.kube_lease` (no connection, a timeout, 429/5xx: etcd down behind it), seen with the real
  kube-apiserver and etcd SIGKILLed (tests/integration/test_kube_apiserver_kills.py);
- the driver's local disk (`Service.LOCAL_DISK`): "No space left on device" (ENOSPC) from Spark (its shuffle
  and spill files in its local dirs, `spark.local.dir` / `SPARK_LOCAL_DIRS`) or a Python `OSError` with
  errno ENOSPC, seen with those dirs on a full tmpfs (tests/integration/test_resource_faults.py); waited
  out like an outage: nothing was committed, and the batch is read again once space is freed;
- Spark's executors (`Service.EXECUTORS`): a job aborted because an executor sent no heartbeat within
  `spark.network.timeout` ("ExecutorLostFailure ... Reason: Executor heartbeat timed out"), seen with every
  packet between the driver and its executor dropped (tests/integration/test_resource_faults.py); Spark
  retries such a task `spark.task.maxFailures` times by itself, so the job fails only when the network
  flaps that often within one batch; waited out like an outage: nothing was committed, the batch is read
  again once executors register; an executor that dies of its own (OOM, exit 137) is not this;
- this host's clock (`Service.CLOCK`): `ClockBehindError` from `icefall.commit`, a clock more than a minute
  behind the table's last update (tests/integration/test_resource_faults.py); waited out until it passes;
- the schema registry: `RegistryUnavailableError` from `icefall.kafka.registry` (not reached, timed out,
  408/429/5xx), seen with the real registry stopped (tests/integration/test_registry.py); a registry
  that refuses the credentials or lacks the subject (`RegistryError`) is a configuration error, raised.

`Outages` logs ONE line per failed attempt (what cannot be reached, where, the client's own words, the next
retry), never a traceback; counts the outage in `icefall_ingest_outages_total{service}`, shows it in the
`icefall_ingest_unavailable{service}` gauge while it lasts, counts attempts in
`icefall_ingest_unavailable_retries_total`, and logs once when the service answers again. Retrying is the
caller's: ingestion re-plans from the table after a failed attempt, so a batch whose commit outcome was
unknown is resolved by the commit protocol (it either landed and its offsets are committed, or it did not
and is read again), never committed twice.

Not guaranteed: that an error is classified right when a client words it differently from what was seen;
an unknown error is raised (loud), never retried forever in silence.
"""

from __future__ import annotations

import errno
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from icefall.plan.outages import OutageClock, Service
from icefall.runtime import metrics

if TYPE_CHECKING:
    from icefall.catalog import CatalogConfig

log = logging.getLogger(__name__)

# librdkafka error codes that mean "no broker answered" (confluent_kafka.KafkaError values).
_KAFKA_TRANSPORT_CODES = {-195, -185, -187}  # _TRANSPORT, _TIMED_OUT, _ALL_BROKERS_DOWN

# What a database's OperationalError says when the server, not the statement, is the trouble.
_CONNECTION_TROUBLE = re.compile(
    r"connect|server closed|timeout|timed out|terminat|database is locked|could not translate host",
    re.IGNORECASE,
)

# user:password@ in a URL (kept out of log lines).
_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", re.IGNORECASE)

# SQLAlchemy's pointer to its error docs: no news for the reader of one log line.
_BACKGROUND = re.compile(r"\s*\(Background on this error at: [^)]*\)")

# Lines of an error's text (Java exception chains included) that name an unreachable service. First match
# wins, so the specific markers (the client that failed) come before the generic ones.
_MARKERS: tuple[tuple[Service, re.Pattern[str]], ...] = (
    (Service.LOCAL_DISK, re.compile(r"No space left on device")),
    (
        Service.EXECUTORS,
        re.compile(r"(ExecutorLostFailure \([^)]*\) Reason: )?Executor heartbeat timed out after \d+ ms"),
    ),
    (
        Service.OBJECT_STORE,
        re.compile(
            r"AWS Error (NETWORK_CONNECTION|SERVICE_UNAVAILABLE)|curlCode: (7|28)\b"
            r"|google::cloud::Status\(UNAVAILABLE|CURL error \[(7|28)\]"
            r"|Azure Error: \[[^\]]*\] Fail to get a new connection"
            r"|software\.amazon\.awssdk\.core\.exception\.SdkClientException"
            r"|Unable to execute HTTP request"
        ),
    ),
    (
        Service.KAFKA,
        re.compile(
            r"org\.apache\.kafka\.common\.errors\.(TimeoutException|DisconnectException|NetworkException)"
            r"|Timeout of \d+ms expired before the position for partition"
            r"|Failed to (get|fetch) (records|offsets)"
        ),
    ),
    (
        Service.CATALOG,
        re.compile(
            r"org\.postgresql\.util\.PSQLException: (Connection|An I/O error|The connection attempt)"
            r"|java\.sql\.SQLTransientConnectionException|java\.sql\.SQLNonTransientConnectionException"
            r"|org\.apache\.iceberg\.exceptions\.(RESTException|ServiceUnavailableException"
            r"|ServiceFailureException)"
            r"|UncheckedSQLException: Failed to (connect|get)"
        ),
    ),
)


# How the line at the end of an outage says it ended, when not "answers again".
_AGAIN = {
    Service.LOCAL_DISK: "has space again",
    Service.CLOCK: "has passed the table's last update",
    Service.EXECUTORS: "answer again",
}


@dataclass(frozen=True)
class Unavailable:
    """What `classify` found: the service and the line of the error that says so."""

    service: Service
    reason: str


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _text(error: BaseException) -> str:
    """`str(error)`, or its type's name when that fails: a Py4J error asks the JVM for its text, and the JVM
    may be gone."""
    try:
        return str(error)
    except Exception:
        return type(error).__name__


def _java_text(error: BaseException) -> str:
    """The Java exception chain of a Py4J / PySpark captured error ('' for a Python one)."""
    parts = []
    java = getattr(error, "java_exception", None)
    if java is not None:
        try:
            parts.append(str(java.toString()))
            cause = java.getCause()
            for _ in range(20):
                if cause is None:
                    break
                parts.append(str(cause.toString()))
                cause = cause.getCause()
        except Exception:  # the JVM may be gone
            pass
    for attribute in ("_stackTrace", "stackTrace", "desc"):
        value = getattr(error, attribute, None)
        if isinstance(value, str):
            parts.append(value)
    return "\n".join(parts)


_LIMIT = 300  # characters of a client's words in one log line


def _one_line(text: str, limit: int = _LIMIT) -> str:
    text = _BACKGROUND.sub("", text)
    line = " ".join(text.split()).removeprefix(": ")  # Py4J puts the Java error on a line of its own
    return line if len(line) <= limit else line[: limit - 3] + "..."


def classify(error: BaseException) -> Unavailable | None:
    """The service `error` says is unreachable, or None when it is not an outage (see the module doc)."""
    texts: list[str] = []
    for link in _chain(error):
        if _configuration_error(link):
            return None  # retrying will not fix it
        found = _client_outage(link)
        if found is not None:
            return found
        texts.append(f"{_text(link)}\n{_java_text(link)}")
    text = "\n".join(texts)
    for service, pattern in _MARKERS:
        for line in text.splitlines():
            match = pattern.search(line)
            if match:
                # A long line (Spark's "Job aborted ...") is cut to its end from the words that matched.
                start = match.start() if match.end() > _LIMIT else 0
                return Unavailable(service, _one_line(line[start:]))
    return None


def _configuration_error(link: BaseException) -> bool:
    """Kafka refused the credentials; the registry refused a request or lacks the subject."""
    from icefall.kafka.admin import KafkaCredentialsRefusedError
    from icefall.kafka.registry import RegistryError, RegistryUnavailableError

    registry_refused = isinstance(link, RegistryError) and not isinstance(link, RegistryUnavailableError)
    return isinstance(link, KafkaCredentialsRefusedError) or registry_refused


def _client_outage(link: BaseException) -> Unavailable | None:
    """The outage a Python client's exception `link` says (its type and text), if any."""
    from icefall.commit.errors import ClockBehindError, ObjectStoreUnreachableError
    from icefall.commit.kube_lease import KubeAPIUnavailableError
    from icefall.kafka.admin import KafkaUnavailableError
    from icefall.kafka.registry import RegistryUnavailableError

    kind = f"{type(link).__module__}.{type(link).__qualname__}"
    if isinstance(link, ClockBehindError):
        return Unavailable(Service.CLOCK, _one_line(str(link)))
    if isinstance(link, ObjectStoreUnreachableError):
        return Unavailable(Service.OBJECT_STORE, _one_line(str(link)))
    if isinstance(link, OSError) and link.errno == errno.ENOSPC:
        return Unavailable(Service.LOCAL_DISK, _one_line(str(link)))
    if isinstance(link, KafkaUnavailableError):
        # Its text names the brokers and topic, as the outage line does: keep the client's reason only.
        text = str(link)
        if text.startswith("cannot reach Kafka") and ": " in text:
            text = text.split(": ", 1)[1]
        return Unavailable(Service.KAFKA, _one_line(text))
    if isinstance(link, KubeAPIUnavailableError):
        return Unavailable(Service.KUBE_APISERVER, _one_line(str(link)))
    if isinstance(link, RegistryUnavailableError):
        # Its text starts with "schema registry <url>: ", as the outage line does: keep the rest.
        return Unavailable(Service.REGISTRY, _one_line(str(link).split(": ", 1)[-1]))
    if kind.startswith("confluent_kafka") and link.args:
        code = getattr(link.args[0], "code", lambda: None)()
        if code in _KAFKA_TRANSPORT_CODES:
            return Unavailable(Service.KAFKA, _one_line(str(link.args[0])))
    if type(link).__name__ == "OperationalError" and _CONNECTION_TROUBLE.search(str(link)):
        # DB-API (psycopg2, sqlite3) and SQLAlchemy; not "no such table" and other real failures
        return Unavailable(Service.CATALOG, _one_line(str(link).split("\n[SQL:")[0]))
    if kind.startswith("requests.exceptions") and type(link).__name__ in (
        "ConnectionError",
        "ConnectTimeout",
        "ReadTimeout",
    ):
        return Unavailable(Service.CATALOG, _one_line(str(link)))
    return None


def log_failure(logger: logging.Logger, error: BaseException, message: str, *args: object) -> None:
    """Log `message % args` at WARNING: one line naming the service when `error` is an outage, else with
    the traceback (a real failure must be readable in full)."""
    found = classify(error)
    if found is None:
        logger.warning(message, *args, exc_info=error)
    else:
        logger.warning(message + ": cannot reach %s (%s)", *args, found.service.display_name, found.reason)


def service_addresses(
    bootstrap: str,
    topic: str,
    catalog: CatalogConfig,
    *,
    registry: str | None = None,
    local_dirs: str | None = None,
) -> dict[Service, str]:
    """Where each service is, as the outage lines name it: the bootstrap servers (and topic), the catalog's
    URI (secrets masked), the object store's endpoint (or the warehouse), the schema registry's URL
    (`registry`, when the format has one; any user:password@ in it left out) and Spark's local dirs."""
    properties = catalog.properties
    store = (
        properties.get("s3.endpoint")
        or properties.get("gcs.service.host")
        or properties.get("adls.dfs-storage-authority")
        or catalog.warehouse
        or ""
    )
    where = {
        Service.KAFKA: f"{bootstrap} for topic '{topic}'",
        Service.CATALOG: catalog.mask(catalog.uri),
        Service.OBJECT_STORE: catalog.mask(store),
    }
    if registry:
        where[Service.REGISTRY] = registry_address(registry)
    if local_dirs:
        where[Service.LOCAL_DISK] = local_dirs
    return where


def registry_address(url: str) -> str:
    """A schema registry's URL as the outage lines name it: any user:password@ in it left out."""
    return _USERINFO.sub(r"\1", url)


class Outages:
    """One process's view of the services it needs: `failed(error)` on every failed attempt, `succeeded()`
    after every attempt that got through. `where` names each service's address (no secrets)."""

    def __init__(
        self,
        label: str,
        where: Mapping[Service, str],
        *,
        initial_seconds: float = 1.0,
        max_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.where = dict(where)
        self.initial_seconds = initial_seconds
        self.max_seconds = max_seconds
        self.clock = clock
        self.state = OutageClock()
        #: Told the service waited out when an attempt fails, None once one gets through after an outage
        #: (the driver's status report: `icefall.ingest.writer_status`).
        self.listener: Callable[[Service | None], None] | None = None

    def describe(self, found: Unavailable) -> str:
        where = self.where.get(found.service)
        if found.service is Service.LOCAL_DISK:
            return f"local disk {where} is full" if where else "a local disk is full"
        if found.service is Service.CLOCK:
            return "this host's clock is behind the table"
        if found.service is Service.EXECUTORS:
            return "lost its Spark executors (no heartbeat within spark.network.timeout: network partition?)"
        return f"cannot reach {found.service.display_name}" + (f" at {where}" if where else "")

    def failed(self, error: BaseException) -> float | None:
        """Seconds to wait before the next attempt, or None when `error` is not an outage (raise it)."""
        found = classify(error)
        if found is None:
            return None
        previous = self.state
        self.state = previous.failed(found.service, self.clock())
        if not previous.ongoing or previous.service is not found.service:
            metrics.OUTAGES.labels(self.label, found.service.value).inc()
            if previous.service is not None and previous.service is not found.service:
                metrics.UNAVAILABLE.labels(self.label, previous.service.value).set(0)
        metrics.UNAVAILABLE.labels(self.label, found.service.value).set(1)
        metrics.UNAVAILABLE_RETRIES.labels(self.label, found.service.value).inc()
        delay = self.state.next_delay(initial_seconds=self.initial_seconds, max_seconds=self.max_seconds)
        log.warning(
            "%s: %s (%s); attempt %d failed, retrying in %.0fs",
            self.label, self.describe(found), found.reason, self.state.failures, delay,
        )  # fmt: skip
        if self.listener is not None:
            self.listener(found.service)
        return delay

    def succeeded(self) -> None:
        metrics.LAST_SUCCESS.labels(self.label).set(time.time())
        if not self.state.ongoing:
            return
        service = self.state.service
        lasted = self.state.lasted(self.clock())
        if service is not None:
            metrics.UNAVAILABLE.labels(self.label, service.value).set(0)
            where = f" at {self.where[service]}" if self.where.get(service) else ""
            again_text = _AGAIN.get(service, "answers again")
            log.warning(
                "%s: %s%s %s after %.0fs (%d failed attempts); resuming",
                self.label, service.display_name, where, again_text, lasted, self.state.failures,
            )  # fmt: skip
        self.state = OutageClock()
        if self.listener is not None:
            self.listener(None)

    def retrying(self, step: Callable[[], object], should_stop: Callable[[], bool]) -> bool:
        """Call `step()` until it gets through (True) or `should_stop()` (False); outages are waited out,
        any other error is raised."""
        while not should_stop():
            try:
                step()
            except Exception as error:
                delay = self.failed(error)
                if delay is None:
                    raise
                sleep_unless(delay, should_stop)
                continue
            self.succeeded()
            return True
        return False


def sleep_unless(seconds: float, should_stop: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not should_stop():
        time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
