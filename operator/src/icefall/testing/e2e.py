"""The e2e harness's plain pieces (no fixtures): waiting on a condition, the real kubectl, the operator as a
process, and a namespace's catalog as pods reach it. e2e/conftest.py's fixtures are built from them, and so
is bench/executors.py, which drives the same cluster without pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

import icefall
from icefall.api import CatalogType, load_manifest
from icefall.catalog import CatalogConfig
from icefall.devstack.kube import KubeAPIServer
from icefall.devstack.objectstore import ObjectStore
from icefall.devstack.postgres import PostgresServer
from icefall.devstack.tools import tool_dir
from icefall.plan.env import secret_env_vars
from icefall.plan.grants import SECRET_GRANT_LABEL, SECRET_GRANT_VALUE
from icefall.testing.kubeapi import JsonApi
from icefall.testing.streams import manifest_text

T = TypeVar("T")
Obj = dict[str, Any]
#: The checkout's operator/src, the operator process's import root (this package's parent).
SOURCE_ROOT = Path(icefall.__file__).resolve().parents[1]


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float = 60,
    every: float = 0.5,
    details: Callable[[], str] | None = None,
) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `timeout` seconds, with
    `details()` (logs, status) as they are at that moment."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            more = f"\n{details()}" if details else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{more}")
        time.sleep(every)


class Kubectl:
    """The real kubectl (built next to kube-apiserver) with the kubeconfig of the cluster under test."""

    def __init__(self, kubeconfig: Path, home: Path) -> None:
        self.binary = str(tool_dir("ICEFALL_KUBE_BIN") / "kubectl")
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(home)}

    def __call__(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            [self.binary, *args], capture_output=True, text=True, env=self.env, timeout=90, check=False
        )
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stdout}{done.stderr}"
        out: str = done.stdout
        return out

    def following_logs(self, namespace: str, pod: str, path: Path) -> subprocess.Popen[bytes]:
        """`kubectl logs -f` of `pod` into `path`, until its container ends. A deleted pod's logs go with it:
        a test that deletes a pod and then checks how it ended follows its logs first."""
        with path.open("wb") as out:
            return subprocess.Popen(
                [self.binary, "-n", namespace, "logs", "-f", pod],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )


class Operator:
    """`python -m icefall.cli operator --namespace <ns>` in a subprocess, logging to a file."""

    def __init__(
        self, kube: KubeAPIServer, namespace: str, log: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.log = log
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kube.kubeconfig),
            "ICEFALL_RESYNC_SECONDS": "1",
            "ICEFALL_STATUS_SECONDS": "1",
            # Spark inside the driver pod, unless a module asks for executor pods.
            "ICEFALL_SPARK_MASTER": "local[1]",
            "PYTHONPATH": str(SOURCE_ROOT),
            **self.extra_env,
        }
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "icefall.cli", "operator", "--namespace", self.namespace],
                env=env, stdout=out, stderr=subprocess.STDOUT, cwd=self.log.parent,
            )  # fmt: skip

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def tail(self, lines: int = 40) -> str:
        """The last lines of its log, without kopf's per-pass "succeeded" lines (one a second here)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        kept = [line for line in text.splitlines() if not line.rstrip().endswith("succeeded.")]
        return "\n".join(kept[-lines:])


LAKE_SECRET = "lake"
#: secretProperties key → key in the Secret `lake`.
_LAKE_SECRET_KEYS = {
    "password": "password",
    "s3.access-key-id": "access-key-id",
    "s3.secret-access-key": "secret-access-key",
}


@dataclass(frozen=True)
class Lake:
    """A namespace's catalog: `block` is `spec.table.catalog` as a user writes it, `catalog` the test's own
    client (same catalog, secrets given), `variables` what the operator reads the secrets from."""

    block: Obj
    catalog: CatalogConfig
    variables: dict[str, str]


def make_lake(namespace: str, rest: JsonApi, postgres: PostgresServer, object_store: ObjectStore) -> Lake:
    """A catalog pods reach only over the network, as in a cluster: a PostgreSQL JDBC catalog (a database of
    the namespace's own) with the table files in a bucket of its own, credentials in a Secret `lake` of the
    namespace referenced by `secretProperties`."""
    database, bucket = namespace.replace("-", "_"), namespace
    postgres.create_database(database)
    object_store.create_bucket(bucket)
    store = object_store.properties()
    values = {
        "password": postgres.password,
        "s3.access-key-id": store["s3.access-key-id"],
        "s3.secret-access-key": store["s3.secret-access-key"],
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        # Granted to the namespace's StreamingTables (icefall.plan.grants), as an admin would.
        "metadata": {
            "name": LAKE_SECRET,
            "namespace": namespace,
            "labels": {SECRET_GRANT_LABEL: SECRET_GRANT_VALUE},
        },
        "stringData": {_LAKE_SECRET_KEYS[key]: value for key, value in values.items()},
    }
    rest.call("POST", f"/api/v1/namespaces/{namespace}/secrets", secret)
    block: Obj = {
        "name": "lake",
        "type": "sql",
        "uri": f"postgresql://{postgres.user}@{postgres.host}:{postgres.port}/{database}",
        "warehouse": f"s3://{bucket}/warehouse",
        "properties": {
            "s3.endpoint": store["s3.endpoint"],
            "s3.region": store["s3.region"],
            "s3.path-style-access": "true",
        },
        "secretProperties": {
            key: {"secretKeyRef": {"name": LAKE_SECRET, "key": name}}
            for key, name in _LAKE_SECRET_KEYS.items()
        },
    }
    catalog = CatalogConfig(
        name=block["name"],
        type=CatalogType.SQL,
        uri=block["uri"],
        warehouse=block["warehouse"],
        properties=block["properties"],
        secrets=values,
    )
    catalog.pyiceberg()  # creates the catalog's tables, which Spark's JdbcCatalog then uses as they are
    # The variable names the operator and its pods agree on, from a StreamingTable with this catalog.
    st: Obj = yaml.safe_load(manifest_text("lake", "lake", "127.0.0.1:9092"))
    st["spec"]["table"]["catalog"] = block
    names = {env.path: env.name for env in secret_env_vars(load_manifest(yaml.safe_dump(st)).spec)[1]}
    variables = {names[f"spec.table.catalog.secretProperties[{key}]"]: value for key, value in values.items()}
    return Lake(block=block, catalog=catalog, variables=variables)
