"""Outages: the backoff, the outage clock, which errors count as "unreachable", what is logged and counted.

Proves: the retry delay doubles from 1 s and stays at 30 s (no overflow however long the outage); the clock
keeps the first failure's time and counts attempts; the errors the real servers were seen to raise when
stopped (texts copied from test_outages.py runs: librdkafka via `KafkaUnavailableError`, PostgreSQL through
SQLAlchemy, pyarrow's S3 client, Spark's JdbcCatalog) and the Java client errors named in
`icefall.ingest.outages` (Kafka's Java client, the AWS SDK: not seen in a run yet) map to their service,
while refused Kafka credentials, "no such table" and ordinary bugs do not (they fail loudly); the schema
registry client's errors (the HTTP client's transport errors, 408/429/5xx) are an outage of the registry,
a refusal (401, 403, 404 of a subject) is not, and a registry down when ingestion starts is waited out
(`made_when_reachable`); `Outages` logs
one line per attempt naming the service and where, without a traceback, counts an outage once, sets and
clears the gauge, and logs when the service answers again (fake clock).
Not proven here: that the real servers raise these (tests/integration/test_outages.py).
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import httpx2
import pytest
import sqlalchemy.exc
from confluent_kafka.schema_registry.error import SchemaRegistryError

from icefall.api import SchemaRegistry
from icefall.commit.kube_lease import KubeAPIUnavailableError, LeaseAPIError
from icefall.ingest.outages import Outages, classify, log_failure, service_addresses
from icefall.kafka.admin import KafkaCredentialsRefusedError, KafkaUnavailableError
from icefall.kafka.registry import RegistryError, RegistryUnavailableError, registry_failure
from icefall.plan.outages import OutageClock, Service, retry_delay
from icefall.runtime import metrics

pytestmark = pytest.mark.unit


def test_the_retry_delay_doubles_and_is_capped() -> None:
    assert [retry_delay(n) for n in range(0, 8)] == [0, 1, 2, 4, 8, 16, 30, 30]
    assert retry_delay(10**6) == 30
    assert retry_delay(3, initial_seconds=0.5, max_seconds=60, factor=3) == 4.5
    with pytest.raises(ValueError):
        retry_delay(1, initial_seconds=0)


def test_the_outage_clock_keeps_its_start_and_counts_attempts() -> None:
    clock = OutageClock()
    assert not clock.ongoing and clock.lasted(5) == 0
    clock = clock.failed(Service.KAFKA, 10).failed(Service.KAFKA, 11).failed(Service.CATALOG, 13)
    assert (clock.started_at, clock.failures, clock.service) == (10, 3, Service.CATALOG)
    assert clock.next_delay() == 4 and clock.lasted(40) == 30


def _raised_from(error: BaseException, cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise error from inner
    except BaseException as outer:
        return outer


PG_REFUSED = (
    'connection to server at "127.0.0.1", port 55223 failed: Connection refused\n'
    "\tIs the server running on that host and accepting TCP/IP connections?\n\n"
    "(Background on this error at: https://sqlalche.me/e/21/e3q8)"
)


# What Spark 4.1 raised (abridged) when every packet between the driver and its executor was dropped for
# longer than spark.network.timeout (tests/integration/test_resource_faults.py, spark.task.maxFailures=1).
EXECUTOR_LOST = (
    "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 12.0 failed 1 times, "
    "most recent failure: Lost task 0.0 in stage 12.0 (TID 20) (192.0.2.2 executor 0): ExecutorLostFailure "
    "(executor 0 exited caused by one of the running tasks) "
    "Reason: Executor heartbeat timed out after 31170 ms"
)


@pytest.mark.parametrize(
    ("error", "service"),
    [
        (
            KafkaUnavailableError(
                "cannot reach Kafka at 127.0.0.1:9 for topic 't': KafkaError{code=_TRANSPORT}"
            ),
            "kafka",
        ),
        (sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception(PG_REFUSED)), "catalog"),
        (
            sqlalchemy.exc.OperationalError(
                "SELECT 1", {}, Exception("server closed the connection unexpectedly")
            ),
            "catalog",
        ),
        (
            OSError(
                "When reading information for key 'w/metadata/1.json' in bucket 'lake': AWS Error "
                "NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect to server"
            ),
            "object_store",
        ),
        (
            RuntimeError(
                "An error occurred while calling o93.append.\n: "
                "org.apache.iceberg.exceptions.RuntimeIOException\nCaused by: "
                "software.amazon.awssdk.core.exception.SdkClientException: "
                "Unable to execute HTTP request: Connection refused"
            ),
            "object_store",
        ),
        (
            RuntimeError(
                "An error occurred while calling o70.load.\n: "
                "org.apache.kafka.common.errors.TimeoutException: "
                "Timed out waiting for a node assignment. Call: describeTopics"
            ),
            "kafka",
        ),
        (
            RuntimeError(
                "An error occurred while calling o80.append.\n: "
                "org.apache.iceberg.jdbc.UncheckedSQLException: Failed to get table "
                "it.outage_lake.branch_icefall_stage_f2b2a10eaf3c_e1_6 from catalog outage"
            ),
            "catalog",
        ),
        (_raised_from(ValueError("wrapped"), KafkaUnavailableError("cannot reach Kafka at x")), "kafka"),
        (
            KubeAPIUnavailableError(
                "https://127.0.0.1:6443 (Lease ns/icefall-x-commit): HTTPSConnection(host='127.0.0.1', "
                "port=6443): Failed to establish a new connection: [Errno 111] Connection refused",
                None,
            ),
            "kube_apiserver",
        ),
        (
            _raised_from(
                ValueError("renewing"),
                KubeAPIUnavailableError("https://x (Lease ns/l): 504 Gateway Timeout: etcd timed out", 504),
            ),
            "kube_apiserver",
        ),
        (
            RuntimeError(
                "An error occurred while calling o123.append.\n: org.apache.spark.SparkException: Job aborted"
                "\nCaused by: java.io.IOException: No space left on device"
            ),
            "local_disk",
        ),
        (OSError(28, "No space left on device", "/spill/x"), "local_disk"),
        (RuntimeError(f"An error occurred while calling o412.append.\n: {EXECUTOR_LOST}"), "executors"),
    ],
)
def test_what_stopped_servers_raise_is_an_outage_of_that_service(error: BaseException, service: str) -> None:
    found = classify(error)
    assert found is not None and found.service.value == service
    assert "\n" not in found.reason and len(found.reason) <= 300
    assert not found.reason.startswith(":") and "Background on this error" not in found.reason


@pytest.mark.parametrize(
    "error",
    [
        KafkaCredentialsRefusedError("Kafka at x refused the credentials"),
        sqlalchemy.exc.OperationalError("SELECT 1", {}, sqlite3.OperationalError("no such table: iceberg")),
        ValueError("a bug"),
        OSError("No such file or directory: '/nope'"),
        LeaseAPIError("not allowed to update Lease ns/l: the service account needs get/update", 403),
    ],
)
def test_real_failures_are_not_outages(error: BaseException) -> None:
    assert classify(error) is None


def test_outages_log_one_line_per_attempt_count_once_and_clear(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    outages = Outages("it.unit_outage", {Service.KAFKA: "127.0.0.1:9 for topic 't'"}, clock=lambda: now[0])
    labels = ("it.unit_outage", "kafka")
    before = metrics.OUTAGES.labels(*labels)._value.get()
    error = KafkaUnavailableError(
        "cannot reach Kafka at 127.0.0.1:9 for topic 't': KafkaError{code=_TRANSPORT}"
    )
    with caplog.at_level(logging.WARNING, logger="icefall.ingest.outages"):
        delays = []
        for _ in range(3):
            delays.append(outages.failed(error))
            now[0] += 5
        assert metrics.UNAVAILABLE.labels(*labels)._value.get() == 1
        outages.succeeded()
    assert delays == [1, 2, 4]
    assert metrics.OUTAGES.labels(*labels)._value.get() == before + 1
    assert metrics.UNAVAILABLE.labels(*labels)._value.get() == 0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and all(r.exc_info is None for r in caplog.records)
    assert lines[0] == (
        "it.unit_outage: cannot reach Kafka at 127.0.0.1:9 for topic 't' (KafkaError{code=_TRANSPORT}); "
        "attempt 1 failed, retrying in 1s"
    )
    assert lines[3] == (
        "it.unit_outage: Kafka at 127.0.0.1:9 for topic 't' answers again after 15s (3 failed attempts); "
        "resuming"
    )
    assert outages.failed(ValueError("a bug")) is None


def test_log_failure_is_one_line_for_an_outage_and_a_traceback_for_a_bug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("icefall.test_outages")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        log_failure(
            logger, sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception(PG_REFUSED)), "%s: x", "t"
        )
        log_failure(logger, ValueError("a bug"), "%s: y", "t")
    outage, bug = caplog.records
    assert outage.exc_info is None and outage.getMessage().startswith("t: x: cannot reach the catalog (")
    assert bug.exc_info is not None and bug.getMessage() == "t: y"


REGISTRY = SchemaRegistry(url="http://127.0.0.1:9/apis/ccompat/v7")


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        # what the client raised with the real registry stopped (tests/integration/test_registry.py)
        (httpx2.ConnectError("[Errno 111] Connection refused"), True),
        (httpx2.ReadTimeout("timed out"), True),
        (httpx2.RemoteProtocolError("Server disconnected without sending a response."), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (SchemaRegistryError(503, 50301, "Service Unavailable"), True),
        (SchemaRegistryError(500, 50001, "Error in the backend data store"), True),
        (SchemaRegistryError(429, 42901, "Too Many Requests"), True),
        (SchemaRegistryError(401, 40101, "Unauthorized"), False),
        (SchemaRegistryError(403, 40301, "Forbidden"), False),
        (SchemaRegistryError(404, 40401, "Subject 'orders-value' not found."), False),
        (ValueError("a bug"), False),
    ],
)
def test_a_registry_that_cannot_answer_is_an_outage_and_one_that_refuses_is_not(
    error: Exception, outage: bool
) -> None:
    failure = registry_failure(REGISTRY, "schema id 3", error)
    assert isinstance(failure, RegistryError)
    assert isinstance(failure, RegistryUnavailableError) is outage
    found = classify(_raised_from(RuntimeError("the batch failed"), failure))
    if not outage:
        assert found is None
        return
    assert found is not None and found.service is Service.REGISTRY
    assert found.reason == f"schema id 3: {error}"


def test_a_registry_outage_is_logged_with_its_url_without_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from icefall.catalog import CatalogConfig

    url = "http://user:secret@registry:8081/apis/ccompat/v7"
    where = service_addresses("k:9092", "t", CatalogConfig.embedded(Path("/nowhere")), registry=url)
    assert where[Service.REGISTRY] == "http://registry:8081/apis/ccompat/v7"
    outages = Outages("it.unit_registry", where, clock=lambda: 0.0)
    failure = registry_failure(REGISTRY, "schema id 3", httpx2.ConnectError("[Errno 111] Connection refused"))
    with caplog.at_level(logging.WARNING, logger="icefall.ingest.outages"):
        assert outages.failed(failure) == 1
    assert caplog.records[0].getMessage() == (
        "it.unit_registry: cannot reach the schema registry at http://registry:8081/apis/ccompat/v7 "
        "(schema id 3: [Errno 111] Connection refused); attempt 1 failed, retrying in 1s"
    )
    assert metrics.UNAVAILABLE.labels("it.unit_registry", "registry")._value.get() == 1


def test_a_registry_down_when_ingestion_starts_is_waited_out_and_a_refusal_is_raised() -> None:
    from icefall.commands.run import made_when_reachable

    outages = Outages("it.unit_start", {}, initial_seconds=0.01, max_seconds=0.01)
    calls: list[int] = []

    def make() -> str:
        calls.append(1)
        if len(calls) < 3:  # the Ingestor asks the registry for an Avro table's columns when made
            down = httpx2.ConnectError("[Errno 111] Connection refused")
            raise registry_failure(REGISTRY, "the latest schema of subject 't-value'", down)
        return "ingestor"

    assert made_when_reachable(make, outages, lambda: False) == "ingestor"
    assert len(calls) == 3 and not outages.state.ongoing

    def refused() -> str:
        raise registry_failure(REGISTRY, "subject 't-value'", SchemaRegistryError(404, 40401, "not found"))

    with pytest.raises(RegistryError, match="not found"):
        made_when_reachable(refused, outages, lambda: False)

    def unreachable() -> str:
        raise registry_failure(REGISTRY, "schema id 1", httpx2.ConnectError("refused"))

    # stopped (SIGTERM) while the registry is down: nothing made
    assert made_when_reachable(unreachable, outages, lambda: outages.state.ongoing) is None


def test_the_listener_hears_which_service_is_waited_out_and_when_it_answers() -> None:
    heard: list[Service | None] = []
    outages = Outages("it.unit_listener", {}, clock=lambda: 0.0)
    outages.listener = heard.append
    outages.succeeded()  # no outage to end: nothing to say
    outages.failed(RegistryUnavailableError("schema registry http://r:8081: connection refused"))
    outages.failed(RuntimeError("a bug, not an outage"))  # raised by the caller, not heard
    outages.succeeded()
    assert heard == [Service.REGISTRY, None]


def test_a_full_local_disk_is_named_by_its_dirs(caplog: pytest.LogCaptureFixture) -> None:
    where = {Service.LOCAL_DISK: "/var/data/spark-local"}
    outages = Outages("it.t", where, clock=lambda: 0.0)
    with caplog.at_level(logging.WARNING):
        assert outages.failed(OSError(28, "No space left on device")) is not None
    (line,) = [r.getMessage() for r in caplog.records]
    assert "local disk /var/data/spark-local is full" in line and "\n" not in line


def test_executors_lost_to_a_partition_are_waited_out_and_said_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    outages = Outages("it.t", {}, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        assert outages.failed(RuntimeError(EXECUTOR_LOST)) == 1.0
        now[0] = 42.0
        outages.succeeded()
    lost, back = [r.getMessage() for r in caplog.records]
    assert "lost its Spark executors" in lost and "heartbeat timed out after 31170 ms" in lost
    assert "\n" not in lost and back.startswith("it.t: Spark's executors answer again after 42s")


def test_an_executor_that_died_of_its_own_is_not_an_outage() -> None:
    """Killed by the OOM killer four times in a row: the job's failure is raised, never waited out."""
    died = EXECUTOR_LOST.replace("Executor heartbeat timed out after 31170 ms", "exited with code 137")
    assert classify(RuntimeError(died)) is None


