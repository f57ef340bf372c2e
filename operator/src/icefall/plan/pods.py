"""Pod templates (`spec.pods`, the chart's `pods`) merged and applied to the pods a StreamingTable owns.
Pure: no client, no I/O.

`effective` stacks the layers of one role, lowest first: the operator's built-in part (the driver's and
compaction's default resources), the chart's `common` then role part, the table's `common` then role part.
Maps merge with the higher layer winning per key; env vars, volumes and image pull secrets are keyed by
name and volume mounts by path (a higher layer's entry replaces the inherited one in place, new ones
append); tolerations append; `priorityClassName` and `hostNetwork` are replaced; resources merge per
resource name, and an inherited request above a limit set higher up is lowered to it (an inherited limit
below a request set higher up is raised to it), so the layers never make an invalid pod between them.

Host network (`hostNetwork: true`, for clusters without a usable pod network): the pod gets
`dnsPolicy: ClusterFirstWithHostNet`, and every port it declares becomes a port of the node. So:
- the metrics port is `host_network_port`, derived from the table's namespace, name and role within the
  operator's range, and still declared (named `metrics`): the scheduler then refuses to put two pods
  that want one port on one node, where a fixed port would crash-loop the second;
- the Spark driver declares no Spark ports and fixes none (`icefall.plan.spark_conf` leaves
  `spark.driver.port` and `spark.driver.blockManager.port` out; Spark picks free ones and tells the
  executors);
- executors on the host network bind their block manager to a free port (`spark.blockManager.port=0`,
  so Spark declares no port either) and never read another executor's shuffle files from the local disk
  (`spark.shuffle.readHostLocalDisk=false`: pods of one node share the node's address, and Spark would
  take them for one host with one disk);
- the compaction Deployment replaces a pod before starting the next (maxSurge 0): a new pod would want
  the port the old one holds.

Not guaranteed: that two tables' derived ports differ (a hash into a range; the scheduler keeps a true
collision off a node); that the node has the port free for anything else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from icefall.api import PodTemplate, PodTemplates, ResourceRequirements, parse_quantity

Manifest = dict[str, Any]

DRIVER = "driver"
EXECUTOR = "executor"
COMPACTION = "compaction"

DNS_HOST_NETWORK = "ClusterFirstWithHostNet"


def effective(role: str, *, base: PodTemplate, chart: PodTemplates, table: PodTemplates) -> PodTemplate:
    """The template of one role's pods: `base` < chart common < chart role < table common < table role."""
    return merge([base, chart.common, chart.role(role), table.common, table.role(role)])


def merge(layers: Sequence[PodTemplate]) -> PodTemplate:
    """Stack `layers`, lowest first (see the module docstring for the rules)."""
    maps: dict[str, dict[str, str]] = {name: {} for name in _MAPS}
    keyed: dict[str, dict[str, Any]] = {name: {} for name in _KEYED}
    tolerations: list[Any] = []
    affinity: dict[str, Any] = {}
    scalars: dict[str, Any] = {}
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    for layer in layers:
        for name in _MAPS:
            maps[name].update(getattr(layer, name))
        for name, key in _KEYED.items():
            keyed[name].update((getattr(item, key), item) for item in getattr(layer, name))
        tolerations += [t for t in layer.tolerations if t not in tolerations]
        if layer.affinity is not None:
            affinity.update(layer.affinity.model_dump(exclude_none=True))
        scalars.update({name: getattr(layer, name) for name in _SCALARS if getattr(layer, name) is not None})
        if layer.resources is not None:
            _stack_resources(requests, limits, layer.resources)
    resources = {"requests": requests, "limits": limits} if requests or limits else None
    return PodTemplate.model_validate(
        {
            **maps,
            **{name: list(items.values()) for name, items in keyed.items()},
            "tolerations": tolerations,
            "affinity": affinity or None,
            "resources": resources,
            **scalars,
        }
    )


_MAPS = ("labels", "annotations", "service_account_annotations", "node_selector")
_KEYED = {"env": "name", "volumes": "name", "image_pull_secrets": "name", "volume_mounts": "mount_path"}
_SCALARS = ("priority_class_name", "host_network")


def _stack_resources(requests: dict[str, str], limits: dict[str, str], layer: ResourceRequirements) -> None:
    for name, limit in layer.limits.items():
        inherited = requests.get(name)
        if name not in layer.requests and inherited and parse_quantity(inherited) > parse_quantity(limit):
            requests[name] = limit
    for name, request in layer.requests.items():
        inherited = limits.get(name)
        if name not in layer.limits and inherited and parse_quantity(inherited) < parse_quantity(request):
            limits[name] = request
    requests.update(layer.requests)
    limits.update(layer.limits)


# --- applying a template to a manifest --------------------------------------------------------------------


def _dump(items: Iterable[Any]) -> list[Manifest]:
    return [item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in items]


def apply_to_pod_spec(pod_spec: Manifest, template: PodTemplate) -> None:
    """Scheduling, pull secrets, host network and extra volumes (after the operator's own)."""
    if template.host_network:
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = DNS_HOST_NETWORK
    if template.priority_class_name:
        pod_spec["priorityClassName"] = template.priority_class_name
    if template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = _dump(template.image_pull_secrets)
    if template.node_selector:
        pod_spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        pod_spec["tolerations"] = _dump(template.tolerations)
    if template.affinity is not None:
        pod_spec["affinity"] = template.affinity.model_dump(mode="json", by_alias=True, exclude_none=True)
    if template.volumes:
        pod_spec["volumes"] = [*pod_spec.get("volumes", []), *_dump(template.volumes)]


def apply_to_container(container: Manifest, template: PodTemplate, *, resources: bool = True) -> None:
    """Extra env and mounts (after the operator's own) and, unless told not to, the resources."""
    if template.env:
        container["env"] = [*container.get("env", []), *_dump(template.env)]
    if template.volume_mounts:
        container["volumeMounts"] = [*container.get("volumeMounts", []), *_dump(template.volume_mounts)]
    if resources and template.resources is not None:
        container["resources"] = resources_manifest(template.resources)


def resources_manifest(resources: ResourceRequirements, *, leave_out: Sequence[str] = ()) -> Manifest:
    requests = {k: v for k, v in resources.requests.items() if k not in leave_out}
    limits = {k: v for k, v in resources.limits.items() if k not in leave_out}
    return {**({"requests": requests} if requests else {}), **({"limits": limits} if limits else {})}


def pod_labels(template: PodTemplate, own: dict[str, str]) -> dict[str, str]:
    """The template's labels under the operator's own (which the API refuses to let a template set)."""
    return {**template.labels, **own}


def pod_annotations(template: PodTemplate, own: dict[str, str]) -> dict[str, str]:
    return {**template.annotations, **own}


# --- host network -----------------------------------------------------------------------------------------


def host_network_port(namespace: str, name: str, role: str, port_range: tuple[int, int]) -> int:
    """The metrics port of `role`'s pods of the StreamingTable `namespace/name` on the host network:
    deterministic, within `port_range` (inclusive), and the compaction pods' differs from the driver's."""
    first, last = port_range
    span = last - first + 1

    def hashed(which: str) -> int:
        digest = hashlib.sha256(f"{namespace}/{name}/{which}".encode()).digest()
        return first + int.from_bytes(digest[:8], "big") % span

    driver = hashed(DRIVER)
    if role == DRIVER:
        return driver
    other = hashed(role)
    return other if other != driver else first + (driver - first + 1) % span
