"""The chaos run's measured faults: one at a time while the random kills pause, spread over the run.

The Kafka broker leading partition 0 stopped cleanly and started again mid-batch (same ports, same data);
the REST catalog down `OUTAGE_SECONDS`; the object store down `OUTAGE_SECONDS`; the driver paused (SIGSTOP to
every process of its container) past its commit Lease while a second writer (a Pod with the driver Pod's
spec under another name) takes the Lease and commits, then resumed (SIGCONT): it must be fenced (its log
says so). The paused driver is one that drew no failpoint (an armed one could exit at its point before its
commit is refused): an armed driver is SIGKILLed first, a kill like any other. Each is a function of the
run (`Chaos`) and its `Fault`, whose time to converge the run measures from the fault's end.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubernetes.client.exceptions import ApiException

from .chaos_pods import (
    DRAW_UNKNOWN_AFTER,
    DRIVER,
    NOTHING,
    SECOND_WRITER,
    Container,
    container_processes,
    second_writer_pod,
    signal_all,
    stop_all,
)
from .conftest import pod_logs, wait_for

if TYPE_CHECKING:
    from .chaos_run import Chaos

OUTAGE_SECONDS = 30.0


@dataclass
class Fault:
    name: str
    started: float
    ended: float = 0.0
    converged_after: float | None = None
    note: str = ""


def broker_restart(self: Chaos, fault: Fault) -> None:
    node = self.kafka.leader_of(self.topics[0], 0)
    self.kafka.node(node).stop()
    time.sleep(5)
    self.kafka.heal(self.topics)
    fault.note = f"node {node} (leader of partition 0) stopped cleanly, 5 s down, restarted, in sync again"


def catalog_outage(self: Chaos, fault: Fault) -> None:
    self.catalog_server.stop()
    time.sleep(OUTAGE_SECONDS)
    self.catalog_server.start()
    fault.note = f"REST catalog server down {OUTAGE_SECONDS:.0f} s (plus its restart)"


def store_outage(self: Chaos, fault: Fault) -> None:
    self.store.stop()
    time.sleep(OUTAGE_SECONDS)
    self.store.start()
    fault.note = f"object store down {OUTAGE_SECONDS:.0f} s (plus its restart)"


def unarmed_driver(self: Chaos) -> Container:
    """A committing driver that drew no failpoint (an armed one could exit at its point once resumed,
    before its commit is refused): an armed one is SIGKILLed (a kill like any other) until one is."""
    for _ in range(20):
        driver = self.wait_driver_committing()
        drew = wait_for("the driver's draw in its log", lambda d=driver: self.pods.read_draw(d),
                        timeout=DRAW_UNKNOWN_AFTER, every=1, details=self.explain)  # fmt: skip
        running = self.is_running(driver)
        if drew == NOTHING and running:
            return driver
        if running:
            self.note(f"paused writer: the driver drew {drew}; SIGKILL, for a fresh draw")
            self.sigkill(driver)
        wait_for("the driver to end", lambda d=driver: not self.is_running(d),
                 timeout=120, every=1)  # fmt: skip
    raise AssertionError("20 driver starts in a row were armed")


def paused_writer(self: Chaos, fault: Fault) -> None:
    """SIGSTOP the driver's container past its Lease; a second writer Pod takes over, commits; SIGCONT."""
    driver = unarmed_driver(self)
    fault.started = time.monotonic()
    pod = self.pods.pod(driver.pod)
    init = self.cluster.node.container_pid(driver.cid)
    assert pod is not None and init is not None, f"the driver {driver.cid} is gone"
    log = self.workdir / f"paused-driver-{driver.cid[:12]}.log"
    following = self.kubectl.following_logs(self.namespace, DRIVER, log)
    stopped: list[int] = []
    second = f"/api/v1/namespaces/{self.namespace}/pods/{SECOND_WRITER}"
    try:
        time.sleep(2)  # `kubectl logs -f` attached to this container
        stopped = stop_all(init)
        paused = time.monotonic()
        before = sum(self.committed().values())
        self.rest.call("POST", f"/api/v1/namespaces/{self.namespace}/pods", second_writer_pod(pod))
        wait_for(
            "the second writer to commit",
            lambda: sum(self.committed().values()) > before,
            timeout=600, every=1, details=lambda: pod_logs(self.node, SECOND_WRITER),
        )  # fmt: skip
        time.sleep(max(0.0, 20 - (time.monotonic() - paused)))  # well past the 15 s Lease either way
        signal_all(stopped + container_processes(init), signal.SIGCONT)
        stopped = []
        resumed = time.monotonic()
        fenced = wait_for(
            "the paused writer to stop once resumed",
            lambda: next((c for c in self.pods.ended if c.cid == driver.cid), None),
            timeout=300, every=1, details=self.explain,
        )  # fmt: skip
        with contextlib.suppress(subprocess.TimeoutExpired):
            following.wait(60)  # it ends with the container
    finally:
        signal_all(stopped, signal.SIGCONT)
        following.kill()
        with contextlib.suppress(ApiException):
            self.rest.call("DELETE", second)
    wait_for("the second writer pod gone", lambda: self.rest.get(second) is None, timeout=180, every=1)
    output = log.read_text(errors="replace")
    said = "newer writer took over" in output or "lost the commit lease" in output
    fault.note = (
        f"paused {resumed - paused:.0f} s; second writer (a Pod) committed; the resumed writer exited "
        f"{fenced.exit_code} {'fenced (its log says so)' if said else 'WITHOUT saying it was fenced'}"
    )
    if not said:
        self.errors.append(f"paused writer not fenced: exit {fenced.exit_code}\n{output[-3000:]}")


FAULTS: tuple[tuple[str, Callable[[Chaos, Fault], None]], ...] = (
    ("Kafka broker restart mid-batch", broker_restart),
    ("catalog outage (30 s)", catalog_outage),
    ("object-store outage (30 s)", store_outage),
    ("writer paused past its lease", paused_writer),
)
