"""The dev cluster's control plane is supervised: a kube-scheduler that exits is started again.

Proves: a kube-scheduler that exits by itself (SIGKILL here; it also exits by design when it finds its cache
corrupted, as `make chaos` saw after a kube-apiserver restart) is started again by `Restarter`, with one
line, and schedules a Pod created meanwhile onto the node; without it, nothing would (the Pod stays
Pending). The node is an API object only (no kubelet): scheduling is binding a Pod to it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from kubernetes import config

from icefall.devstack.kube import KubeAPIServer, KubeScheduler, Restarter
from icefall.testing.kubeapi import JsonApi

pytestmark = pytest.mark.integration

NODE = "node-a"
SIZE = {"cpu": "2", "memory": "4Gi", "pods": "10"}


def test_a_scheduler_that_exits_is_started_again_and_schedules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = KubeAPIServer(tmp_path / "kube").start()
    scheduler = KubeScheduler(kube, tmp_path / "scheduler")
    restarter = Restarter({"kube-scheduler": scheduler}, every=0.2)
    try:
        api = JsonApi(config.new_client_from_config(config_file=str(kube.kubeconfig)))
        api.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "an object only"}
        status = {"status": {"capacity": SIZE, "allocatable": SIZE, "conditions": [ready]}}
        merge = "application/merge-patch+json"
        api.call("PATCH", f"/api/v1/nodes/{NODE}/status", status, content_type=merge)
        # The not-ready taint the API server gives a new node: a node-lifecycle controller would lift it.
        api.call("PATCH", f"/api/v1/nodes/{NODE}", {"spec": {"taints": None}}, content_type=merge)
        scheduler.start()
        restarter.start()
        first = scheduler.pid
        assert first is not None
        os.killpg(first, signal.SIGKILL)  # its process group: it runs in a session of its own
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "waits-for-a-scheduler"},
            "spec": {"containers": [{"name": "c", "image": "never-pulled"}]},
        }
        api.call("POST", "/api/v1/namespaces/default/pods", pod)
        path = "/api/v1/namespaces/default/pods/waits-for-a-scheduler"
        deadline = time.monotonic() + 60
        while (found := api.call("GET", path))["spec"].get("nodeName") is None:
            assert time.monotonic() < deadline, f"not scheduled 60 s after the kill: {found['status']}"
            time.sleep(0.5)
        assert found["spec"]["nodeName"] == NODE
        assert restarter.restarts["kube-scheduler"] == 1
        assert scheduler.pid not in (None, first)
        assert "[cluster] kube-scheduler exited with code -9; starting it again" in capsys.readouterr().out
    finally:
        restarter.stop()
        scheduler.stop()
        kube.stop()
