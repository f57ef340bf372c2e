"""The CRD upgrade step on a real kube-apiserver: from the previous release's CRD, as `helm install` left
it, to this one with `kubectl apply --server-side --force-conflicts`.

Proves:
- Helm creates the CRD of a chart's crds/ with an update (field manager `helm`) and `.spec.versions` is
  one atomic field: the upgrade's `kubectl apply --server-side` is refused as a conflict with "helm"
  unless `--force-conflicts`, which replaces the whole schema (no enum left on a condition's reason);
- the previous CRD (tests/fixtures/streamingtables.icefall.dev-5a40850.yaml: reasons an enum) refuses a
  condition reason it does not know, this one stores it: an operator newer than its CRD no longer has
  its status writes refused;
- a StreamingTable stored under the previous CRD keeps its uid, generation and spec across the upgrade
  (plus the defaults added since, applied on read: `table.format: iceberg`) and reads back through this
  release's models.
The whole upgrade, with a table running and `helm upgrade`: e2e/test_chart_upgrade.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from icefall.api import (
    Condition,
    ConditionReason,
    ConditionStatus,
    ConditionType,
    StreamingTableStatus,
    streaming_table_from_object,
)
from icefall.api.crd import CRD_NAME
from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.tools import tool_dir

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS_CRD = ROOT / "tests" / "fixtures" / "streamingtables.icefall.dev-5a40850.yaml"
CRD = ROOT / "crds" / "streamingtables.icefall.dev.yaml"
NAMESPACE, NAME = "crd-upgrade", "orders"
NEWER_REASON = "ReasonOfANewerRelease"
Obj = dict[str, Any]


class Kubectl:
    def __init__(self, kube: KubeAPIServer, home: Path) -> None:
        self.binary = str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl")
        self.env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "HOME": str(home)}

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, *args], input=stdin, env=self.env, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        done = self.run(*args, stdin=stdin)
        assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stdout}{done.stderr}"
        return done.stdout


def reason_schema(kubectl: Kubectl) -> Obj:
    crd = json.loads(kubectl("get", "crd", CRD_NAME, "-o", "json"))
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    found: Obj = schema["properties"]["status"]["properties"]["conditions"]["items"]["properties"]["reason"]
    return found


def status_with(reason: str) -> str:
    """A status patch: this release's Ready condition with `reason` written in."""
    ready = Condition(
        type=ConditionType.READY, status=ConditionStatus.TRUE, reason=ConditionReason.RUNNING,
        last_transition_time=datetime(2026, 1, 1, tzinfo=UTC), observed_generation=1,
    )  # fmt: skip
    status = StreamingTableStatus(observed_generation=1, conditions=[ready])
    body = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    body["conditions"][0]["reason"] = reason
    return json.dumps({"status": body})


def patch_status(kubectl: Kubectl, reason: str, *, dry_run: bool) -> subprocess.CompletedProcess[str]:
    return kubectl.run(
        "-n", NAMESPACE, "patch", "st", NAME, "--subresource=status", "--type=merge",
        "-p", status_with(reason), *(["--dry-run=server"] if dry_run else []),
    )  # fmt: skip


def until(what: str, check: Any, timeout: float = 30) -> None:
    """The API server serves a changed CRD's schema a moment after the change: wait for it."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_the_upgrade_step_replaces_helms_crd_and_accepts_newer_reasons(
    kube: KubeAPIServer, tmp_path: Path
) -> None:
    kubectl = Kubectl(kube, tmp_path)
    try:
        # What `helm install` of the previous chart left: its CRD, created by Helm (an update as "helm").
        kubectl("apply", "--server-side", "-f", str(CRD))  # present already when other tests ran first
        # Right after a create the API server writes the CRD's conditions: a replace may meet a conflict.
        as_helm = ("replace", "--field-manager=helm", "-f", str(PREVIOUS_CRD))
        until("kubectl replace of the CRD as Helm", lambda: kubectl.run(*as_helm).returncode == 0)
        assert "enum" in reason_schema(kubectl)
        kubectl("create", "namespace", NAMESPACE)
        table = yaml.safe_load((ROOT / "examples" / "orders.yaml").read_text())
        table["metadata"] = {"name": NAME, "namespace": NAMESPACE}
        stored = json.loads(kubectl("create", "-f", "-", "-o", "json", stdin=json.dumps(table)))
        assert patch_status(kubectl, "Running", dry_run=False).returncode == 0
        until("the previous CRD to refuse a reason it does not know",
              lambda: patch_status(kubectl, NEWER_REASON, dry_run=True).returncode != 0)  # fmt: skip
        refused = patch_status(kubectl, NEWER_REASON, dry_run=True)
        assert f'reason: Unsupported value: "{NEWER_REASON}"' in refused.stderr, refused.stderr

        # The upgrade step. Without --force-conflicts: refused, the schema is Helm's field.
        plain = kubectl.run("apply", "--server-side", "-f", str(CRD))
        assert plain.returncode != 0 and 'conflict with "helm"' in plain.stderr, plain.stderr
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
        reason = reason_schema(kubectl)
        assert "enum" not in reason and "pattern" in reason, reason
        until("the new CRD to store a newer operator's reason",
              lambda: patch_status(kubectl, NEWER_REASON, dry_run=True).returncode == 0)  # fmt: skip
        assert patch_status(kubectl, NEWER_REASON, dry_run=False).returncode == 0
        assert patch_status(kubectl, "not CamelCase", dry_run=True).returncode != 0

        after = json.loads(kubectl("-n", NAMESPACE, "get", "st", NAME, "-o", "json"))
        for key in ("uid", "generation"):
            assert after["metadata"][key] == stored["metadata"][key], key
        # The same spec, plus the defaults this release's CRD added since (the API server applies them on
        # read, without a new generation): an object stored before still means what it meant.
        defaulted = {
            **stored["spec"],
            "table": {**stored["spec"]["table"], "format": "iceberg"},
            "batch": {**stored["spec"]["batch"], "maxCollectBytes": 64 << 20},
        }
        assert after["spec"] == defaulted
        assert after["status"]["conditions"][0]["reason"] == NEWER_REASON
        after["status"] = {}  # a newer operator's reason is not this release's to read
        assert streaming_table_from_object(after).metadata.name == NAME
    finally:
        # The session's other tests use this release's CRD: put it back whatever happened.
        kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
        kubectl.run("delete", "namespace", NAMESPACE, "--wait=false")
