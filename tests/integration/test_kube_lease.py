"""The Kubernetes lease backend follows the same rules as the file backend, against a real API server.

Proves, with `KubernetesLease` on the `kube` fixture's kube-apiserver + etcd (`create_missing=True` as
the operator's leader Lease does, unless a test says otherwise):
- acquiring creates a labelled coordination.k8s.io/v1 Lease with epoch (leaseTransitions) 1; renewing moves
  renewTime and keeps the epoch; releasing empties holderIdentity, and another holder then acquires at once;
- a second holder waits while the lease is held, takes it over after expiry with the next epoch, and the
  first holder's renew then raises LeaseLostError (with a fake clock, and once with the real clock);
- every write is conditional on the version read: a contender whose create or replace loses to another
  write re-reads and waits instead of overwriting; of many concurrent contenders exactly one wins, both for
  a missing Lease (create) and for a released one (replace);
- a Lease written by someone else keeps its labels and its transition count;
- expiry is judged by each process's own clock: two writers whose wall clocks (the renewTime they write)
  are 400 s apart never take a renewed Lease from each other and take a dead one one duration after its
  last change; a Lease someone wrote with a holder, a renewTime years ahead and a huge
  leaseDurationSeconds is taken one duration after it was first seen, and rewritten with Icefall's
  duration;
- without `create_missing` (every table's pod) a missing Lease is waited for, never created, with a
  LeaseTimeoutError that says the operator creates it;
- a user without RBAC grants gets a LeaseAPIError that names the permissions it needs.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from icefall.commit.kube_lease import KubernetesLease, LeaseAPIError
from icefall.commit.lease import Lease, LeaseLostError, LeaseTimeoutError
from icefall.devstack.kube import KubeAPIServer
from icefall.plan.leases import LeaseRecord

pytestmark = pytest.mark.integration

NAMESPACE = "default"
DURATION = 10
# A whole second on purpose: the API server refuses MicroTime without six fraction digits, which is what
# the Kubernetes client's own models send at whole seconds.
T0 = 1_700_000_000.0


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture(scope="module")
def api(kube: KubeAPIServer) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kube.kubeconfig))


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A Lease name of its own for every test."""
    return "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:55]


def stored(api: client.ApiClient, name: str) -> client.V1Lease:
    return client.CoordinationV1Api(api).read_namespaced_lease(name, NAMESPACE)


def lease(api: client.ApiClient, name: str, holder: str, clock: FakeClock, **kw: Any) -> KubernetesLease:
    settings: dict[str, Any] = {"create_missing": True, "wall_clock": clock, **kw}
    return KubernetesLease(
        api, NAMESPACE, name, holder, duration_seconds=DURATION, clock=clock, sleep=clock.sleep, **settings
    )


def test_acquire_creates_the_lease_renew_keeps_the_epoch_release_empties_it(
    api: client.ApiClient, name: str
) -> None:
    clock = FakeClock()
    a = lease(api, name, "writer-a", clock)
    assert isinstance(a, Lease)
    assert a.current() is None and not a.is_held

    assert a.acquire(timeout=0) == 1
    assert a.is_held and a.epoch == 1 and a.expires_at == T0 + DURATION
    obj = stored(api, name)
    assert obj.metadata.labels == {"app.kubernetes.io/managed-by": "icefall"}
    assert obj.spec.holder_identity == "writer-a"
    assert obj.spec.lease_transitions == 1
    assert obj.spec.lease_duration_seconds == DURATION
    assert obj.spec.acquire_time == obj.spec.renew_time == datetime.fromtimestamp(T0, UTC)
    assert a.current() == LeaseRecord("writer-a", 1, T0, T0, DURATION)

    clock.now += 4.25
    a.renew()
    assert a.epoch == 1 and a.expires_at == clock.now + DURATION
    obj = stored(api, name)
    assert obj.spec.lease_transitions == 1
    assert obj.spec.acquire_time == datetime.fromtimestamp(T0, UTC)
    assert obj.spec.renew_time == datetime.fromtimestamp(T0 + 4.25, UTC)
    assert a.acquire(timeout=0) == 1  # acquiring what you hold renews it

    a.release()
    a.release()  # idempotent
    assert a.epoch is None and not a.is_held
    assert stored(api, name).spec.holder_identity in ("", None)
    record = a.current()
    assert record is not None and (record.holder, record.epoch) == (None, 1)


