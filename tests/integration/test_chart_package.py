"""`make chart` packages charts/icefall, and the package installs on a real API server.

Proves:
- `make chart` lints the chart and writes dist/icefall-<version>.tgz (here into a temporary CHART_DIST,
  so the checkout is not written to): the package holds the CRD byte for byte as crds/ has it, and `helm
  show crds` gives it back (what an upgrade applies before `helm upgrade`); with the chart's CRD copy
  drifted from crds/ it refuses, naming `make crds chart-crds`, before packaging anything;
- `helm template` of the package renders the CRD (`--include-crds`) and the operator with the release's
  image, which is the operator's own DEFAULT_IMAGE; the chart refuses Kubernetes 1.29 and takes 1.30
  (`kubeVersion`);
- `helm install` of the package on the real kube-apiserver (which validates every object: the
  PodDisruptionBudget, the pod with extra volumes and OpenShift's security context without user and
  groups) with `watchNamespaces` of two namespaces: as the operator's ServiceAccount, RBAC lets it make
  every call the operator makes (tests/integration/test_chart.py `OPERATOR_CALLS`) in both, only its
  leader Lease in the release namespace, and nothing in a namespace not listed; the install's NOTES point
  at examples/cluster.yaml (a cluster's example), in a watched namespace, never at examples/orders.yaml.
Not proved: that the operator runs from the package (no kubelet here: e2e/test_user_path.py installs the
chart on the e2e cluster); pushing to an OCI registry (none runs here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefall.controller.reconcile import DEFAULT_IMAGE
from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.tools import tool_dir
from icefall.plan.names import LEADER_LEASE_NAME
from icefall.testing.harness import make_chart

from .test_chart import CRD_FILE, OPERATOR_CALLS, ROOT, helm, kinds, kubectl, only

pytestmark = pytest.mark.integration

CHART_YAML = yaml.safe_load((ROOT / "charts" / "icefall" / "Chart.yaml").read_text())
PACKAGE = f"icefall-{CHART_YAML['version']}.tgz"
HOME_NS, TEAMS, OTHER = "pkg-home", ("pkg-team-a", "pkg-team-b"), "pkg-other"
DIGEST = "sha256:" + "ab" * 32
Obj = dict[str, Any]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


@pytest.fixture(scope="module")
def package(home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    made = make_chart(ROOT, dist, home)
    assert made.returncode == 0, made.stdout + made.stderr
    assert [p.name for p in dist.iterdir()] == [PACKAGE], made.stdout
    return dist / PACKAGE


def test_make_chart_packages_the_chart_with_its_crd(package: Path, home: Path) -> None:
    with tarfile.open(package) as archive:
        names = archive.getnames()
        crd = archive.extractfile(f"icefall/crds/{CRD_FILE}")
        assert crd is not None
        assert crd.read() == (ROOT / "crds" / CRD_FILE).read_bytes()
        chart = archive.extractfile("icefall/Chart.yaml")
        assert chart is not None and yaml.safe_load(chart.read()) == CHART_YAML
    assert "icefall/values.schema.json" in names and "icefall/templates/NOTES.txt" in names
    shown = helm("show", "crds", str(package), home=home).stdout
    assert [d for d in yaml.safe_load_all(shown) if d] == [
        yaml.safe_load((ROOT / "crds" / CRD_FILE).read_text())
    ]

    docs = helm("template", "icefall", str(package), "-n", "ops", "--include-crds", home=home).stdout
    rendered = [d for d in yaml.safe_load_all(docs) if d]
    assert "CustomResourceDefinition" in kinds(rendered)
    (container,) = only(rendered, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == DEFAULT_IMAGE == f"ghcr.io/icefall-dev/icefall:{CHART_YAML['appVersion']}"

    old = helm("template", "icefall", str(package), "--kube-version", "1.29.0", home=home, check=False)
    assert old.returncode != 0 and "incompatible with Kubernetes v1.29.0" in old.stderr, old.stderr
    helm("template", "icefall", str(package), "--kube-version", "1.30.0", home=home)


def test_make_chart_refuses_a_drifted_crd_copy(home: Path, tmp_path: Path) -> None:
    """On a copy of what the target reads: it stops at the comparison, before any tool runs."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    shutil.copytree(ROOT / "crds", tmp_path / "crds")
    shutil.copytree(ROOT / "charts", tmp_path / "charts")
    copy = tmp_path / "charts" / "icefall" / "crds" / CRD_FILE
    copy.write_text(copy.read_text() + "# edited\n")
    made = make_chart(tmp_path, tmp_path / "dist", home)
    assert made.returncode != 0 and "run make crds chart-crds" in made.stderr, made.stderr
    assert not (tmp_path / "dist").exists()


