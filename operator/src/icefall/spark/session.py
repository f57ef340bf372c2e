"""Build the one long-lived SparkSession a process uses, with Icefall's jars and catalogs.

Spark session start costs seconds, so callers keep it for their life (tests share one per run).
The jars are the list in `spark_images/pom.xml`, resolved into a folder (ICEFALL_SPARK_JARS).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from icefall.catalog import CatalogConfig
from icefall.devstack.tools import jar_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_conf(
    catalogs: Iterable[CatalogConfig], *, master: str, app_name: str, driver_memory: str = "1g"
) -> dict[str, str]:
    conf = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.jars": ",".join(str(jar) for jar in jar_files("ICEFALL_SPARK_JARS")),
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        "spark.driver.memory": driver_memory,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "true",
    }
    if master.startswith("local"):
        # One machine: keep the driver's RPC and block manager on loopback, not the host's interface.
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.driver.host"] = "127.0.0.1"
    for catalog in catalogs:
        conf.update(catalog.spark_conf())
    return conf


def build_spark_session(
    catalogs: Iterable[CatalogConfig],
    *,
    master: str = "local[2]",
    app_name: str = "icefall",
    extra_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    from pyspark.sql import SparkSession

    # Executors (local or remote) must run the same Python as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in {
        **spark_conf(catalogs, master=master, app_name=app_name),
        **(extra_conf or {}),
    }.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
