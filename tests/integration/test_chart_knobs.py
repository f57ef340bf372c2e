"""The chart's day-two knobs, rendered by helm itself (`helm template`, values.schema.json included).

Proves:
- `watchNamespaces: [a, b]`: the operator gets `--namespace=a --namespace=b`; a Role and RoleBinding with
  the operator's whole rule set in each of them (the same rules as the default Role), none cluster-wide;
  the release namespace, unless listed, gets a Role for the operator's leader Lease alone (none without
  leader election); the admission
  policy bindings select exactly those namespaces and the PodMonitor scrapes them; a list together with
  `rbac.clusterWide` is refused at render time naming both, a name that is no namespace by the schema;
- `podSecurityContext` / `containerSecurityContext`: the defaults are the restricted ones; a key replaces
  its default alone; `null` removes one (OpenShift's arbitrary UIDs: no runAsUser, runAsGroup, fsGroup),
  from `--set` and from a values file; the schema refuses root, runAsNonRoot false and privilege;
- `podDisruptionBudget`: none with one replica (auto), one with `maxUnavailable: 1` selecting the
  operator's pods as soon as replicas > 1, always with `enabled: true`, never with `false`; `minAvailable`
  wins over `maxUnavailable`; percentages pass, other values are refused;
- `image.digest`: the operator, ICEFALL_IMAGE (every pod it runs) and the executors' admission policy
  use `repository@digest`, whatever the tag; a digest that is not sha256 is refused;
- `extraVolumes` / `extraVolumeMounts` reach the operator's pod after its own `tmp`; the operator's own
  volume name and /tmp are refused.
tests/integration/test_chart_package.py installs the packaged chart with these knobs on the real API
server (which validates every object) and checks the per-namespace RBAC there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefall.controller.reconcile import Config
from icefall.plan.names import LEADER_LEASE_NAME

from .test_chart import CHART, RELEASE, helm, kinds, only, render

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
WATCHED = ("--set-json", 'watchNamespaces=["team-a","team-b"]')
DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def refused(home: Path, *values: str) -> str:
    """helm's error for values the chart must refuse."""
    result = helm("template", RELEASE, str(CHART), *values, home=home, check=False)
    assert result.returncode != 0, f"accepted: {values}"
    return result.stderr