#: `kubectl auth can-i --list` rows: resource, non-resource URLs, resource names, verbs.
_ROW = re.compile(r"^(\S+)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*$")


def allowed(kube: KubeAPIServer, home: Path, account: str, namespace: str) -> set[tuple[str, str, str]]:
    """(resource.group[/subresource], verb, resource name or '*') the account may do in `namespace`."""
    listed = kubectl("auth", "can-i", "--list", f"--as={account}", "-n", namespace, kube=kube, home=home)
    found = set()
    for line in listed.splitlines()[1:]:
        if line[:1].isspace():
            continue  # a non-resource URL
        match = _ROW.match(line)
        assert match, line
        resource, _, names, verbs = match.groups()
        for verb in verbs.split():
            for name in names.split() or ["*"]:
                found.add((resource, verb, name))
    return found


def calls(rules: list[Obj]) -> set[tuple[str, str, str]]:
    """`rules` as can-i rows: `pods` in the core group, `leases.coordination.k8s.io`, ...; any name."""
    wanted = set()
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                plural, _, sub = resource.partition("/")
                shown = f"{plural}.{group}" if group else plural
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or ["*"]:
                        wanted.add((f"{shown}/{sub}" if sub else shown, verb, name))
    return wanted


@pytest.fixture(scope="module")
def installed(
    package: Path, kube: KubeAPIServer, home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """The package installed with the day-two knobs; its NOTES."""
    for namespace in (HOME_NS, *TEAMS, OTHER):
        kubectl("create", "namespace", namespace, kube=kube, home=home)
    values = tmp_path_factory.mktemp("values") / "values.yaml"
    values.write_text(yaml.safe_dump({
        "watchNamespaces": list(TEAMS),
        "replicas": 2,
        "image": {"digest": DIGEST},
        "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
        "extraVolumes": [{"name": "private-ca", "configMap": {"name": "private-ca", "optional": True}}],
        "extraVolumeMounts": [{"name": "private-ca", "mountPath": "/etc/icefall/ca", "readOnly": True}],
    }))  # fmt: skip
    env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(kube.kubeconfig)}
    install = subprocess.run(
        [str(tool_dir("ICEFALL_HELM_BIN") / "helm"), "install", "icefall", str(package), "-n", HOME_NS,
         "-f", str(values)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    try:
        yield install.stdout
    finally:
        subprocess.run(
            [str(tool_dir("ICEFALL_HELM_BIN") / "helm"), "uninstall", "icefall", "-n", HOME_NS],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip


def test_the_package_installs_with_a_role_in_each_watched_namespace(
    installed: str, kube: KubeAPIServer, home: Path
) -> None:
    account = f"system:serviceaccount:{HOME_NS}:icefall"
    operator = calls(OPERATOR_CALLS)
    for namespace in TEAMS:
        missing = operator - allowed(kube, home, account, namespace)
        assert not missing, f"{namespace}: the operator may not {sorted(missing)}"
    lease = "leases.coordination.k8s.io"
    at_home = allowed(kube, home, account, HOME_NS)
    assert {
        (lease, "create", "*"),
        (lease, "get", LEADER_LEASE_NAME),
        (lease, "update", LEADER_LEASE_NAME),
    } <= at_home
    assert not {call for call in operator if call[0] != lease} & at_home, (
        "the release namespace is not watched"
    )
    assert not operator & allowed(kube, home, account, OTHER)

    budget = yaml.safe_load(
        kubectl("-n", HOME_NS, "get", "pdb", "icefall", "-o", "yaml", kube=kube, home=home)
    )
    assert budget["spec"]["maxUnavailable"] == 1
    deployment = yaml.safe_load(
        kubectl("-n", HOME_NS, "get", "deployment", "icefall", "-o", "yaml", kube=kube, home=home)
    )
    pod = deployment["spec"]["template"]["spec"]
    assert "runAsUser" not in pod["securityContext"] and pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["image"] == f"ghcr.io/icefall-dev/icefall@{DIGEST}"
    assert [a for a in pod["containers"][0]["args"] if a.startswith("--namespace")] == [
        f"--namespace={ns}" for ns in TEAMS
    ]

    notes = installed.split("NOTES:", 1)[1]
    assert "examples/cluster.yaml" in notes and "orders.yaml" not in notes, notes
    assert f"kubectl -n {TEAMS[0]} apply -f cluster.yaml" in notes, notes
    assert f"It watches StreamingTables in {', '.join(TEAMS)}" in notes, notes
    assert "helm show crds" in notes and "kubectl apply --server-side --force-conflicts" in notes, notes
