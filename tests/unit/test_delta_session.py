"""Delta Lake is scoped to Delta tables' Spark sessions.

Proves: an Iceberg table's session conf is exactly the one main built before Delta (the same keys, values
and order; nothing names Delta, even with Delta's jars at hand), whether `table_format` is left out or
given; a Delta table's session differs from it only by Delta's SQL extension after Iceberg's, Delta's
session catalog and Delta's jars after Icefall's (none of Icefall's in the image's case); Delta's jars come
from ICEFALL_DELTA_JARS (an empty folder refused), else the checkout's `hack/fetch-jars.sh delta` folder,
else one line saying what to set; Delta's jar list is apart from the Iceberg one (whose cache key is
unchanged). Not proved here: that Spark reads a Delta table with them (tests/integration/
test_delta_tables.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from icefall.api import TableFormat
from icefall.catalog import CatalogConfig
from icefall.spark import session
from icefall.spark.session import (
    DELTA_JARS_VARIABLE,
    JARS_VARIABLE,
    SparkJarsMissingError,
    delta_jars,
    session_conf,
    source_checkout,
)

pytestmark = pytest.mark.unit

ICEBERG = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
DELTA = "io.delta.sql.DeltaSparkSessionExtension"
#: Delta's classes and jars (a checkout's own path may hold the word "delta").
DELTA_NAMES = re.compile(r"io\.delta|sql\.delta|delta-(spark|storage)|Delta")


def jar_folder(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).touch()
    return folder


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    iceberg = jar_folder(tmp_path / "spark", "iceberg-spark-runtime-4.1_2.13-1.11.0.jar", "kafka.jar")
    delta = jar_folder(tmp_path / "delta", "delta-spark_2.13-4.1.0.jar", "delta-storage-4.1.0.jar")
    monkeypatch.setenv(JARS_VARIABLE, str(iceberg))
    monkeypatch.setenv(DELTA_JARS_VARIABLE, str(delta))
    return iceberg, delta


def mains_conf(iceberg_jars: Path, catalog: CatalogConfig) -> list[tuple[str, str]]:
    """What main (af0d842, before Delta) built for `conf()` below, key by key, in order."""
    return [
        ("spark.master", "local[2]"),
        ("spark.app.name", "t"),
        ("spark.sql.extensions", ICEBERG),
        ("spark.driver.memory", "1g"),
        ("spark.driver.extraJavaOptions", "-XX:TrimNativeHeapInterval=5000"),
        ("spark.sql.session.timeZone", "UTC"),
        ("spark.sql.shuffle.partitions", "4"),
        ("spark.ui.enabled", "false"),
        ("spark.ui.showConsoleProgress", "false"),
        ("spark.sql.adaptive.enabled", "true"),
        ("spark.redaction.regex", session.REDACTION_REGEX),
        ("spark.sql.runSQLOnFiles", "false"),
        ("spark.jars", f"{iceberg_jars}/iceberg-spark-runtime-4.1_2.13-1.11.0.jar,{iceberg_jars}/kafka.jar"),
        ("spark.driver.bindAddress", "127.0.0.1"),
        ("spark.driver.host", "127.0.0.1"),
        *catalog.spark_conf().items(),
        ("spark.scheduler.mode", "FAIR"),
        ("spark.scheduler.allocation.file", session.FAIR_SCHEDULING["spark.scheduler.allocation.file"]),
    ]


def conf(catalog: CatalogConfig, **table_format: TableFormat) -> dict[str, str]:
    return session_conf(
        [catalog], master="local[2]", app_name="t", extra_conf=session.FAIR_SCHEDULING, **table_format
    )


def test_an_iceberg_tables_session_is_mains_and_names_no_delta(
    jars: tuple[Path, Path], tmp_path: Path
) -> None:
    catalog = CatalogConfig.embedded(tmp_path / "state")
    for built in (conf(catalog), conf(catalog, table_format=TableFormat.ICEBERG)):
        assert list(built.items()) == mains_conf(jars[0], catalog)
        assert not [item for item in built.items() if DELTA_NAMES.search(f"{item}")]


def test_a_delta_tables_session_adds_only_delta(jars: tuple[Path, Path], tmp_path: Path) -> None:
    catalog = CatalogConfig.embedded(tmp_path / "state")
    iceberg, delta = conf(catalog), conf(catalog, table_format=TableFormat.DELTA)
    changed = {key for key in delta if delta[key] != iceberg.get(key)}
    assert changed == {
        "spark.sql.extensions",
        "spark.sql.catalog.spark_catalog",
        "spark.jars",
        "spark.databricks.delta.checkpointSchema.useFromCheckpointMetadata",  # DELTA_CHECKPOINT_SCHEMA
    }
    assert delta["spark.sql.extensions"] == f"{ICEBERG},{DELTA}"
    assert delta["spark.sql.catalog.spark_catalog"] == "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    assert delta["spark.jars"].split(",") == [
        *iceberg["spark.jars"].split(","),
        f"{jars[1]}/delta-spark_2.13-4.1.0.jar",
        f"{jars[1]}/delta-storage-4.1.0.jar",
    ]


def test_in_the_image_a_delta_session_names_only_deltas_jars(
    jars: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "spark-home"
    jar_folder(home / "jars", "iceberg-spark-runtime-4.1_2.13-1.11.0.jar")
    monkeypatch.delenv(JARS_VARIABLE)
    monkeypatch.setenv("SPARK_HOME", str(home))
    built = session_conf([], master="local[1]", app_name="t", table_format=TableFormat.DELTA)
    assert built["spark.jars"] == f"{jars[1]}/delta-spark_2.13-4.1.0.jar,{jars[1]}/delta-storage-4.1.0.jar"
    assert "spark.jars" not in session_conf([], master="local[1]", app_name="t")


def test_where_deltas_jars_come_from(tmp_path: Path) -> None:
    folder = jar_folder(tmp_path / "given", "b.jar", "a.jar")
    assert delta_jars({DELTA_JARS_VARIABLE: str(folder)}) == [folder / "a.jar", folder / "b.jar"]
    empty = jar_folder(tmp_path / "empty")
    with pytest.raises(SparkJarsMissingError, match=r"ICEFALL_DELTA_JARS=.* holds no jars"):
        delta_jars({DELTA_JARS_VARIABLE: str(empty)})
    checkout = source_checkout()
    assert checkout is not None
    cache = tmp_path / "cache"
    with pytest.raises(SparkJarsMissingError, match=r"run `hack/fetch-jars.sh delta` in"):
        delta_jars({"XDG_CACHE_HOME": str(cache)}, checkout=checkout)
    filled = session.setup_jar_folder(checkout, {"XDG_CACHE_HOME": str(cache)}, "delta")
    assert filled.name.startswith("jars-delta-")
    jar_folder(filled, ".complete", "delta-spark_2.13-4.1.0.jar")
    assert delta_jars({"XDG_CACHE_HOME": str(cache)}, checkout=checkout) == [
        filled / "delta-spark_2.13-4.1.0.jar"
    ]
    with pytest.raises(SparkJarsMissingError, match="set ICEFALL_DELTA_JARS to a folder"):
        delta_jars({}, checkout=tmp_path)  # no jar list there: installed from a wheel


def test_deltas_jar_list_is_apart_from_icebergs() -> None:
    checkout = source_checkout()
    assert checkout is not None
    assert "delta" not in (checkout / session.JAR_LIST).read_text().lower()
    delta_pom = (checkout / session.DELTA_JAR_LIST).read_text()
    assert "<artifactId>delta-spark_${scala.binary}</artifactId>" in delta_pom
    # Spark's own log4j stays the only one on a Delta session's classpath.
    assert "<groupId>org.apache.logging.log4j</groupId>" in delta_pom
