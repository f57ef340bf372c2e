"""Leader election across operator replicas: one coordination.k8s.io Lease, held for the process's life.

The controller-runtime pattern: `icefall operator` acquires the Lease (`icefall-operator-leader`,
`icefall.plan.names.LEADER_LEASE_NAME`, in the operator's namespace by default) before kopf starts, so a
follower never reconciles, never writes annotations or status, never creates pods. A background thread
renews it every third of its duration. If the Lease is taken over (another replica saw it expire: this one
was paused or cut off) or cannot be renewed before it runs out, the process logs why and exits with
`EXIT_LEADERSHIP_LOST`; Kubernetes restarts it, and it waits as a follower. On a clean stop the Lease is
released, so a follower takes over at once instead of after the lease duration.

While waiting, a follower answers its liveness endpoint itself (`StandbyHealth`), so Kubernetes does not
kill it for being a follower; kopf takes the port over once leadership is acquired. A replica that cannot
reach the API server (`KubeAPIUnavailableError`: down, restarting, 429/5xx) while it waits for the Lease
waits that out too, with one log line per attempt, instead of exiting 1 (a restart would find it down).

The rules and the acquire/renew loop are `commit.kube_lease.KubernetesLease` (with `plan.leases.decide`),
the same as the tables' commit Leases. Guarantees: two processes never both pass `acquire` for an
unexpired Lease (every write is a compare-and-swap on resourceVersion). Not guaranteed: a leader paused
longer than the lease (a stopped VM) may run for a moment after a take-over before its renewal fails; all
the operator's writes are idempotent (server-side apply, a fixed driver Pod name, uid preconditions), so
the overlap costs duplicate work, not damage.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

from kubernetes.client import ApiClient

from icefall.commit.kube_lease import KubeAPIUnavailableError, KubernetesLease
from icefall.commit.lease import LeaseLostError, LeaseTimeoutError
from icefall.controller import metrics
from icefall.plan.env import ENV_POD_NAME
from icefall.plan.names import LEADER_LEASE_NAME

log = logging.getLogger(__name__)

EXIT_LEADERSHIP_LOST = 3
#: Seconds between two tries of a replica that cannot reach the API server while it waits for the Lease.
UNAVAILABLE_RETRY_SECONDS = 2.0


def identity() -> str:
    """This process's holder identity: the pod name (or host) plus a random suffix, unique per process."""
    base = os.environ.get(ENV_POD_NAME) or socket.gethostname()
    return f"{base}-{secrets.token_hex(4)}"


def _exit_lost(reason: str) -> None:
    log.critical("leader election: lost the leader Lease (%s); exiting so that Kubernetes restarts "
                 "this replica as a follower", reason)  # fmt: skip
    logging.shutdown()
    os._exit(EXIT_LEADERSHIP_LOST)


class LeaderElection:
    """Acquire, keep and release the operator's leader Lease (see the module doc)."""

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        *,
        name: str = LEADER_LEASE_NAME,
        holder: str | None = None,
        duration_seconds: int = 15,
        on_lost: Callable[[str], None] = _exit_lost,
    ) -> None:
        # The operator creates its own leader Lease (the chart grants it `create`); tables' pods never do.
        self.lease = KubernetesLease(
            api, namespace, name, holder or identity(), duration_seconds=duration_seconds, poll_seconds=1,
            create_missing=True,
        )  # fmt: skip
        self._duration = duration_seconds
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, *, sleep: Callable[[float], None] = time.sleep) -> int:
        """Wait until this replica holds the Lease (its epoch), through API server outages."""
        while True:
            try:
                epoch = self._acquire()
            except KubeAPIUnavailableError as error:
                log.warning("leader election: %s; trying again in %.0f s", error, UNAVAILABLE_RETRY_SECONDS)
                sleep(UNAVAILABLE_RETRY_SECONDS)
                continue
            log.info("leader election: %s is the leader (Lease %s/%s, epoch %d)",
                     self.lease.holder, self.lease.namespace, self.lease.name, epoch)  # fmt: skip
            metrics.LEADER.set(1)
            return epoch

    def _acquire(self) -> int:
        # One try first, so that a replica that lost the race says it waits (a read before the try would
        # miss a Lease another replica creates a moment later, and the follower would wait silently).
        try:
            return self.lease.acquire(timeout=0)
        except LeaseTimeoutError:
            current = self.lease.current()
            log.info("leader election: %s/%s is held by %s; waiting as a follower",
                     self.lease.namespace, self.lease.name, current.holder if current else None)  # fmt: skip
            return self.lease.acquire(timeout=None)

    def start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="icefall-leader", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._duration / 3):
            try:
                self.lease.renew()
            except LeaseLostError as error:
                metrics.LEADER.set(0)
                self._on_lost(str(error))
                return
            except Exception as error:  # a flaky API server: retry until the lease would run out
                expires = self.lease.expires_at
                if expires is None or time.monotonic() >= expires:
                    metrics.LEADER.set(0)
                    self._on_lost(f"could not renew it before it expired: {type(error).__name__}: {error}")
                    return
                log.warning("leader election: renewing failed (%s); retrying", error)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.lease.release()
        except Exception as error:  # the follower then waits for expiry instead
            log.warning("leader election: releasing the Lease failed: %s", error)
        metrics.LEADER.set(0)


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"follower: waiting for the leader Lease\n")

    def log_message(self, format: str, *args: object) -> None:  # probes every few seconds: no access log
        pass


class StandbyHealth:
    """Answers 200 on the liveness URL while this process waits to become the leader."""

    def __init__(self, url: str | None) -> None:
        self._server: ThreadingHTTPServer | None = None
        if url:
            parsed = urlparse(url)
            self._server = ThreadingHTTPServer((parsed.hostname or "0.0.0.0", parsed.port or 80), _Healthy)
            threading.Thread(
                target=self._server.serve_forever, name="icefall-standby-health", daemon=True
            ).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
