"""The pods of a StreamingTable: the driver Pod, the compaction Deployment, the executors' pod template
ConfigMap. Pure: no client, no I/O.

Guarantees:
- Pods satisfy the `restricted` Pod Security Standard: non-root, RuntimeDefault seccomp, no privilege
  escalation, all capabilities dropped, read-only root filesystem with emptyDirs for /tmp and Spark's
  local directories. Spark executors get the same through the pod template ConfigMap. A pod template that
  asks for `hostNetwork` (or a volume type such as hostPath) leaves the standard, as the cluster allows.
- Each of the driver, executor and compaction pods gets its role's effective pod template
  (`icefall.plan.pods` merges the layers and applies them after the operator's own, which they cannot
  replace): its env values, labels, annotations, volumes and scheduling go to the pods as written.
- Credentials reach the pods only as `secretKeyRef` env vars (`icefall.plan.env`); the entry points read
  the StreamingTable from the API, so no free-form spec value is copied into a pod.
- With executors (Kubernetes master), the driver and executor pods mount the table's Spark RPC Secret as a
  file (`icefall.plan.isolation`): its value is in no pod spec, env var or ConfigMap.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from icefall.api import PodTemplate, ResourceRequirements, StreamingTable
from icefall.plan import names, pods
from icefall.plan.env import (
    ENV_POD_IP,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    NODE_IDENTITY_OFF,
    SecretEnv,
    spark_conf_env,
)
from icefall.plan.isolation import spark_auth_volume
from icefall.plan.metadata import ChildMeta
from icefall.plan.settings import OperatorSettings
from icefall.plan.spark_conf import (
    BLOCK_MANAGER_PORT,
    DRIVER_PORT,
    EXECUTOR_CONTAINER,
    EXECUTOR_TEMPLATE_DIR,
    EXECUTOR_TEMPLATE_KEY,
    SPARK_LOCAL_DIR,
)

Manifest = dict[str, Any]

#: The port the driver and compaction pods serve Prometheus metrics on, named `metrics` in their containers
#: (the chart's PodMonitor scrapes that name). On the host network each table's pods get their own port
#: instead (`icefall.plan.pods.host_network_port`); `command` passes it as `--metrics-port`.
POD_METRICS_PORT = 9090
#: The driver's command; `{namespace}` and `{name}` name the StreamingTable it reads from the API.
INGEST_COMMAND: tuple[str, ...] = ("icefall", "ingest", "--namespace", "{namespace}", "--name", "{name}")
#: The compaction pods' command.
COMPACT_COMMAND: tuple[str, ...] = ("icefall", "compact", "--namespace", "{namespace}", "--name", "{name}")
TMP_DIR = "/tmp"


@dataclass(frozen=True)
class PodPlan:
    """One role's pods (`icefall.plan.pods` DRIVER, EXECUTOR, COMPACTION): the effective pod template
    (operator defaults, chart, table) and the port its entry point serves metrics on."""

    template: PodTemplate
    metrics_port: int

    @property
    def host_network(self) -> bool:
        return bool(self.template.host_network)


def pod_plans(st: StreamingTable, settings: OperatorSettings, *, namespace: str) -> dict[str, PodPlan]:
    """The effective pod template and metrics port of each role of `st`'s pods."""
    bases = {
        pods.DRIVER: settings.driver_resources.template(),
        pods.EXECUTOR: PodTemplate(),  # executors' cpu and memory come from the Spark settings
        pods.COMPACTION: settings.compaction_resources.template(),
    }
    plans: dict[str, PodPlan] = {}
    for role, base in bases.items():
        template = pods.effective(role, base=base, chart=settings.pod_template, table=st.spec.pods)
        port = POD_METRICS_PORT
        if template.host_network:
            port = pods.host_network_port(namespace, st.metadata.name, role, settings.host_network_ports)
        plans[role] = PodPlan(template, port)
    return plans


def command(template: Sequence[str], *, namespace: str, name: str, metrics_port: int) -> list[str]:
    """The entry point's command line for this table, serving metrics on `metrics_port`."""
    return [
        *(part.format(namespace=namespace, name=name) for part in template),
        f"--metrics-port={metrics_port}",
    ]


# --- the parts every pod shares ---------------------------------------------------------------------------


def _metrics_port(port: int, *, host_network: bool) -> Manifest:
    """The `metrics` port; on the host network also the node's port (which the API server would default)."""
    return {
        "name": "metrics",
        "containerPort": port,
        "protocol": "TCP",
        **({"hostPort": port} if host_network else {}),
    }


def _pod_security_context(settings: OperatorSettings) -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": settings.run_as_user,
        "runAsGroup": settings.run_as_group,
        "fsGroup": settings.run_as_group,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