def test_another_holder_waits_then_takes_over_after_expiry(api: client.ApiClient, name: str) -> None:
    clock = FakeClock()
    a, b = lease(api, name, "writer-a", clock), lease(api, name, "writer-b", clock)
    assert a.acquire() == 1

    with pytest.raises(LeaseTimeoutError, match="held by 'writer-a'"):
        b.acquire(timeout=0)
    with pytest.raises(LeaseTimeoutError):
        b.acquire(timeout=3.5)
    assert clock.now == pytest.approx(T0 + 3.5)

    assert b.acquire(timeout=30) == 2  # a stalled: b waits out the rest of a's lease, polling
    assert clock.now == pytest.approx(T0 + DURATION)
    assert max(clock.slept) <= 1.0
    obj = stored(api, name)
    assert (obj.spec.holder_identity, obj.spec.lease_transitions) == ("writer-b", 2)

    assert not a.is_held
    with pytest.raises(LeaseLostError, match="held by 'writer-b'"):
        a.renew()
    assert a.epoch is None
    a.release()  # a lost lease is left alone
    assert stored(api, name).spec.holder_identity == "writer-b"


def test_take_over_with_the_real_clock(api: client.ApiClient, name: str) -> None:
    a = KubernetesLease(
        api, NAMESPACE, name, "writer-a", duration_seconds=1, poll_seconds=0.1, create_missing=True
    )
    b = KubernetesLease(api, NAMESPACE, name, "writer-b", duration_seconds=1, poll_seconds=0.1)
    assert a.acquire(timeout=0) == 1
    with pytest.raises(LeaseTimeoutError):
        b.acquire(timeout=0)
    assert b.acquire(timeout=10) == 2
    with pytest.raises(LeaseLostError):
        a.renew()


def test_release_lets_another_holder_acquire_at_once(api: client.ApiClient, name: str) -> None:
    clock = FakeClock()
    a, b = lease(api, name, "writer-a", clock), lease(api, name, "writer-b", clock)
    assert a.acquire(timeout=0) == 1
    a.release()
    assert b.acquire(timeout=0) == 2  # no waiting for expiry, and still a change of holder
    assert clock.slept == []
    restarted_a = lease(api, name, "writer-a", clock)
    with pytest.raises(LeaseTimeoutError):
        restarted_a.acquire(timeout=0)


def test_a_forgotten_lease_is_deleted_unless_someone_took_it(api: client.ApiClient, name: str) -> None:
    clock = FakeClock()
    a, b = lease(api, name, "worker-a", clock), lease(api, name, "worker-b", clock)
    a.acquire(timeout=0)
    a.release(forget=True)
    with pytest.raises(client.ApiException) as gone:
        stored(api, name)
    assert gone.value.status == 404
    a.acquire(timeout=0)  # created anew
    real_delete = a._delete

    def delete_after_b_took_it(version: dict[str, Any] | None) -> None:
        b.acquire(timeout=0)  # between a's release and its delete: the delete's precondition fails
        real_delete(version)

    a._delete = delete_after_b_took_it  # type: ignore[method-assign]
    a.release(forget=True)
    assert stored(api, name).spec.holder_identity == "worker-b"


class Interfering(KubernetesLease):
    """Runs `meddle` once, right after its first read: another writer gets in between read and write."""

    meddle: Callable[[], object] | None = None

    def _read(self) -> tuple[LeaseRecord | None, dict[str, Any] | None]:
        result = super()._read()
        meddle, self.meddle = self.meddle, None
        if meddle is not None:
            meddle()
        return result


def interfering(api: client.ApiClient, name: str, holder: str, clock: FakeClock) -> Interfering:
    return Interfering(
        api, NAMESPACE, name, holder, duration_seconds=DURATION, clock=clock, sleep=clock.sleep,
        wall_clock=clock, create_missing=True,
    )  # fmt: skip


