"""One module names what Icefall puts in Kubernetes (`icefall.plan.names`).

Proves: every child, Lease and application name is deterministic and a valid object name of at most 63
characters, however long the table's name (a hash keeps long names apart); the Lease names are the ones
the pods, the operator's RBAC and the tests agree on; and no other runtime module builds a name or a label
key itself (an AST scan: an f-string that glues a value to `icefall-` or to a child or Lease suffix, or a
string `app.kubernetes.io/...`), except where named below with the reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from icefall.plan import names

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "src" / "icefall"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
SUFFIXES = ("-commit", "-yield", "-work-", "-ingest", "-compact", "-driver", "-leader", "-executor")
#: Modules allowed to write such strings, and why.
ALLOWED = {
    "icefall/plan/names.py": "the namer",
    "icefall/api/pods.py": "the labels a pod template may not set (api/ cannot import plan/)",
    "icefall/api/crd.py": "the CRD's own part-of label (api/ cannot import plan/)",
    "icefall/ingest/writer.py": "a Kafka consumer group id, not a Kubernetes name",
}


@pytest.mark.parametrize("table", ["orders", "a" * 40, "o" * 39 + "-"])
def test_child_names_are_dns_labels_of_at_most_63_characters(table: str) -> None:
    for name_of in (
        names.driver_pod_name,
        names.executor_template_name,
        names.compaction_name,
        names.driver_account_name,
        names.compaction_account_name,
    ):
        name = name_of(table)
        assert len(name) <= names.MAX_NAME_LENGTH and DNS_LABEL.match(name), name
        assert name == name_of(table)
    assert names.driver_pod_name("a" * 60 + "x") != names.driver_pod_name("a" * 60 + "y")


def test_lease_names() -> None:
    assert names.commit_lease_name("orders_eu_v2") == "icefall-orders-eu-v2-commit"
    assert names.rewrite_yield_name("orders_eu_v2") == "icefall-orders-eu-v2-yield"
    work = names.work_lease_name("Orders" * 20, {"kind": "ExpireSnapshots"})
    assert work.startswith("icefall-orders") and "-work-" in work
    assert len(work) <= names.MAX_NAME_LENGTH and DNS_LABEL.match(work)
    assert work != names.work_lease_name("Orders" * 20 + "x", {"kind": "ExpireSnapshots"})
    for lease in (names.commit_lease_name("x.y"), names.LEADER_LEASE_NAME):
        assert SUBDOMAIN.match(lease), lease
    with pytest.raises(ValueError, match="cannot derive"):
        names.commit_lease_name("___")


def test_spark_application_names() -> None:
    assert names.spark_app_name("orders") == "icefall-orders"
    assert names.spark_app_name("orders", names.COMPONENT_COMPACT) == "icefall-orders-compact"
    assert names.spark_app_name("orders", "verify") == "icefall-verify-orders"


def _builds_a_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith("app.kubernetes.io/")
    if not isinstance(node, ast.JoinedStr):
        return False
    parts = [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    glued = len(parts) < len(node.values)  # something is formatted into it
    return glued and any(p.startswith("icefall-") or p.startswith(SUFFIXES) for p in parts)


def test_no_other_runtime_module_names_things() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE.parent).as_posix()
        if module in ALLOWED or module.startswith(("icefall/devstack/", "icefall/testing/")):
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        found += [f"{module}:{node.lineno}" for node in ast.walk(tree) if _builds_a_name(node)]
    assert not found, "names built outside icefall.plan.names:\n" + "\n".join(found)