_CONTAINER_SECURITY_CONTEXT: Mapping[str, Any] = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _scratch_volumes(settings: OperatorSettings) -> tuple[list[Manifest], list[Manifest]]:
    volumes = [
        {"name": "tmp", "emptyDir": {"sizeLimit": settings.tmp_size_limit}},
        {"name": "spark-local", "emptyDir": {"sizeLimit": settings.spark_local_size_limit}},
    ]
    mounts = [{"name": "tmp", "mountPath": TMP_DIR}, {"name": "spark-local", "mountPath": SPARK_LOCAL_DIR}]
    return volumes, mounts


def _node_identity(settings: OperatorSettings) -> list[Manifest]:
    return [] if settings.allow_node_identity else [dict(NODE_IDENTITY_OFF)]


def _env(
    settings: OperatorSettings, spark_conf: Mapping[str, str], secrets: Sequence[SecretEnv]
) -> list[Manifest]:
    """The downward API's pod identity, HOME, no node identity, then `ICEFALL_SPARK_CONF` (the kubelet
    expands `$(...)` from earlier vars only), then the credentials."""

    def field_ref(name: str, path: str) -> Manifest:
        return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}

    return [
        field_ref(ENV_POD_NAME, "metadata.name"),
        field_ref(ENV_POD_NAMESPACE, "metadata.namespace"),
        field_ref(ENV_POD_IP, "status.podIP"),
        {"name": "HOME", "value": TMP_DIR},
        *_node_identity(settings),
        spark_conf_env(spark_conf),
        *(s.manifest() for s in secrets),
    ]


def _container(
    settings: OperatorSettings,
    name: str,
    *,
    image: str,
    args: list[str],
    env: list[Manifest],
    mounts: list[Manifest],
    pod: PodPlan,
) -> Manifest:
    """A driver or compaction container: the operator's env and mounts, then the template's; the `metrics`
    port."""
    container: Manifest = {
        "name": name,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": args,
        "env": env,
        "resources": {},
        "securityContext": dict(_CONTAINER_SECURITY_CONTEXT),
        "volumeMounts": mounts,
        "ports": [_metrics_port(pod.metrics_port, host_network=pod.host_network)],
    }
    pods.apply_to_container(container, pod.template)
    return container


def _pod_spec(
    settings: OperatorSettings, own: Manifest, *, container: Manifest, volumes: list[Manifest], pod: PodPlan
) -> Manifest:
    """A driver or compaction pod's spec around `container`: its own fields (`own`: the ServiceAccount),
    the restricted security context, `volumes`; then the template's."""
    spec: Manifest = {
        **own,
        "automountServiceAccountToken": True,  # the entry points read their StreamingTable and use Leases
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.termination_grace_period_seconds,
        "securityContext": _pod_security_context(settings),
        "containers": [container],
        "volumes": volumes,
    }
    pods.apply_to_pod_spec(spec, pod.template)
    return spec


# --- the driver -------------------------------------------------------------------------------------------


