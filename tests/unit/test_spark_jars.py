"""Where Spark's jars and the state folder come from, without a development checkout.

Proves: `icefall.spark.session.spark_jars` uses the folder ICEFALL_SPARK_JARS names when it is set (and
refuses an empty one), sets no `spark.jars` when Spark's own jar folder already holds Icefall's jars (the
image), else, from a checkout, takes the complete cache folder its setup filled for its jar list (under
XDG_CACHE_HOME, else HOME/.cache) or says in one line what to run there, and otherwise fails with one line
saying how to provide them; `source_checkout` finds the checkout above a module; the CLI's state folder is
`--state-dir`, else ICEFALL_STATE_DIR, else `.icefall` for local commands and `<tmp>/icefall` for the pods'
commands (read-only root, /tmp an emptyDir); `FAIR_SCHEDULING` names a pool file with the pools `icefall run`
uses. Not proved: that Spark starts with them (tests/integration/test_installed.py), that the cache folder
is the one hack/fetch-jars.sh fills (tests/integration/test_setup_jars.py).
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from pathlib import Path

import pytest

from icefall.commands import common
from icefall.spark import session
from icefall.spark.session import (
    JARS_VARIABLE,
    SparkJarsMissingError,
    source_checkout,
    spark_conf,
    spark_jars,
)

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


def test_no_jars_anywhere_is_one_line_saying_how(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session, "source_checkout", lambda: None)  # installed from a wheel
    (tmp_path / "jars").mkdir()
    with pytest.raises(SparkJarsMissingError) as raised:
        spark_jars({"SPARK_HOME": str(tmp_path)})
    message = str(raised.value)
    assert "\n" not in message
    assert JARS_VARIABLE in message and str(tmp_path / "jars") in message and "make setup" in message


def checkout_with_jars(root: Path, *, complete: bool = True) -> tuple[Path, Path, Path]:
    """A checkout whose jar list is `root/checkout/spark_images/pom.xml`, the cache folder its setup fills
    (under `root/cache`), and a Spark home without Icefall's jars."""
    checkout, cache, home = root / "checkout", root / "cache", root / "spark"
    (checkout / "spark_images").mkdir(parents=True)
    (checkout / "spark_images" / "pom.xml").write_text("<project>the jar list</project>\n")
    key = hashlib.sha256(b"<project>the jar list</project>\n").hexdigest()[:12]
    folder = cache / "icefall" / f"jars-spark-{key}"
    folder.mkdir(parents=True)
    (folder / "b.jar").touch()
    (folder / "a.jar").touch()
    if complete:
        (folder / ".complete").touch()
    (home / "jars").mkdir(parents=True)
    return checkout, folder, home


def test_a_checkout_uses_the_jars_its_setup_fetched(tmp_path: Path) -> None:
    checkout, folder, home = checkout_with_jars(tmp_path)
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "SPARK_HOME": str(home)}
    assert spark_jars(environ, checkout=checkout) == [folder / "a.jar", folder / "b.jar"]
    # No XDG_CACHE_HOME (or an empty one, as bash's ${XDG_CACHE_HOME:-...} reads it): HOME/.cache.
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".cache").symlink_to(tmp_path / "cache")
    by_home = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": "", "SPARK_HOME": str(home)}
    assert [jar.name for jar in spark_jars(by_home, checkout=checkout)] == ["a.jar", "b.jar"]


def test_the_variable_and_sparks_folder_win_over_the_checkout(tmp_path: Path) -> None:
    checkout, _, home = checkout_with_jars(tmp_path)
    given = tmp_path / "given"
    given.mkdir()
    (given / "c.jar").touch()
    cache = str(tmp_path / "cache")
    assert spark_jars({JARS_VARIABLE: str(given), "XDG_CACHE_HOME": cache}, checkout=checkout) == [
        given / "c.jar"
    ]
    (home / "jars" / "iceberg-spark-runtime-4.1_2.13-1.11.0.jar").touch()
    assert spark_jars({"SPARK_HOME": str(home), "XDG_CACHE_HOME": cache}, checkout=checkout) == []


@pytest.mark.parametrize("state", ["missing", "incomplete", "another jar list"])
def test_a_checkout_without_its_jars_says_what_to_run(tmp_path: Path, state: str) -> None:
    checkout, folder, home = checkout_with_jars(tmp_path, complete=state != "incomplete")
    if state == "missing":
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()
    elif state == "another jar list":  # the pom changed since the setup (a version bump)
        (checkout / "spark_images" / "pom.xml").write_text("<project>a newer jar list</project>\n")
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "SPARK_HOME": str(home)}
    with pytest.raises(SparkJarsMissingError) as raised:
        spark_jars(environ, checkout=checkout)
    message = str(raised.value)
    assert "\n" not in message
    assert f"run `hack/fetch-jars.sh spark` in {checkout}" in message and JARS_VARIABLE in message


def test_the_checkout_is_found_above_the_module(tmp_path: Path) -> None:
    module = tmp_path / "operator" / "src" / "icefall" / "spark" / "session.py"
    module.parent.mkdir(parents=True)
    module.touch()
    assert source_checkout(module) is None
    (tmp_path / "spark_images").mkdir()
    (tmp_path / "spark_images" / "pom.xml").touch()
    assert source_checkout(module) is None  # a jar list alone is no checkout
    (tmp_path / "hack").mkdir()
    (tmp_path / "hack" / "fetch-jars.sh").touch()
    assert source_checkout(module) == tmp_path


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
