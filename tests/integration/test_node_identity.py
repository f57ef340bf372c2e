"""A table's pods cannot borrow the node's AWS role.

With the environment the operator plans for a table's driver (`icefall.plan.env.NODE_IDENTITY_OFF`),
neither AWS SDK a pod runs asks the instance metadata service for credentials: Java's (iceberg-aws-bundle,
whose default chain Iceberg's S3FileIO uses when a table references no keys) and C++'s (pyarrow's S3
client, under pyiceberg and the Delta log). Without it, both take the node's role: the test would fail.
The metadata service is a small server on loopback (`AWS_EC2_METADATA_SERVICE_ENDPOINT`) answering as
EC2's does (an IMDSv2 token, the role's name, its keys), counting every request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pyspark
import pytest

from icefall.api import StreamingTable
from icefall.plan.children import desired_children
from icefall.plan.settings import OperatorSettings
from icefall.spark.session import spark_jars

pytestmark = pytest.mark.integration

NODE_KEY = "NODEROLEKEY"

JAVA_PROBE = """
public class Probe {
  public static void main(String[] args) {
    try {
      var found = software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider.builder().build()
          .resolveCredentials();
      System.out.println("credentials " + found.accessKeyId());
    } catch (software.amazon.awssdk.core.exception.SdkClientException e) {
      System.out.println("none");
    }
  }
}
"""

PYARROW_PROBE = """
from pyarrow.fs import S3FileSystem
fs = S3FileSystem(endpoint_override="127.0.0.1:1", scheme="http", connect_timeout=1, request_timeout=1)
try:
    fs.get_file_info("bucket/key")  # credentials are resolved for the request's signature
except OSError:
    pass  # nothing listens on port 1: only the metadata service's log says what the client did
"""


class MetadataService(BaseHTTPRequestHandler):
    requests: ClassVar[list[str]] = []

    def _answer(self, body: str) -> None:
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:  # IMDSv2's session token
        self.requests.append(f"PUT {self.path}")
        self._answer("token")

    def do_GET(self) -> None:
        self.requests.append(f"GET {self.path}")
        if self.path.rstrip("/").endswith("/security-credentials"):
            self._answer("node-role")
        elif "/security-credentials/" in self.path:
            keys = {"Code": "Success", "AccessKeyId": NODE_KEY, "SecretAccessKey": "s", "Token": "t"}
            self._answer(json.dumps(keys | {"Expiration": "2099-01-01T00:00:00Z", "Type": "AWS-HMAC"}))
        else:
            self._answer("")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metadata_service() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), MetadataService)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def planned_driver_env(settings: OperatorSettings) -> dict[str, str]:
    """The literal variables of the driver pod the operator plans for a table with no storage keys."""
    st = StreamingTable.model_validate(
        {"metadata": {"name": "orders"}, "spec": {
            "source": {"bootstrapServers": "kafka:9092", "topic": "orders"},
            "format": {"schema": [{"name": "id", "type": "long"}]},
        }}
    )  # fmt: skip
    children = desired_children(
        st, namespace="shop", uid="u", generation=1, image="img:1", operator_settings=settings,
        compaction_replicas=1,
    )  # fmt: skip
    assert children.driver_pod is not None
    env = children.driver_pod["spec"]["containers"][0]["env"]
    return {e["name"]: e["value"] for e in env if "value" in e}


def run_probes(tmp_path: Path, endpoint: str, pod_env: dict[str, str]) -> dict[str, tuple[str, list[str]]]:
    """Each SDK's probe in the pod's environment: what it printed, and what it asked the metadata service."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    environ |= {"AWS_REGION": "us-east-1", "AWS_EC2_METADATA_SERVICE_ENDPOINT": endpoint} | pod_env
    environ["HOME"] = str(tmp_path)  # the pod's /tmp is not this machine's
    (tmp_path / "Probe.java").write_text(JAVA_PROBE)
    aws_bundle = next(jar for jar in spark_jars() if jar.name.startswith("iceberg-aws-bundle-"))
    classpath = [str(aws_bundle), *map(str, (Path(pyspark.__file__).parent / "jars").glob("slf4j-api-*.jar"))]
    probes = {
        "java": ["java", "-cp", os.pathsep.join(classpath), str(tmp_path / "Probe.java")],
        "pyarrow": [sys.executable, "-c", PYARROW_PROBE],
    }
    seen = {}
    for sdk, command in probes.items():
        MetadataService.requests = []
        done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, f"{sdk} probe failed: {done.stderr[-2000:]}"
        seen[sdk] = (done.stdout.strip(), list(MetadataService.requests))
    return seen


def test_table_pods_never_ask_the_instance_metadata_service_unless_the_operator_allows_it(
    tmp_path: Path, metadata_service: str
) -> None:
    planned = run_probes(tmp_path, metadata_service, planned_driver_env(OperatorSettings()))
    assert planned["java"] == ("none", [])
    assert planned["pyarrow"][1] == []

    allowed = OperatorSettings.from_environ({"ICEFALL_ALLOW_NODE_IDENTITY": "true"})
    node_role = run_probes(tmp_path, metadata_service, planned_driver_env(allowed))
    assert node_role["java"][0] == f"credentials {NODE_KEY}"
    for sdk in ("java", "pyarrow"):
        assert any("/security-credentials/node-role" in r for r in node_role[sdk][1]), node_role[sdk]
