"""The test API server is a real kube-apiserver on a real etcd: CRDs are established, custom resources are
stored and watched, the status subresource is separate, Leases are created and renewed with optimistic
concurrency, RBAC denies an unprivileged user, and the built kubectl and helm talk to it."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.tools import tool_dir

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = "smoke.icefall.dev", "v1", "widgets"

WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                                "required": ["size"],
                            },
                            "status": {
                                "type": "object",
                                "properties": {"observedSize": {"type": "integer"}},
                            },
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def api(kube: KubeAPIServer) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kube.kubeconfig))


def _wait_established(api: client.ApiClient, name: str) -> None:
    extensions = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        crd = extensions.read_custom_resource_definition(name)
        if any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or []):
            return
        time.sleep(0.2)
    raise AssertionError(f"CRD {name} not established")


def test_crd_resource_watch_and_status(api: client.ApiClient) -> None:
    client.ApiextensionsV1Api(api).create_custom_resource_definition(WIDGET_CRD)
    _wait_established(api, f"{PLURAL}.{GROUP}")
    objects = client.CustomObjectsApi(api)

    events: list[tuple[str, Any]] = []
    ready = threading.Event()

    def watch_widgets() -> None:
        stream = watch.Watch()
        ready.set()
        for event in stream.stream(
            objects.list_namespaced_custom_object, GROUP, VERSION, "default", PLURAL, timeout_seconds=20
        ):
            events.append((event["type"], event["object"].get("status")))
            if len(events) == 2:
                stream.stop()

    watcher = threading.Thread(target=watch_widgets, daemon=True)
    watcher.start()
    ready.wait(5)
    time.sleep(0.5)  # let the watch request reach the server before the first write

    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Widget",
        "metadata": {"name": "w1"},
        "spec": {"size": 3},
    }
    objects.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    # The main resource ignores status; only the status subresource sets it.
    objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", PLURAL, "w1", {"status": {"observedSize": 3}}
    )
    watcher.join(25)
    assert [kind for kind, _ in events] == ["ADDED", "MODIFIED"]
    assert events[1][1] == {"observedSize": 3}

    with pytest.raises(ApiException) as invalid:
        bad = {**body, "metadata": {"name": "w2"}, "spec": {"size": 0}}
        objects.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, bad)
    assert invalid.value.status == 422 and "spec.size" in invalid.value.body


def test_lease_create_renew_and_conflict(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    now = datetime.now(UTC)
    lease = leases.create_namespaced_lease(
        "default",
        client.V1Lease(
            metadata=client.V1ObjectMeta(name="smoke-commit"),
            spec=client.V1LeaseSpec(
                holder_identity="writer-a", lease_duration_seconds=15, acquire_time=now, renew_time=now,
                lease_transitions=0,
            ),
        ),
    )  # fmt: skip
    stale_version = lease.metadata.resource_version
    lease.spec.renew_time = datetime.now(UTC)
    renewed = leases.replace_namespaced_lease("smoke-commit", "default", lease)
    assert renewed.metadata.resource_version != stale_version
    assert renewed.spec.holder_identity == "writer-a"

    # A second writer working from the old version loses: the API server's optimistic concurrency.
    lease.metadata.resource_version = stale_version
    lease.spec.holder_identity = "writer-b"
    lease.spec.lease_transitions = 1
    with pytest.raises(ApiException) as conflict:
        leases.replace_namespaced_lease("smoke-commit", "default", lease)
    assert conflict.value.status == 409


def test_rbac_denies_a_user_without_grants(kube: KubeAPIServer, tmp_path: Path) -> None:
    kubeconfig = kube.write_kubeconfig(tmp_path / "limited", kube.user_tokens["limited"], "limited")
    limited = config.new_client_from_config(config_file=str(kubeconfig))
    with pytest.raises(ApiException) as denied:
        client.CoordinationV1Api(limited).list_namespaced_lease("default")
    assert denied.value.status == 403


def _run(tool: str, *args: str, kube: KubeAPIServer, stdin: str | None = None) -> str:
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "HOME": str(kube.workdir)}
    result = subprocess.run(
        [tool, *args], input=stdin, capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert result.returncode == 0, f"{tool} {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_kubectl_is_version_stamped_and_reads_the_server(kube: KubeAPIServer) -> None:
    kubectl = str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl")
    versions = json.loads(_run(kubectl, "version", "-o", "json", kube=kube))
    assert versions["serverVersion"]["gitVersion"].startswith("v1.")
    assert versions["serverVersion"]["gitVersion"] != "v0.0.0-master"
    assert versions["clientVersion"]["gitVersion"] == versions["serverVersion"]["gitVersion"]
    namespaces = _run(kubectl, "get", "namespaces", "-o", "name", kube=kube)
    assert "namespace/default" in namespaces.split()


def test_helm_chart_renders_and_passes_server_side_dry_run(kube: KubeAPIServer, tmp_path: Path) -> None:
    helm = str(tool_dir("ICEFALL_HELM_BIN") / "helm")
    kubectl = str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl")
    _run(helm, "create", str(tmp_path / "demo"), kube=kube)
    _run(helm, "lint", str(tmp_path / "demo"), kube=kube)
    manifest = _run(helm, "template", "smoke", str(tmp_path / "demo"), kube=kube)
    applied = _run(
        kubectl, "apply", "--server-side", "--dry-run=server", "-f", "-", kube=kube, stdin=manifest
    )
    assert "deployment.apps/smoke-demo serverside-applied (server dry run)" in applied