def test_a_write_that_loses_to_another_write_reads_again_and_never_overwrites(
    api: client.ApiClient, name: str
) -> None:
    clock = FakeClock()
    a = lease(api, name, "writer-a", clock)
    b = interfering(api, name, "writer-b", clock)
    c = interfering(api, name, "writer-c", clock)

    # Create race: c saw no Lease, but a created it before c's create reached the server.
    c.meddle = a.acquire
    with pytest.raises(LeaseTimeoutError, match="held by 'writer-a'"):
        c.acquire(timeout=0)
    assert stored(api, name).spec.holder_identity == "writer-a"

    # Replace race: c saw a's expired lease, but b took it over before c's replace reached the server.
    clock.now += DURATION + 1
    c.meddle = b.acquire
    with pytest.raises(LeaseTimeoutError, match="held by 'writer-b'"):
        c.acquire(timeout=0)
    obj = stored(api, name)
    assert (obj.spec.holder_identity, obj.spec.lease_transitions) == ("writer-b", 2)

    # Renew race: someone annotates the Lease between b's read and write. b's replace is refused, b reads
    # again, still finds its own lease, and renews it, keeping the annotation.
    clock.now += 1
    b.meddle = lambda: client.CoordinationV1Api(api).patch_namespaced_lease(
        name, NAMESPACE, {"metadata": {"annotations": {"seen-by": "auditor"}}}
    )
    b.renew()
    obj = stored(api, name)
    assert (obj.spec.holder_identity, obj.spec.lease_transitions) == ("writer-b", 2)
    assert obj.spec.renew_time == datetime.fromtimestamp(clock.now, UTC)
    assert obj.metadata.annotations == {"seen-by": "auditor"}


def test_exactly_one_of_many_concurrent_contenders_wins(kube: KubeAPIServer, name: str) -> None:
    """Real clock, one API client each: 8 threads race for a missing Lease, then for a released one."""
    contenders = [
        KubernetesLease(
            config.new_client_from_config(config_file=str(kube.kubeconfig)),
            NAMESPACE,
            name,
            f"w{i}",
            duration_seconds=60,
            create_missing=True,
        )
        for i in range(8)
    ]

    def race(epoch: int) -> KubernetesLease:
        barrier = threading.Barrier(len(contenders))
        winners: list[KubernetesLease] = []

        def contend(contender: KubernetesLease) -> None:
            barrier.wait()
            with contextlib.suppress(LeaseTimeoutError):
                assert contender.acquire(timeout=0) == epoch
                winners.append(contender)

        threads = [threading.Thread(target=contend, args=(c,)) for c in contenders]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(winners) == 1
        assert [c for c in contenders if c.is_held] == winners
        return winners[0]

    first = race(epoch=1)
    assert stored(first._api, name).spec.holder_identity == first.holder
    first.release()
    second = race(epoch=2)
    obj = stored(second._api, name)
    assert (obj.spec.holder_identity, obj.spec.lease_transitions) == (second.holder, 2)


def test_a_lease_written_by_someone_else_keeps_its_labels_and_transitions(
    api: client.ApiClient, name: str
) -> None:
    client.CoordinationV1Api(api).create_namespaced_lease(
        NAMESPACE,
        {
            "metadata": {"name": name, "labels": {"team": "data"}, "annotations": {"note": "kept"}},
            "spec": {"leaseTransitions": 7},  # released (no holder), after 7 changes of holder
        },
    )
    a = lease(api, name, "writer-a", FakeClock())
    assert a.acquire(timeout=0) == 8
    obj = stored(api, name)
    assert obj.metadata.labels == {"team": "data", "app.kubernetes.io/managed-by": "icefall"}
    assert obj.metadata.annotations == {"note": "kept"}

    # Held, with no times or duration at all: judged like any other record, from when it was first seen.
    client.CoordinationV1Api(api).create_namespaced_lease(
        NAMESPACE, {"metadata": {"name": f"{name}-x"}, "spec": {"holderIdentity": "someone"}}
    )
    clock = FakeClock()
    assert lease(api, f"{name}-x", "writer-a", clock).acquire(timeout=60) == 1
    assert clock.now == T0 + DURATION


