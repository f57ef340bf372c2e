"""A one-node Kubernetes cluster on this machine, pods as real containers from the image we ship.

`LocalCluster.start()` starts, in order: kube-apiserver + etcd with the ServiceAccount admission plugin on
(pods get the projected token volume), kube-controller-manager with the controllers a cluster with a node
needs (`NODE_CONTROLLERS`), kube-scheduler, and a node (`icefall.devstack.node`: containerd, runc and the
kubelet) holding Icefall's image and the pause image, built by hack/build-image.sh (`image_refs`).
kube-controller-manager and kube-scheduler are started again when they exit (`Restarter`), as a kubelet
restarts a control plane's static pods; the node's processes and kube-apiserver/etcd are not.

There is no pod network: pods use `hostNetwork: true` (`pod_template()` gives the pod template settings
every pod of this cluster needs), and the `kubernetes` Service's cluster IP is not reachable (no
kube-proxy; private-range traffic is not allowed here), so the same template points in-cluster clients at
the API server's loopback address (`KUBERNETES_SERVICE_HOST`/`_PORT`), through the pod spec.

Guarantees: `stop()` stops everything `start()` started, in reverse order, even when a step fails.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icefall.devstack.kube import (
    NODE_CONTROLLERS,
    KubeAPIServer,
    KubeControllerManager,
    KubeScheduler,
    Restarter,
)
from icefall.devstack.node import Node
from icefall.devstack.tools import ToolMissingError, repo_root


@dataclass(frozen=True)
class Images:
    icefall: str
    pause: str


def image_refs() -> Images:
    """Icefall's image and the pause image: ICEFALL_IMAGE / ICEFALL_PAUSE_IMAGE when set (by `make`), else
    built (or found, by the hash of what goes in) by hack/build-image.sh."""
    if os.environ.get("ICEFALL_IMAGE") and os.environ.get("ICEFALL_PAUSE_IMAGE"):
        return Images(os.environ["ICEFALL_IMAGE"], os.environ["ICEFALL_PAUSE_IMAGE"])
    root = repo_root()
    if root is None:
        raise ToolMissingError("ICEFALL_IMAGE is not set and no checkout with hack/build-image.sh was found")
    out = subprocess.run(
        [str(root / "hack" / "build-image.sh")], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    values = dict(line.split("=", 1) for line in out.split() if "=" in line)
    os.environ.update(values)
    return Images(values["ICEFALL_IMAGE"], values["ICEFALL_PAUSE_IMAGE"])


class LocalCluster:
    def __init__(self, workdir: Path, images: Images) -> None:
        self.workdir = workdir
        self.images = images
        self.api = KubeAPIServer(workdir / "kube", service_accounts=True)
        self.controller_manager = KubeControllerManager(
            self.api, workdir / "controller-manager", NODE_CONTROLLERS
        )
        self.scheduler = KubeScheduler(self.api, workdir / "scheduler")
        self.node = Node(self.api, workdir / "node", images=[images.icefall], pause_image=images.pause)
        self.restarter = Restarter(
            {"kube-controller-manager": self.controller_manager, "kube-scheduler": self.scheduler}
        )

    def start(self) -> LocalCluster:
        try:
            for name, component in (
                ("kube-apiserver", self.api),
                ("kube-controller-manager", self.controller_manager),
                ("kube-scheduler", self.scheduler),
                ("node", self.node),
            ):
                started = time.monotonic()
                component.start()
                print(f"[cluster] {name} running in {time.monotonic() - started:.1f}s", flush=True)
            self.restarter.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.restarter.stop()
        try:
            self.node.stop()
        finally:
            try:
                self.scheduler.stop()
                self.controller_manager.stop()
            finally:
                self.api.stop()

    def api_env(self) -> list[dict[str, str]]:
        """The variables in-cluster clients read, pointing at the API server on loopback."""
        return [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(self.api.port)},
        ]

    def pod_template(self) -> dict[str, Any]:
        """`spec.pods.common` (or the chart's `pods.common`) for this cluster: host network, the API server's
        address, and small CPU requests (the node has 2 CPUs; the defaults ask for more than that)."""
        return {
            "hostNetwork": True,
            "env": self.api_env(),
            "resources": {"requests": {"cpu": "100m"}},
        }
