"""Which cluster the e2e tests run against, how they reach a real cluster's Services from this machine, and
what the chart needs on the local cluster.

The switch is one variable: with `ICEFALL_E2E_KUBECONFIG` set (by hack/kind/e2e-kind.sh), the tests that
support it run against that cluster, whose Kafka, REST catalog and object store are Services; without it,
against the local cluster (`icefall.devstack.cluster`: kube-apiserver, controllers, a node on containerd;
Kafka, MinIO, ... as processes on this machine). On a real cluster, the test process reaches those
Services through `kubectl port-forward` on loopback, the way the local servers listen on loopback.

Kafka needs more than a forwarded port: clients connect to the addresses the broker advertises, so the
cluster's broker has a second listener (`HOST_LISTENER_PORT`) that advertises `127.0.0.1:<that port>`,
and the forward uses the same port on both ends (hack/kind/kafka.yaml).

`Helm` runs the real helm; `local_chart_values` and `image_args` are what `helm install` of the chart takes
on the local cluster beyond a user's values: the image built here, and, since there is no pod network,
every pod on the host network with the API server's loopback address and free ports for the operator.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from icefall.devstack.cluster import LocalCluster
from icefall.devstack.kafka import create_topic
from icefall.devstack.procs import ManagedProcess, free_port
from icefall.devstack.tools import tool_dir

E2E_KUBECONFIG = "ICEFALL_E2E_KUBECONFIG"
#: The Kafka listener of hack/kind/kafka.yaml that advertises 127.0.0.1:<port>, for a port-forward.
HOST_LISTENER_PORT = 19092


def e2e_kubeconfig(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The kubeconfig of the cluster to test (`ICEFALL_E2E_KUBECONFIG`), or None for the local harness."""
    value = environ.get(E2E_KUBECONFIG, "")
    if not value:
        return None
    path = Path(value)
    if not path.is_file():
        raise FileNotFoundError(f"{E2E_KUBECONFIG}={value}: no such file")
    return path


@dataclass(frozen=True)
class Forward:
    """What `kubectl port-forward` needs to reach a cluster address from loopback."""

    namespace: str
    service: str
    port: int  # the Service's port
    local_port: int  # the loopback port


def forward_for(endpoint: str, local_port: int) -> Forward:
    """The Service behind a cluster address, `name.namespace:port` or `scheme://name.namespace:port`."""
    netloc = urlsplit(endpoint).netloc if "://" in endpoint else endpoint
    host, _, port = netloc.rpartition(":")
    name, _, namespace = host.removesuffix(".svc.cluster.local").removesuffix(".svc").partition(".")
    if not (name and namespace and port.isdigit()):
        raise ValueError(f"{endpoint!r} is not a Service address (name.namespace:port)")
    return Forward(namespace=namespace, service=name, port=int(port), local_port=local_port)


def on_loopback(endpoint: str, local_port: int) -> str:
    """`endpoint` with its host and port replaced by 127.0.0.1:`local_port` (its scheme kept)."""
    if "://" not in endpoint:
        return f"127.0.0.1:{local_port}"
    return urlsplit(endpoint)._replace(netloc=f"127.0.0.1:{local_port}").geturl()


def kind_forwards(kafka: str, others: Sequence[str]) -> dict[str, Forward]:
    """The forwards that make a real cluster's Kafka (`kafka`, its bootstrap address) and the HTTP(S)
    Services `others` reachable from loopback: endpoint → Forward. Kafka's goes to the broker's host
    listener on the same port at both ends; the others to a free port."""
    forwards = {kafka: replace(forward_for(kafka, HOST_LISTENER_PORT), port=HOST_LISTENER_PORT)}
    forwards.update({endpoint: forward_for(endpoint, free_port()) for endpoint in others})
    return forwards


@dataclass(frozen=True)
class KafkaAt:
    """A broker the tests did not start (a cluster's, through its forward), as the stream helpers take it."""

    bootstrap: str

    def create_topic(self, name: str, partitions: int = 1) -> None:
        create_topic(self.bootstrap, name, partitions)


class PortForward:
    """`kubectl port-forward service/<name> <local>:<port>` in the background, ready once the port accepts."""

    def __init__(self, kubectl: Sequence[str], env: Mapping[str, str], forward: Forward, log: Path) -> None:
        self.forward = forward
        argv = [
            *kubectl, "-n", forward.namespace, "port-forward", f"service/{forward.service}",
            f"{forward.local_port}:{forward.port}",
        ]  # fmt: skip
        self.process = ManagedProcess(
            f"port-forward {forward.service}.{forward.namespace}", argv, log, env=env
        )

    def start(self, timeout: float = 60) -> PortForward:
        self.process.start()
        self.process.wait_ready(self._accepts, timeout, f"forwarding 127.0.0.1:{self.forward.local_port}")
        return self

    def _accepts(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.forward.local_port), timeout=2):
            return True

    def stop(self) -> None:
        self.process.stop()


class Helm:
    """The real helm (`ICEFALL_HELM_BIN`) against the cluster of `kubeconfig`, its state under `home`."""

    def __init__(self, kubeconfig: Path, home: Path) -> None:
        self.binary = str(tool_dir("ICEFALL_HELM_BIN") / "helm")
        self.env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(kubeconfig)}

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            [self.binary, *args], env=self.env, capture_output=True, text=True, timeout=180, check=False
        )
        assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout


def make_chart(root: Path, dist: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """`make chart CHART_DIST=dist` in `root` (the README's packaging step), helm's own files under `home`."""
    helm_homes = {f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}
    return subprocess.run(
        ["make", "-s", "-C", str(root), "chart", f"CHART_DIST={dist}"],
        env={**os.environ, **helm_homes}, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def packaged_chart(root: Path, dist: Path, home: Path) -> Path:
    """The chart packaged by `make chart` into `dist`: dist/icefall-<version>.tgz."""
    made = make_chart(root, dist, home)
    packages = sorted(dist.glob("icefall-*.tgz"))
    assert made.returncode == 0 and len(packages) == 1, f"make chart:\n{made.stdout}\n{made.stderr}"
    return packages[0]


def image_args(image: str) -> list[str]:
    """`--set image.repository=... --set image.tag=...` for an image reference `repository:tag`."""
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        raise ValueError(f"{image!r} is not repository:tag")
    return ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]


def local_chart_values(cluster: LocalCluster) -> dict[str, Any]:
    """Helm values the chart needs on the local cluster: the operator's pod on the host network, its
    health and metrics ports free ones of this machine (the node's ports are the machine's), the API
    server's loopback address in its environment (`extraEnv`: append it to the user's), and every table
    pod's template `cluster.pod_template()` (`pods.common`: host network, that address, small CPU
    requests)."""
    health = metrics = free_port()
    while metrics == health:
        metrics = free_port()
    return {
        "hostNetwork": True,
        "health": {"port": health},
        "metrics": {"port": metrics},
        "extraEnv": cluster.api_env(),
        "pods": {"common": cluster.pod_template()},
    }
