"""The JVM jar list is one list: its Spark version is the pyspark version every machine installs, and the
test stack's REST catalog server runs the same Iceberg version as Spark."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_spark_jars_match_pinned_pyspark() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    pom = ET.parse(ROOT / "spark_images" / "pom.xml").getroot()
    spark_version = pom.findtext("m:properties/m:spark.version", namespaces=ns)
    pinned = re.search(r"^pyspark==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert pinned is not None
    assert spark_version == pinned.group(1)


def test_rest_catalog_server_is_the_iceberg_version_spark_runs() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    versions = [
        ET.parse(ROOT / pom).getroot().findtext("m:properties/m:iceberg.version", namespaces=ns)
        for pom in ("spark_images/pom.xml", "hack/rest-catalog/pom.xml")
    ]
    assert versions[0] is not None
    assert versions[0] == versions[1]
