"""The image's entry point (`icefall.spark.entrypoint`) builds the executor JVM's command line from the
variables Spark sets on executor pods, as Spark's `/opt/entrypoint.sh executor` does: JVM options in the
order of their index (not of their names), heap from SPARK_EXECUTOR_MEMORY, the conf dir and both jar
folders on the class path; and it says which variable is missing instead of starting a broken JVM.
e2e/test_spark_on_kubernetes.py runs it in the image as executor pods' entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    assert argv[:6] == ["/jdk/bin/java", "-Dzero", "-Dtwo", "-Dten", "-Xms512m", "-Xmx512m"]
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
