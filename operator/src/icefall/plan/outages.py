"""Outages of the services ingestion depends on: which one, and how long to wait before trying again.

Pure: the clock is an argument. `retry_delay` is a capped exponential backoff (1 s, 2 s, 4 s, ... up to
30 s by default) over consecutive failed attempts; `OutageClock` follows one outage (its start, the
attempts, the service that failed last) so the caller can log it once per attempt, count it once per
outage and say how long it lasted when the service answers again.

Not decided here: which errors mean "unavailable" (that needs the clients' exception types:
`icefall.ingest.outages.classify`), or what is retried (the ingestion loop re-plans from the table, so a retry
can never commit a batch twice).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

DEFAULT_INITIAL_SECONDS = 1.0
DEFAULT_MAX_SECONDS = 30.0


class Service(StrEnum):
    """A service ingestion cannot work without; the value is the `service` label of the outage metrics."""

    KAFKA = "kafka"
    CATALOG = "catalog"
    OBJECT_STORE = "object_store"
    REGISTRY = "registry"  # the schema registry of spec.format.registry
    # The Kubernetes API server a driver keeps its commit Lease in (and etcd behind it): no commit without
    # renewing the Lease, so its outage pauses ingestion like the others.
    KUBE_APISERVER = "kube_apiserver"
    CLOCK = "clock"  # this host's clock is behind the table's last update: it waits until it passes
    LOCAL_DISK = "local_disk"  # the driver's local disk (Spark's local dirs) is full: it waits for space
    # Spark's executors stopped answering the driver (no heartbeat within spark.network.timeout: a network
    # partition between them, or a stalled executor host): a job that lost them is read again.
    EXECUTORS = "executors"

    @property
    def display_name(self) -> str:
        return {
            "kafka": "Kafka",
            "catalog": "the catalog",
            "object_store": "the object store",
            "registry": "the schema registry",
            "kube_apiserver": "the Kubernetes API server",
            "local_disk": "the local disk",
            "executors": "Spark's executors",
            "clock": "this host's clock",
        }[self.value]


def retry_delay(
    failures: int,
    *,
    initial_seconds: float = DEFAULT_INITIAL_SECONDS,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    factor: float = 2.0,
) -> float:
    """Seconds to wait after the `failures`-th consecutive failed attempt (1 for the first):
    `initial * factor**(failures-1)`, never more than `max_seconds`; 0 when nothing failed."""
    if failures <= 0:
        return 0.0
    if initial_seconds <= 0 or factor < 1 or max_seconds < initial_seconds:
        raise ValueError("need initial_seconds > 0, factor >= 1 and max_seconds >= initial_seconds")
    # Exponent capped before it can overflow a float: past the cap the answer is the cap anyway.
    exponent = min(failures - 1, 1024)
    try:
        delay = initial_seconds * factor**exponent
    except OverflowError:
        return max_seconds
    return min(delay, max_seconds)


@dataclass(frozen=True)
class OutageClock:
    """One outage as it goes on: `started_at` is when the first attempt failed (a monotonic time), `failures`
    the consecutive failed attempts, `service` the one that failed last. `OutageClock()` is "no outage"."""

    started_at: float | None = None
    failures: int = 0
    service: Service | None = None

    @property
    def ongoing(self) -> bool:
        return self.failures > 0

    def failed(self, service: Service, now: float) -> OutageClock:
        """The clock after one more failed attempt at `now`."""
        started = self.started_at if self.ongoing and self.started_at is not None else now
        return replace(self, started_at=started, failures=self.failures + 1, service=service)

    def next_delay(
        self, *, initial_seconds: float = DEFAULT_INITIAL_SECONDS, max_seconds: float = DEFAULT_MAX_SECONDS
    ) -> float:
        return retry_delay(self.failures, initial_seconds=initial_seconds, max_seconds=max_seconds)

    def lasted(self, now: float) -> float:
        """Seconds since the outage began (0 when there is none)."""
        return 0.0 if self.started_at is None else max(now - self.started_at, 0.0)
