"""`icefall.testing.jvm.fast_start`: the options tests' Spark drivers start with.

Proves: C1 only always; the class-data archive (and its quiet logging) only when it exists or could be
made; options already in SPARK_SUBMIT_OPTS are kept; a long-lived JVM started within `long_lived` keeps C2
and the archive, and the options are back after it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from icefall.testing import jvm

pytestmark = pytest.mark.unit


def test_an_archive_that_exists_is_used_and_earlier_options_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "spark-classes.jsa"
    archive.write_bytes(b"")
    monkeypatch.setattr(jvm, "archive_path", lambda cache, jars: archive)
    monkeypatch.setattr(jvm, "make_archive", lambda target: pytest.fail("an existing archive is made again"))
    environ = {jvm.SUBMIT_OPTS: "-Dkept=1"}
    jvm.fast_start(tmp_path, environ)
    assert environ[jvm.SUBMIT_OPTS].split() == [
        "-Dkept=1", jvm.C1_ONLY, f"-XX:SharedArchiveFile={archive}", *jvm.QUIET_CDS.split(),
    ]  # fmt: skip


def test_without_an_archive_the_drivers_still_run_c1_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jvm, "archive_path", lambda cache, jars: tmp_path / "missing.jsa")
    monkeypatch.setattr(jvm, "make_archive", lambda target: False)
    environ: dict[str, str] = {}
    jvm.fast_start(tmp_path, environ)
    assert environ == {jvm.SUBMIT_OPTS: jvm.C1_ONLY}


def test_a_long_lived_jvm_keeps_c2_and_the_archive() -> None:
    options = f"-Dkept=1 {jvm.C1_ONLY} -XX:SharedArchiveFile=/a.jsa"
    environ = {jvm.SUBMIT_OPTS: options}
    with jvm.long_lived(environ):
        assert environ[jvm.SUBMIT_OPTS] == "-Dkept=1 -XX:SharedArchiveFile=/a.jsa"
    assert environ[jvm.SUBMIT_OPTS] == options