def pod_spec(docs: list[Obj]) -> Obj:
    spec: Obj = only(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def of_kind(docs: list[Obj], kind: str) -> dict[str, Obj]:
    """The objects of `kind`, by namespace and name."""
    return {f"{d['metadata'].get('namespace')}/{d['metadata']['name']}": d for d in docs if d["kind"] == kind}


def test_watch_namespaces_get_a_role_each_and_the_operator_watches_them(home: Path) -> None:
    docs = render(home, "ops", *WATCHED, "--set", "metrics.podMonitor.enabled=true")
    args = pod_spec(docs)["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in args
    assert not {"ClusterRole", "ClusterRoleBinding"} & set(kinds(docs))
    rules = only(render(home, "ops"), "Role")["rules"]  # the default Role's: the operator's whole rule set
    roles, bindings = of_kind(docs, "Role"), of_kind(docs, "RoleBinding")
    assert set(roles) == set(bindings) == {"team-a/icefall", "team-b/icefall", "ops/icefall-leader"}
    account = {"kind": "ServiceAccount", "name": RELEASE, "namespace": "ops"}
    for key in ("team-a/icefall", "team-b/icefall"):
        assert roles[key]["rules"] == rules
        assert bindings[key]["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": RELEASE,
        }
        assert bindings[key]["subjects"] == [account]
    # At home only the leader Lease: created (RBAC cannot name what is created), read and renewed by name.
    assert roles["ops/icefall-leader"]["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [LEADER_LEASE_NAME],
         "verbs": ["get", "update"]},
    ]  # fmt: skip
    assert bindings["ops/icefall-leader"]["subjects"] == [account]
    env = {e["name"]: e for e in pod_spec(docs)["containers"][0]["env"]}
    assert env["ICEFALL_POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    for binding in (d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"):
        assert binding["spec"]["matchResources"]["namespaceSelector"] == {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
            ]
        }
    assert only(docs, "PodMonitor")["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}

    # Listing the release namespace too: its Role is the full one, no separate leader Role; nor without
    # leader election (no Lease at all).
    docs = render(home, "ops", "--set-json", 'watchNamespaces=["ops","team-a"]')
    assert set(of_kind(docs, "Role")) == {"ops/icefall", "team-a/icefall"}
    alone = render(home, "ops", *WATCHED, "--set", "leaderElection.enabled=false")
    assert set(of_kind(alone, "Role")) == {"team-a/icefall", "team-b/icefall"}


def test_watch_namespaces_refuse_cluster_wide_and_bad_names(home: Path) -> None:
    message = refused(home, *WATCHED, "--set", "rbac.clusterWide=true")
    assert "rbac.clusterWide" in message and "watchNamespaces" in message, message
    assert "/watchNamespaces/0" in refused(home, "--set-json", 'watchNamespaces=["Team_A"]')


OPENSHIFT = {"podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None}}


def test_security_contexts_override_and_remove_keys(home: Path, tmp_path: Path) -> None:
    default = pod_spec(render(home, "ops"))
    assert default["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert default["containers"][0]["securityContext"] == {
        "runAsNonRoot": True, "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    # OpenShift's restricted-v2: the platform picks the user and groups; the rest stays.
    values = tmp_path / "openshift.yaml"
    values.write_text(yaml.safe_dump(OPENSHIFT))
    nulls = [f"podSecurityContext.{key}=null" for key in OPENSHIFT["podSecurityContext"]]
    for args in (("-f", str(values)), tuple(a for n in nulls for a in ("--set", n))):
        pod = pod_spec(render(home, "ops", *args))
        assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["containers"][0]["securityContext"] == default["containers"][0]["securityContext"]
    changed = pod_spec(render(home, "ops", "--set", "podSecurityContext.runAsUser=2000", "--set",
                              "containerSecurityContext.readOnlyRootFilesystem=false"))  # fmt: skip
    assert changed["securityContext"] == {**default["securityContext"], "runAsUser": 2000}
    assert changed["containers"][0]["securityContext"] == {
        **default["containers"][0]["securityContext"],
        "readOnlyRootFilesystem": False,
    }
    for key, value in (
        ("podSecurityContext.runAsUser", "0"),
        ("podSecurityContext.runAsNonRoot", "false"),
        ("containerSecurityContext.privileged", "true"),
        ("podSecurityContext.runAsUsr", "1"),
    ):
        message = refused(home, "--set", f"{key}={value}")
        assert "schema" in message and key.rsplit(".", 1)[1] in message, message


def test_pod_disruption_budget_with_standbys_or_when_asked(home: Path) -> None:
    assert "PodDisruptionBudget" not in kinds(render(home, "ops"))
    docs = render(home, "ops", "--set", "replicas=2")
    budget = only(docs, "PodDisruptionBudget")
    assert budget["metadata"]["namespace"] == "ops"
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    deployment = only(docs, "Deployment")
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"][
        "labels"].items()  # fmt: skip
    assert only(render(home, "ops", "--set", "podDisruptionBudget.enabled=true"), "PodDisruptionBudget")
    never = render(home, "ops", "--set", "replicas=3", "--set", "podDisruptionBudget.enabled=false")
    assert "PodDisruptionBudget" not in kinds(never)
    kept = only(render(home, "ops", "--set", "replicas=3", "--set", "podDisruptionBudget.minAvailable=2"),
                "PodDisruptionBudget")["spec"]  # fmt: skip
    assert kept["minAvailable"] == 2 and "maxUnavailable" not in kept
    share = render(
        home, "ops", "--set", "replicas=2", "--set-string", "podDisruptionBudget.maxUnavailable=50%"
    )
    assert only(share, "PodDisruptionBudget")["spec"]["maxUnavailable"] == "50%"
    assert "/podDisruptionBudget/enabled" in refused(home, "--set", "podDisruptionBudget.enabled=maybe")
    assert "/podDisruptionBudget/maxUnavailable" in refused(
        home, "--set-string", "podDisruptionBudget.maxUnavailable=half"
    )


def test_image_digest_wins_over_the_tag_everywhere(home: Path) -> None:
    docs = render(home, "ops", "--set", f"image.digest={DIGEST}", "--set", "image.tag=ignored")
    container = pod_spec(docs)["containers"][0]
    pinned = f"ghcr.io/icefall-dev/icefall@{DIGEST}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["image"] == env["ICEFALL_IMAGE"] == pinned
    assert Config.from_env({k: v for k, v in env.items() if v is not None}).image == pinned
    executors = next(d for d in docs if d["metadata"]["name"] == "icefall-ops-executors")["spec"]
    images = {v["name"]: v["expression"] for v in executors["variables"]}["images"]
    assert json.loads(images) == [pinned]
    assert "/image/digest" in refused(home, "--set", "image.digest=md5:abc")


def test_extra_volumes_and_mounts_reach_the_operator(home: Path) -> None:
    volumes = [{"name": "private-ca", "configMap": {"name": "private-ca"}}]
    mounts = [{"name": "private-ca", "mountPath": "/etc/icefall/ca", "readOnly": True}]
    pod = pod_spec(render(
        home, "ops", "--set-json", f"extraVolumes={json.dumps(volumes)}",
        "--set-json", f"extraVolumeMounts={json.dumps(mounts)}",
    ))  # fmt: skip
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}, *volumes]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}, *mounts]
    assert "/extraVolumes/0/name" in refused(
        home, "--set-json", 'extraVolumes=[{"name":"tmp","emptyDir":{}}]'
    )
    assert "/extraVolumeMounts/0/mountPath" in refused(
        home, "--set-json", 'extraVolumeMounts=[{"name":"x","mountPath":"/tmp/ca"}]'
    )