@pytest.mark.parametrize("skew", [400, -400])
def test_two_writers_whose_clocks_are_400_s_apart(api: client.ApiClient, name: str, skew: int) -> None:
    """The holder writes renewTimes `skew` s off the contender's: neither steals a renewed Lease, and a
    dead holder's Lease is taken one duration after its last renewal (not 400 s early or late)."""
    name = f"{name}-{'ahead' if skew > 0 else 'behind'}"
    clock = FakeClock()
    holder = lease(api, name, "holder", clock, wall_clock=lambda: clock.now + skew)
    contender = lease(api, name, "contender", clock, wall_clock=lambda: clock.now - skew)
    assert holder.acquire(timeout=0) == 1
    for _ in range(8):  # renewed every 4 s (DURATION / 2.5) for 32 s
        with pytest.raises(LeaseTimeoutError, match="held by 'holder'"):
            contender.acquire(timeout=0)
        clock.now += 4
        holder.renew()
    written = stored(api, name).spec.renew_time
    assert written == datetime.fromtimestamp(clock.now + skew, UTC)  # the holder's own (skewed) clock
    died = clock.now
    assert contender.acquire(timeout=600) == 2
    assert clock.now == pytest.approx(died + DURATION)
    with pytest.raises(LeaseLostError, match="held by 'contender'"):
        holder.renew()


def test_a_squatted_lease_with_a_huge_duration_is_taken_after_one_duration(
    api: client.ApiClient, name: str
) -> None:
    years_ahead = datetime.fromtimestamp(T0 + 10 * 365 * 86400 + 0.25, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    client.CoordinationV1Api(api).create_namespaced_lease(
        NAMESPACE,
        {
            "metadata": {"name": name},
            "spec": {
                "holderIdentity": "squatter",
                "leaseDurationSeconds": 2**31 - 1,
                "renewTime": years_ahead,
                "acquireTime": years_ahead,
                "leaseTransitions": 3,
            },
        },
    )
    clock = FakeClock()
    writer = lease(api, name, "writer", clock, create_missing=False)
    with pytest.raises(LeaseTimeoutError, match="held by 'squatter'"):
        writer.acquire(timeout=DURATION - 1)
    assert writer.acquire(timeout=60) == 4
    assert clock.now == pytest.approx(T0 + DURATION)
    obj = stored(api, name)
    assert (obj.spec.holder_identity, obj.spec.lease_duration_seconds) == ("writer", DURATION)


def test_a_missing_lease_is_waited_for_not_created(
    api: client.ApiClient, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    pod = lease(api, name, "pod", clock, create_missing=False)
    with pytest.raises(LeaseTimeoutError, match=r"does not exist \(the operator creates each table's Leases"):
        pod.acquire(timeout=3)
    assert clock.now == pytest.approx(T0 + 3)  # polled, never created
    assert pod.current() is None
    assert sum("does not exist: waiting for it" in r.getMessage() for r in caplog.records) == 1
    client.CoordinationV1Api(api).create_namespaced_lease(NAMESPACE, {"metadata": {"name": name}})
    assert pod.acquire(timeout=0) == 1  # there now (the operator made it): taken at once, nobody held it
    client.CoordinationV1Api(api).delete_namespaced_lease(name, NAMESPACE)
    with pytest.raises(LeaseLostError, match="deleted"):
        pod.renew()


def test_a_user_without_rbac_grants_gets_a_clear_permission_error(
    kube: KubeAPIServer, name: str, tmp_path: Path
) -> None:
    kubeconfig = kube.write_kubeconfig(tmp_path / "limited", kube.user_tokens["limited"], "limited")
    limited = config.new_client_from_config(config_file=str(kubeconfig))
    with pytest.raises(LeaseAPIError) as denied:
        KubernetesLease(limited, NAMESPACE, name, "writer-a").acquire(timeout=0)
    assert denied.value.status == 403
    assert "needs get/update on leases.coordination.k8s.io in namespace default" in str(denied.value)


def test_the_duration_is_whole_seconds(api: client.ApiClient) -> None:
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="whole number of seconds"):
            KubernetesLease(api, NAMESPACE, "unused", "a", duration_seconds=bad)  # type: ignore[arg-type]
