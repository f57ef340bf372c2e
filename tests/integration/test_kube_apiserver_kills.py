"""kube-apiserver and etcd SIGKILLed and started again under Icefall's Leases, its driver and its operator.

Each test starts a PRIVATE kube-apiserver + etcd (they are killed; the session's `kube` serves other tests),
kills one of the two with SIGKILL (no graceful shutdown) and starts it again on the same port with its data.

Proves:
- a commit Lease held across the outage is never held twice: while the server is down the holder cannot
  renew (`KubeAPIUnavailableError`, naming the server: an outage, not a lost lease) and a contender cannot
  take it; after the restart exactly one of them holds it (the holder renewing first keeps it while it
  renews; a holder paused through the restart loses it to the contender), a contender takes it only once
  the holder's own hold has run out by the holder's clock, at a higher epoch, and the old holder's next
  renewal is refused (LeaseLostError: fenced) — kube-apiserver killed (connection refused), and etcd
  killed behind a running kube-apiserver (requests time out);
- (`long`) a driver (`icefall ingest`, as the pod runs it, its commit Lease in the private API server, its
  status reported there) and the operator (`icefall operator`, writing the table's status) while records
  arrive: kube-apiserver killed, then etcd killed. While the server is down the driver commits nothing (no
  commit without renewing the Lease) and logs one line per attempt naming the Kubernetes API server, no
  traceback; once it is back the driver resumes by itself and catches up, the operator writes the table's
  status again from the driver's new reports, and the table holds every record exactly once, record by
  record and by `icefall verify` (the auditor, by content). The time from the restart to caught up is
  printed (`-s`).

- an operator replica waiting as a follower for the leader Lease while kube-apiserver is killed logs the
  outage and keeps waiting (it used to exit 1, seen in `make chaos`), and becomes the leader once the
  server is back and the leader's Lease has run out.

Not proven here: an outage of the operator's leader Lease (`controller.leader` exits and restarts as a
follower after its lease runs out: tests/integration/test_operator.py's leader tests); a partition where
the API server is up but unreachable from one process only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from icefall.api import load_manifest, streaming_table_from_object
from icefall.catalog import CatalogConfig
from icefall.commit import read_committed
from icefall.commit.kube_lease import KubeAPIUnavailableError, KubernetesLease
from icefall.commit.lease import LeaseLostError
from icefall.controller.leader import EXIT_LEADERSHIP_LOST, LeaderElection
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.kube import KubeAPIServer, install_crds
from icefall.devstack.procs import free_port
from icefall.plan.names import table_leases
from icefall.testing.streams import NAMESPACE, assert_exactly_once, manifest_text, produce, watermarks

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
K8S_NAMESPACE = "apiserver-kills"
CLI = [sys.executable, "-m", "icefall.cli"]
OUTAGE_LINE = "cannot reach the Kubernetes API server"


def poll(what: str, check: Callable[[], object], timeout: float, details: Callable[[], str] = str) -> None:
    """Until `check()` is truthy (an exception counts as not yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # a server down on purpose, a table not made yet
            pass
        time.sleep(0.2)
    raise AssertionError(f"not {what} after {timeout:.0f}s\n{details()}")


@pytest.fixture
def private_kube(tmp_path: Path) -> Iterator[KubeAPIServer]:
    kube = KubeAPIServer(tmp_path / "kube").start()
    try:
        yield kube
    finally:
        kube.stop()


def kill(kube: KubeAPIServer, which: str) -> Callable[[], None]:
    """Kill `which` ("kube-apiserver" or "etcd"); returns how to start it again."""
    if which == "kube-apiserver":
        kube.kill_apiserver()
        return kube.restart_apiserver
    kube.kill_etcd()
    return kube.restart_etcd


@pytest.mark.parametrize(("which", "holder_first"), [("kube-apiserver", True), ("etcd", False)])
def test_a_lease_held_across_a_restart_is_never_held_twice(
    private_kube: KubeAPIServer, which: str, holder_first: bool
) -> None:
    """`holder_first`: the holder tries to renew as soon as the server is back (it races the contender: either
    may win, never both); else it is paused until the contender took the lease over (then it is fenced)."""
    api = config.new_client_from_config(config_file=str(private_kube.kubeconfig))
    settings: dict[str, Any] = {"duration_seconds": 2, "poll_seconds": 0.1, "request_timeout": 2}
    a = KubernetesLease(api, "default", "commit", "writer-a", create_missing=True, **settings)
    b = KubernetesLease(api, "default", "commit", "writer-b", **settings)
    epoch = a.acquire(timeout=10)
    taken: list[tuple[int, float]] = []  # B's epoch, and when B's acquire returned (monotonic)
    unavailable: list[str] = []
    stop = threading.Event()

    def contend() -> None:  # B waits for the lease as a driver does: an outage is retried, same object
        while not stop.is_set():
            try:
                got = b.acquire(timeout=0.5)
            except KubeAPIUnavailableError as error:
                unavailable.append(str(error))
                time.sleep(0.2)
                continue
            except Exception:  # LeaseTimeoutError: still held
                continue
            taken.append((got, time.monotonic()))
            return

    contender = threading.Thread(target=contend, name="writer-b")
    contender.start()
    try:
        a.renew()
        restart = kill(private_kube, which)
        down_since = time.monotonic()
        with pytest.raises(
            KubeAPIUnavailableError, match=r"https://127\.0\.0\.1:\d+ \(Lease default/commit\)"
        ):
            a.renew()
        poll("the contender meeting the outage", lambda: unavailable, 30)
        assert not taken, "the lease was taken while the API server was down"
        time.sleep(max(0.0, 3 - (time.monotonic() - down_since)))  # longer than the lease lasts
        assert not a.is_held  # by A's own clock: its hold ran out
        restart()
        a_expires: list[float] = []
        a_lost = False
        if not holder_first:  # A stays silent (paused) until B, which sees an old record, takes the lease
            poll("the contender taking the lease once the server is back", lambda: taken, 60)
        # A keeps trying to renew (and B to acquire): whoever writes first wins, never both.
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and not a_lost:
            try:
                a.renew()
                assert a.expires_at is not None
                a_expires.append(a.expires_at)
            except LeaseLostError:
                a_lost = True
            except KubeAPIUnavailableError:
                pass  # etcd behind a running kube-apiserver may take a moment longer
            time.sleep(0.3)
        poll("the contender taking the lease after A stopped renewing", lambda: taken, 30)
    finally:
        stop.set()
        contender.join(30)
    (b_epoch, b_at) = taken[0]
    print(
        f"{which} down: {unavailable[0]}; A renewed {len(a_expires)} times after the restart, lost: {a_lost}"
    )
    if not holder_first:  # paused through B's takeover: A's first renewal is refused
        assert a_lost and not a_expires
    # Holder first: whoever writes first after the restart wins (A's hold ran out while the server was
    # down, so B may; on a loaded machine it did). Either way never both: B only after A's last hold.
    assert a_lost or a_expires
    assert b_epoch == epoch + 1
    assert all(b_at >= expiry for expiry in a_expires), "B held the lease while A's renewed hold still ran"
    with pytest.raises(LeaseLostError):
        a.renew()  # fenced: the old holder learns it at its next renewal
    current = a.current()
    assert current is not None and (current.holder, current.epoch) == ("writer-b", epoch + 1)


def test_a_follower_waits_out_an_apiserver_kill(private_kube: KubeAPIServer) -> None:
    api = config.new_client_from_config(config_file=str(private_kube.kubeconfig))
    first = LeaderElection(api, "default", name="leader", holder="first", duration_seconds=2)
    assert first.acquire() == 1  # never renewed: it runs out while the server is down
    follower = LeaderElection(api, "default", name="leader", holder="second", duration_seconds=2)
    got: list[int] = []
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            got.append(follower.acquire())
        except BaseException as error:  # the assertion below names it
            failed.append(error)

    waiting = threading.Thread(target=wait, name="follower", daemon=True)
    waiting.start()
    try:
        time.sleep(0.5)
        private_kube.kill_apiserver()
        time.sleep(5)  # more than two tries against a dead server
        assert not failed, failed
        assert not got
    finally:
        private_kube.restart_apiserver()
    waiting.join(60)
    assert not failed, failed
    assert got == [2]


# --- the driver and the operator ----------------------------------------------------------------------


class Process:
    """A `python -m icefall.cli ...` subprocess with its output in `log`; `stop()` in a `finally`."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*CLI, *argv], stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self) -> str:
        return self.text()[-4000:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Restarted(Process):
    """A process started again whenever it exits, as its Deployment's pod would be; `exits` holds the exit
    codes seen. `stop()` stops watching first."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.argv, self.env = argv, env
        super().__init__(argv, log, env)
        self.exits: list[int] = []
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._restart, name="restarted", daemon=True)
        self._watch.start()

    def _restart(self) -> None:
        while not self._stop.wait(0.2):
            code = self.proc.poll()
            if code is not None and not self._stop.is_set():
                self.exits.append(code)
                super().__init__(self.argv, self.log, self.env)

    def stop(self) -> None:
        self._stop.set()
        self._watch.join(10)
        super().stop()


