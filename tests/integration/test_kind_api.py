"""`make e2e-kind`'s objects are accepted by a real kube-apiserver, though the kind run itself needs Docker.

Proves: hack/kind/kafka.yaml and hack/kind/lake.yaml (their Namespaces created for real, everything else
`--dry-run=server`), the chart rendered with examples/cluster-values.yaml plus hack/kind/values.yaml (what
e2e/test_user_path.py installs it with on kind, less its test-only settings), and examples/cluster.yaml
(after the CRD) all pass the API server's validation; the operator Deployment rendered with those values runs
the icefall:e2e image, never pulled, with no table credential in its environment. Not proved: that the
images build or the pods start (tests/unit/test_kind_manifests.py lints the rest).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.tools import tool_dir

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KIND = ROOT / "hack" / "kind"
NAMESPACE = "icefall-kind"  # the release namespace here (the kind run uses `icefall`)


def run(
    tool: str, *args: str, kube: KubeAPIServer, home: Path, stdin: str | None = None, check: bool = True
) -> str:
    env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(kube.kubeconfig)}
    done = subprocess.run(
        [tool, *args], input=stdin, capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0 or not check, f"{tool} {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout if done.returncode == 0 else ""


def test_the_kind_objects_pass_the_api_servers_validation(
    kube: KubeAPIServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    home = tmp_path_factory.mktemp("kind-api")
    kubectl = str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl")
    helm = str(tool_dir("ICEFALL_HELM_BIN") / "helm")
    docs = [d for name in ("kafka.yaml", "lake.yaml") for d in yaml.safe_load_all((KIND / name).read_text())]
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    others = [d for d in docs if d["kind"] != "Namespace"]
    run(
        kubectl,
        "apply",
        "--server-side",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(namespaces),
        kube=kube,
        home=home,
    )
    run(kubectl, "create", "namespace", NAMESPACE, kube=kube, home=home)
    dry_run = ("apply", "--server-side", "--dry-run=server", "-f", "-")
    out = run(kubectl, *dry_run, stdin=yaml.safe_dump_all(others), kube=kube, home=home)
    assert out.count("serverside-applied (server dry run)") == len(others), out

    rendered = run(
        helm, "template", "icefall", str(ROOT / "charts" / "icefall"), "--namespace", NAMESPACE,
        "--values", str(ROOT / "examples" / "cluster-values.yaml"), "--values", str(KIND / "values.yaml"),
        kube=kube, home=home,
    )  # fmt: skip
    chart: list[dict[str, Any]] = [d for d in yaml.safe_load_all(rendered) if d]
    run(kubectl, *dry_run, stdin=rendered, kube=kube, home=home)
    (deployment,) = [d for d in chart if d["kind"] == "Deployment"]
    (operator,) = deployment["spec"]["template"]["spec"]["containers"]
    assert (operator["image"], operator["imagePullPolicy"]) == ("icefall:e2e", "Never")
    # The operator holds no table credential (its pods and the purge Job get them).
    assert not [e for e in operator["env"] if "secretKeyRef" in e.get("valueFrom", {})]

    run(kubectl, "apply", "--server-side", "-f", str(ROOT / "crds"), kube=kube, home=home)
    # Right after the apply, `kubectl wait` fails on a CRD without status.conditions yet: retry.
    established = ("wait", "--for=condition=Established", "crd/streamingtables.icefall.dev", "--timeout=30s")
    deadline = time.monotonic() + 60
    while not run(kubectl, *established, kube=kube, home=home, check=time.monotonic() > deadline):
        time.sleep(0.5)
    example = (ROOT / "examples" / "cluster.yaml").read_text()
    run(kubectl, "-n", NAMESPACE, *dry_run, stdin=example, kube=kube, home=home)
