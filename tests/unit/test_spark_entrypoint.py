"""The image's entry point (`icefall.spark.entrypoint`) builds the executor JVM's command line from the
variables Spark sets on executor pods, as Spark's `/opt/entrypoint.sh executor` does: JVM options in the
order of their index (not of their names), heap from SPARK_EXECUTOR_MEMORY, the conf dir and both jar
folders on the class path; and it says which variable is missing instead of starting a broken JVM. The
JVM also gets a `k8s://` master of its own (the API server's in-cluster address), without which Spark's
executor cannot read the table's RPC secret file before it has the driver's conf, and the authentication
options Spark passes in SPARK_JAVA_OPT_<n> reach it as they are.
e2e/test_spark_on_kubernetes.py runs it in the image as executor pods' entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from icefall.plan.isolation import SPARK_AUTH_FILE, spark_auth_conf
from icefall.spark.entrypoint import EXECUTOR_BACKEND, executor_command

pytestmark = pytest.mark.unit

POD = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@127.3.4.5:7078",
    "SPARK_EXECUTOR_ID": "3",
    "SPARK_EXECUTOR_CORES": "1",
    "SPARK_EXECUTOR_MEMORY": "512m",
    "SPARK_APPLICATION_ID": "spark-abc",
    "SPARK_EXECUTOR_POD_IP": "127.9.9.9",
    "SPARK_EXECUTOR_POD_NAME": "t-ingest-exec-3",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    "SPARK_CONF_DIR": "/opt/spark/conf",
    "SPARK_JAVA_OPT_10": "-Dten",
    "SPARK_JAVA_OPT_2": "-Dtwo",
    "SPARK_JAVA_OPT_0": "-Dzero",
    "ICEFALL_SPARK_JARS": "/cache/jars",
    "JAVA_HOME": "/jdk",
}


def test_executor_command_line() -> None:
    argv = executor_command(POD, Path("/venv/pyspark/jars"))
    assert argv[:7] == [
        "/jdk/bin/java",
        "-Dzero",
        "-Dtwo",
        "-Dten",
        "-Dspark.master=k8s://https://kubernetes.default.svc",  # no KUBERNETES_SERVICE_HOST here
        "-Xms512m",
        "-Xmx512m",
    ]
    classpath = argv[argv.index("-cp") + 1].split(":")
    assert classpath[:3] == ["/opt/spark/conf", "/venv/pyspark/jars/*", "/cache/jars/*"]
    tail = argv[argv.index(EXECUTOR_BACKEND) + 1 :]
    assert dict(zip(tail[::2], tail[1::2], strict=True)) == {
        "--driver-url": POD["SPARK_DRIVER_URL"],
        "--executor-id": "3",
        "--cores": "1",
        "--app-id": "spark-abc",
        "--hostname": "127.9.9.9",
        "--resourceProfileId": "0",
        "--podName": "t-ingest-exec-3",
    }


def test_a_missing_variable_is_named() -> None:
    with pytest.raises(SystemExit, match="SPARK_DRIVER_URL, SPARK_APPLICATION_ID not set"):
        executor_command(
            {k: v for k, v in POD.items() if k not in {"SPARK_DRIVER_URL", "SPARK_APPLICATION_ID"}},
            Path("/j"),
        )


def test_the_executor_jvm_can_read_the_tables_rpc_secret_file_at_its_start() -> None:
    """What Spark's executor needs before it has the driver's conf (module doc): `spark.authenticate` and
    the secret file's path from the driver (as Spark renders them into SPARK_JAVA_OPT_<n>) and a k8s://
    master, here the API server's address the kubelet gives every container."""
    auth = [f"-D{key}={value}" for key, value in spark_auth_conf().items()]
    pod = {
        **{name: value for name, value in POD.items() if not name.startswith("SPARK_JAVA_OPT_")},
        **{f"SPARK_JAVA_OPT_{index}": option for index, option in enumerate(auth)},
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
    }
    argv = executor_command(pod, Path("/j"))
    options = argv[1 : argv.index("-Xms512m")]
    assert options == [*auth, "-Dspark.master=k8s://https://10.96.0.1:443"]
    assert "-Dspark.authenticate=true" in options
    assert f"-Dspark.authenticate.secret.file={SPARK_AUTH_FILE}" in options


def test_a_master_spark_passes_is_kept() -> None:
    argv = executor_command({**POD, "SPARK_JAVA_OPT_3": "-Dspark.master=k8s://https://api:6443"}, Path("/j"))
    assert [option for option in argv if option.startswith("-Dspark.master=")] == [
        "-Dspark.master=k8s://https://api:6443"
    ]