def driver_pod(
    meta: ChildMeta,
    settings: OperatorSettings,
    *,
    image: str,
    spark_conf: Mapping[str, str],
    secrets: Sequence[SecretEnv],
    executor_template: str | None,
    pod: PodPlan,
) -> Manifest:
    """The driver Pod running `icefall ingest`, mounting the executors' pod template `executor_template`
    (None: Spark runs inside the pod, no executors)."""
    volumes, mounts = _scratch_volumes(settings)
    if executor_template is not None:
        volumes.append({"name": "executor-template", "configMap": {"name": executor_template}})
        mounts.append({"name": "executor-template", "mountPath": EXECUTOR_TEMPLATE_DIR, "readOnly": True})
        auth_volume, auth_mount = spark_auth_volume(meta.name)
        volumes.append(auth_volume)
        mounts.append(auth_mount)
    args = command(INGEST_COMMAND, namespace=meta.namespace, name=meta.name, metrics_port=pod.metrics_port)
    env = _env(settings, spark_conf, secrets)
    container = _container(settings, "ingest", image=image, args=args, env=env, mounts=mounts, pod=pod)
    if executor_template is not None and not pod.host_network:  # on the host network Spark picks free ports
        container["ports"] += [
            {"name": "spark-driver", "containerPort": DRIVER_PORT, "protocol": "TCP"},
            {"name": "block-manager", "containerPort": BLOCK_MANAGER_PORT, "protocol": "TCP"},
        ]
    own = {
        "serviceAccountName": names.driver_account_name(meta.name),
        # The operator restarts a failed driver itself, with backoff (icefall.plan.driver).
        "restartPolicy": "Never",
    }
    spec = _pod_spec(settings, own, container=container, volumes=volumes, pod=pod)
    metadata = meta.metadata(names.driver_pod_name(meta.name), names.COMPONENT_INGEST)
    metadata["labels"] = pods.pod_labels(pod.template, metadata["labels"])
    metadata["annotations"] = pods.pod_annotations(pod.template, metadata["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def purge_pod_spec(
    meta: ChildMeta,
    settings: OperatorSettings,
    *,
    image: str,
    args: list[str],
    secrets: Sequence[SecretEnv],
    pod: PodPlan,
) -> Manifest:
    """The pod spec of the purge Job (`icefall.plan.purge`): `args` under the driver's ServiceAccount with
    `secrets`, the driver's pod template and the same restricted security context; no ports, no Spark."""
    volumes, mounts = _scratch_volumes(settings)
    container = _container(
        settings, "purge", image=image, args=args, env=_env(settings, {}, secrets), mounts=mounts, pod=pod
    )
    del container["ports"]  # it serves nothing
    own = {"serviceAccountName": names.driver_account_name(meta.name), "restartPolicy": "Never"}
    return _pod_spec(settings, own, container=container, volumes=volumes, pod=pod)


def executor_template(meta: ChildMeta, settings: OperatorSettings, pod: PodPlan) -> Manifest:
    """The ConfigMap holding Spark executors' pod template: the restricted security settings Spark cannot
    set by conf, the table's Spark RPC Secret as a file (by name only), and the executors' pod template
    (cpu and memory excepted: Spark sets those from its conf, `icefall.plan.spark_conf.executor_conf`)."""
    template = pod.template
    auth_volume, auth_mount = spark_auth_volume(meta.name)
    container: Manifest = {
        "name": EXECUTOR_CONTAINER,
        "securityContext": dict(_CONTAINER_SECURITY_CONTEXT),
        # Executors fetch the driver's added files and jars into their working folder; the root is
        # read-only.
        "workingDir": TMP_DIR,
        "volumeMounts": [{"name": "tmp", "mountPath": TMP_DIR}, auth_mount],
    }
    if env := _node_identity(settings):  # Spark keeps the template's env; executors read the table's files
        container["env"] = env
    pods.apply_to_container(container, template, resources=False)
    other = pods.resources_manifest(template.resources or ResourceRequirements(), leave_out=("cpu", "memory"))
    if other:  # cpu and memory are Spark's (spark.executor.memory, spark.kubernetes.executor.*.cores)
        container["resources"] = other
    spec: Manifest = {
        "automountServiceAccountToken": False,  # executors never call the API
        "enableServiceLinks": False,
        "securityContext": _pod_security_context(settings),
        "containers": [container],
        # Spark adds its own emptyDir local dirs (spark-local-dir-*) next to this one.
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": settings.tmp_size_limit}}, auth_volume],
    }
    pods.apply_to_pod_spec(spec, template)
    metadata = {k: v for k, v in (("labels", template.labels), ("annotations", template.annotations)) if v}
    body = {"apiVersion": "v1", "kind": "Pod", **({"metadata": metadata} if metadata else {}), "spec": spec}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta.metadata(names.executor_template_name(meta.name), names.COMPONENT_INGEST),
        "data": {EXECUTOR_TEMPLATE_KEY: json.dumps(body, sort_keys=True, indent=2)},
    }


# --- compaction -------------------------------------------------------------------------------------------


def compaction_deployment(
    meta: ChildMeta,
    settings: OperatorSettings,
    *,
    image: str,
    spark_conf: Mapping[str, str],
    replicas: int,
    secrets: Sequence[SecretEnv],
    pod: PodPlan,
) -> Manifest:
    """The Deployment of `replicas` compaction pods running `icefall compact`."""
    volumes, mounts = _scratch_volumes(settings)
    args = command(COMPACT_COMMAND, namespace=meta.namespace, name=meta.name, metrics_port=pod.metrics_port)
    env = _env(settings, spark_conf, secrets)
    container = _container(settings, "compact", image=image, args=args, env=env, mounts=mounts, pod=pod)
    own = {"serviceAccountName": names.compaction_account_name(meta.name)}
    spec = _pod_spec(settings, own, container=container, volumes=volumes, pod=pod)
    # The spec hash in the template's labels rolls the pods when the spec changes.
    metadata: Manifest = {"labels": pods.pod_labels(pod.template, meta.labels(names.COMPONENT_COMPACT))}
    if pod.template.annotations:
        metadata["annotations"] = dict(pod.template.annotations)
    deployment: Manifest = {
        "replicas": replicas,
        "revisionHistoryLimit": 2,
        "selector": {"matchLabels": names.selector_labels(meta.name, names.COMPONENT_COMPACT)},
        "template": {"metadata": metadata, "spec": spec},
    }
    if pod.host_network:  # a new pod would want the node port the old one holds: replace, then start
        deployment["strategy"] = {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta.metadata(names.compaction_name(meta.name), names.COMPONENT_COMPACT),
        "spec": deployment,
    }