def test_a_clock_behind_the_table_is_waited_out_never_committed_through() -> None:
    from types import SimpleNamespace

    from icefall.commit import ClockBehindError
    from icefall.commit.pyiceberg_internals import CLOCK_TOLERANCE_MS, check_clock

    table = SimpleNamespace(metadata=SimpleNamespace(last_updated_ms=1_000_000))
    check_clock(table, now_ms=1_000_000 - CLOCK_TOLERANCE_MS)  # type: ignore[arg-type]  # within Iceberg's minute
    with pytest.raises(ClockBehindError, match="90s behind") as behind:
        check_clock(table, now_ms=1_000_000 - 90_000)  # type: ignore[arg-type]
    found = classify(behind.value)
    assert found is not None and found.service is Service.CLOCK
    assert Outages("it.t", {}).describe(found) == "this host's clock is behind the table"


def test_a_request_icefall_sends_to_a_store_that_does_not_answer_is_an_object_store_outage() -> None:
    """The Delta log's own requests (conditional create, the tail's listing) are not pyarrow's: a refused
    connection is still an object store outage, waited out, not a crash."""
    import socket

    from icefall.commit.errors import ObjectStoreUnreachableError
    from icefall.commit.object_storage import http_request

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(ObjectStoreUnreachableError) as raised:
        http_request("GET", f"http://127.0.0.1:{port}", "/lake?list-type=2", b"", headers={})
    assert f"GET http://127.0.0.1:{port}/lake: ConnectionRefusedError" in str(raised.value)
    found = classify(raised.value)
    assert found is not None and found.service.value == "object_store"
