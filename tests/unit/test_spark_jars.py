"""Where Spark's jars and the state folder come from, without a development checkout.

Proves: `icefall.spark.session.spark_jars` uses the folder ICEFALL_SPARK_JARS names when it is set (and
refuses an empty one), sets no `spark.jars` when Spark's own jar folder already holds Icefall's jars (the
image), and otherwise fails with one line saying how to provide them; the CLI's state folder is
`--state-dir`, else ICEFALL_STATE_DIR, else `.icefall` for local commands and `<tmp>/icefall` for the pods'
commands (read-only root, /tmp an emptyDir); `FAIR_SCHEDULING` names a pool file with the pools `icefall run`
uses. Not proved: that Spark starts with them (tests/integration/test_installed.py).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pytest

from icefall.commands import common
from icefall.spark.session import JARS_VARIABLE, SparkJarsMissingError, spark_conf, spark_jars

pytestmark = pytest.mark.unit


def test_the_variable_wins(tmp_path: Path) -> None:
    (tmp_path / "b.jar").touch()
    (tmp_path / "a.jar").touch()
    assert spark_jars({JARS_VARIABLE: str(tmp_path)}) == [tmp_path / "a.jar", tmp_path / "b.jar"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(SparkJarsMissingError, match="holds no jars"):
        spark_jars({JARS_VARIABLE: str(tmp_path / "empty")})


def test_jars_already_in_sparks_folder_need_no_spark_jars(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "jars").mkdir()
    (tmp_path / "jars" / "iceberg-spark-runtime-4.1_2.13-1.11.0.jar").touch()
    assert spark_jars({"SPARK_HOME": str(tmp_path)}) == []
    monkeypatch.delenv(JARS_VARIABLE, raising=False)
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    assert "spark.jars" not in spark_conf([], master="local[1]", app_name="t")


def test_no_jars_anywhere_is_one_line_saying_how(tmp_path: Path) -> None:
    (tmp_path / "jars").mkdir()
    with pytest.raises(SparkJarsMissingError) as raised:
        spark_jars({"SPARK_HOME": str(tmp_path)})
    message = str(raised.value)
    assert "\n" not in message
    assert JARS_VARIABLE in message and str(tmp_path / "jars") in message and "hack/tool-env.sh" in message


def test_state_folder_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(common.STATE_DIR_VARIABLE, raising=False)
    unset = argparse.Namespace(state_dir=None)
    assert common.state_dir(unset) == Path(".icefall").resolve()
    assert common.state_dir(unset, in_cluster=True) == Path(tempfile.gettempdir()).resolve() / "icefall"
    monkeypatch.setenv(common.STATE_DIR_VARIABLE, "/srv/state")
    assert common.state_dir(unset) == common.state_dir(unset, in_cluster=True) == Path("/srv/state")
    assert common.state_dir(argparse.Namespace(state_dir="/given")) == Path("/given")


def test_fair_scheduling_names_the_pools_icefall_run_uses() -> None:
    """`icefall run` (and the wheel: package-data) gives Spark a pool file with the batches' `default` pool
    ahead of in-process maintenance's, so Spark neither warns about an unknown pool nor queues a batch."""
    import xml.etree.ElementTree as ET

    from icefall.compact.runner import MAINTENANCE_POOL
    from icefall.spark.session import FAIR_SCHEDULING

    assert FAIR_SCHEDULING["spark.scheduler.mode"] == "FAIR"
    pools = {
        pool.get("name"): (int(pool.findtext("weight", "1")), int(pool.findtext("minShare", "0")))
        for pool in ET.parse(FAIR_SCHEDULING["spark.scheduler.allocation.file"]).getroot().iter("pool")
    }
    assert set(pools) == {"default", MAINTENANCE_POOL}
    assert pools["default"][0] > pools[MAINTENANCE_POOL][0] and pools["default"][1] >= 1