def status_of(custom: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(
        "icefall.dev", "v1alpha1", K8S_NAMESPACE, "streamingtables", name
    )
    found: dict[str, Any] = obj.get("status") or {}
    return found


def caught_up_in_status(custom: client.CustomObjectsApi, name: str) -> bool:
    """The driver reported lag 0 and no service waited out, and the operator wrote status from it."""
    status = status_of(custom, name)
    writer = status.get("writer") or {}
    operator_says = (status.get("freshness") or {}).get("lagRecords")
    return operator_says == 0 and writer.get("lagRecords") == 0 and "waitingFor" not in writer


def mark_running(core: client.CoreV1Api, pod: str) -> None:
    """What a kubelet would report once the driver container started (no kubelet here)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    running = {"name": "driver", "image": "icefall:test", "imageID": "", "ready": True, "restartCount": 0,
               "state": {"running": {"startedAt": now}}}  # fmt: skip
    core.patch_namespaced_pod_status(
        pod, K8S_NAMESPACE, {"status": {"phase": "Running", "containerStatuses": [running]}}
    )


@pytest.mark.long  # `make test-all` (about 2 minutes: a driver's Spark, the operator, two outages)
def test_a_driver_and_the_operator_ride_out_apiserver_and_etcd_kills(
    private_kube: KubeAPIServer, kafka: KafkaBroker, tmp_path: Path
) -> None:
    install_crds(private_kube, REPO / "crds", K8S_NAMESPACE)
    api = config.new_client_from_config(config_file=str(private_kube.kubeconfig))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    name, topic = "kube_kill", "it-kube-kill"
    kafka.create_topic(topic, partitions=2)
    block = {"name": "icefall", "type": "sql", "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
             "warehouse": (tmp_path / "warehouse").as_uri()}  # fmt: skip
    manifest = tmp_path / "table.yaml"
    text = manifest_text(name, topic, kafka.bootstrap, catalog=block, batch={"maxRecords": 100})
    manifest.write_text(text)
    body = yaml.safe_load(text)
    body["metadata"]["namespace"] = K8S_NAMESPACE
    st = streaming_table_from_object(body)
    k8s_name = body["metadata"]["name"]
    env = {"KUBECONFIG": str(private_kube.kubeconfig), "PYTHONPATH": str(REPO / "operator" / "src")}
    operator = Restarted(
        ["operator", "--namespace", K8S_NAMESPACE, f"--metrics-port={free_port()}",
         f"--liveness=http://127.0.0.1:{free_port()}/healthz"],
        tmp_path / "operator.log",
        {**env, "ICEFALL_RESYNC_SECONDS": "1", "ICEFALL_STATUS_SECONDS": "1",
         "ICEFALL_IMAGE": "icefall:test"},
    )  # fmt: skip
    driver: Process | None = None
    catalog = CatalogConfig.for_table(load_manifest(manifest).spec, environ={})

    def committed() -> dict[int, int]:
        return dict(read_committed(catalog.pyiceberg().load_table((NAMESPACE, name))).offsets)

    def logs() -> str:
        said = f"--- operator:\n{operator.tail()}"
        return said + (f"\n--- driver:\n{driver.tail()}" if driver is not None else "")

    try:
        custom.create_namespaced_custom_object(
            "icefall.dev", "v1alpha1", K8S_NAMESPACE, "streamingtables", body
        )
        commit_lease = table_leases(st).commit
        coordination = client.CoordinationV1Api(api)
        poll("the operator's commit Lease and driver Pod",
             lambda: coordination.read_namespaced_lease(commit_lease, K8S_NAMESPACE)
             and core.read_namespaced_pod(f"{k8s_name}-ingest", K8S_NAMESPACE), 90, logs)  # fmt: skip
        mark_running(core, f"{k8s_name}-ingest")
        produce(kafka, topic, 0, 300)
        driver = Process(
            ["ingest", "--namespace", K8S_NAMESPACE, "--name", k8s_name,
             "--state-dir", str(tmp_path / "state")],
            tmp_path / "driver.log",
            {**env, "ICEFALL_POD_NAME": f"{k8s_name}-ingest",
             "ICEFALL_SPARK_CONF": json.dumps({"spark.master": "local[1]"})},
        )  # fmt: skip
        poll("committing", lambda: sum(committed().values()) > 0, 300, logs)
        produced = 300
        recovered: dict[str, float] = {}
        for which in ("kube-apiserver", "etcd"):
            restart = kill(private_kube, which)
            produce(kafka, topic, produced, 100)
            produced += 100
            seen = driver.text().count(OUTAGE_LINE)
            poll(f"the driver meeting the {which} outage",
                 lambda seen=seen: driver.text().count(OUTAGE_LINE) > seen, 60, logs)  # fmt: skip
            time.sleep(1)  # a commit checked before the kill may still be landing
            held = committed()
            time.sleep(5)
            assert committed() == held, f"a commit landed while {which} was down"
            assert driver.alive(), logs()
            restart()
            back = time.monotonic()
            poll(f"caught up after the {which} restart",
                 lambda: committed() == watermarks(kafka, topic), 180, logs)  # fmt: skip
            recovered[which] = time.monotonic() - back
            # The operator writes status again from the driver's reports: lag 0, reported after the restart.
            poll(f"the operator's status after the {which} restart",
                 lambda: caught_up_in_status(custom, k8s_name), 60, logs)  # fmt: skip
        print(f"recovered (restart to caught up): {recovered}; operator exits: {operator.exits}")
        # The operator's only way out of an outage longer than its leader Lease: exit, be restarted as a
        # follower (`controller.leader`), and lead again.
        assert set(operator.exits) <= {EXIT_LEADERSHIP_LOST}, logs()
        driver.stop()
        text = driver.text()
        assert "Traceback" not in text, driver.tail()
        assert "answers again" in text, driver.tail()
        outage_lines = [line for line in text.splitlines() if OUTAGE_LINE in line]
        assert all(len(line) < 600 for line in outage_lines), outage_lines
    finally:
        for process in (driver, operator):
            if process is not None:
                process.stop()
    high = watermarks(kafka, topic)
    assert sum(high.values()) == produced
    assert_exactly_once(catalog, name, high, set())
    verify = subprocess.run(
        [*CLI, "verify", "-f", str(manifest), "--state-dir", str(tmp_path / "verify")],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
    assert "by content: OK" in verify.stdout, verify.stdout
