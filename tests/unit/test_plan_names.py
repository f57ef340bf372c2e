"""One module names what Icefall puts in Kubernetes (`icefall.plan.names`).

Proves: every child, Lease and application name is deterministic and a valid object name of at most 63
characters, however long the table's name (a hash keeps long names apart); Lease names are keyed by the
table's whole identity (catalog, Iceberg namespace, table), so same-named tables never share one; work
items spread over a fixed pool of work Leases; and no other runtime module builds a name or a label
key itself (an AST scan: an f-string that glues a value to `icefall-` or to a child or Lease suffix, or a
string `app.kubernetes.io/...`), except where named below with the reason.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from icefall.api import StreamingTable
from icefall.plan import names
from icefall.plan.names import TableIdentity, TableLeases, table_leases

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


def identity(
    table: str = "orders", namespace: str = "sales", catalog: str = "", uri: str = ""
) -> TableIdentity:
    return TableIdentity(catalog=catalog, catalog_uri=uri, namespace=namespace, table=table)


def test_lease_names_are_keyed_by_the_whole_table_identity() -> None:
    leases = TableLeases(identity())
    assert re.fullmatch(r"icefall-orders-[0-9a-f]{8}-commit", leases.commit), leases.commit
    assert leases.rewrite_yield == leases.commit.removesuffix("-commit") + "-yield"
    assert leases.work[0] == leases.commit.removesuffix("-commit") + "-work-00"
    assert len(leases.work) == names.WORK_LEASE_SLOTS == len(set(leases.work))
    # The same bare name in another Iceberg namespace, or in another catalog, is another table.
    others = [
        identity(namespace="staging"),
        identity(catalog="lake"),
        identity(catalog="lake", uri="postgresql://a:5432/iceberg"),
        identity(catalog="lake", uri="postgresql://b:5432/iceberg"),
    ]
    commits = {leases.commit, *(TableLeases(other).commit for other in others)}
    assert len(commits) == 1 + len(others)
    work = {name for other in [identity(), *others] for name in TableLeases(other).work}
    assert len(work) == names.WORK_LEASE_SLOTS * (1 + len(others))
    assert TableLeases(identity()) == leases  # deterministic


@pytest.mark.parametrize("table", ["orders_eu_v2", "o" * 63, "A_" * 40, "___"])
def test_lease_names_are_dns_labels_of_at_most_63_characters(table: str) -> None:
    leases = TableLeases(identity(table))
    for name in (leases.commit, leases.rewrite_yield, *leases.work, names.LEADER_LEASE_NAME):
        assert len(name) <= names.MAX_NAME_LENGTH and DNS_LABEL.match(name), name
    assert TableLeases(identity(table + "x")).commit != leases.commit


def test_work_items_spread_over_the_pool_and_keep_their_slot() -> None:
    leases = TableLeases(identity())
    keys = [f'{{"kind": "CompactPartition", "partition": "({n},)", "step": 1}}' for n in range(200)]
    slots = [leases.work_for(key) for key in keys]
    assert set(slots) == set(leases.work)  # every slot in use
    assert slots == [leases.work_for(key) for key in keys]


def test_the_legacy_commit_lease_name_is_the_bare_table_name() -> None:
    """What versions before identity-keyed names used; None where they could not have made one."""
    assert TableLeases(identity("orders_eu_v2")).legacy_commit == "icefall-orders-eu-v2-commit"
    assert TableLeases(identity("orders", "staging")).legacy_commit == "icefall-orders-commit"
    assert TableLeases(identity("o" * 60)).legacy_commit is None
    assert TableLeases(identity("___")).legacy_commit is None


def test_the_identity_of_a_streaming_table() -> None:
    body = {
        "apiVersion": "icefall.dev/v1alpha1",
        "kind": "StreamingTable",
        "metadata": {"name": "orders-eu"},
        "spec": {
            "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
            "format": {"schema": [{"name": "id", "type": "long"}]},
            "table": {"namespace": "shop.eu"},
        },
    }
    st = StreamingTable.model_validate(body)
    assert TableIdentity.of(st) == TableIdentity("", "", "shop.eu", "orders_eu")
    body["spec"]["table"]["catalog"] = {"name": "lake", "type": "rest", "uri": "http://catalog:8181"}
    st = StreamingTable.model_validate(body)
    assert TableIdentity.of(st) == TableIdentity("lake", "http://catalog:8181", "shop.eu", "orders_eu")
    assert table_leases(st) == TableLeases(TableIdentity.of(st))


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
