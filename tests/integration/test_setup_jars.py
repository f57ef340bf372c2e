"""`icefall` in a new shell of a checkout: no ICEFALL_SPARK_JARS, no SPARK_HOME, as the README's commands run.

Proves:
- the folder `icefall` resolves its Spark jars from is the one `hack/fetch-jars.sh spark` (what `make
  setup` and `make demo` run) filled: the same cache, the same key of the jar list;
- with that cache empty, `icefall run` fails before starting Spark with one line that names the command
  to run in this checkout.
Not proved here: that Spark starts with those jars (every integration test that runs Spark does, with the
same folder exported).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from icefall.spark.session import JARS_VARIABLE
from icefall.testing.streams import manifest_text

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def new_shell(**extra: str) -> dict[str, str]:
    """This environment as a new shell has it: nothing `hack/tool-env.sh` exports, no SPARK_HOME."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_HOME" and not k.startswith("ICEFALL_")}
    return env | extra


def test_icefall_finds_the_jars_the_setup_fetched() -> None:
    fetched = subprocess.run(
        [str(REPO / "hack" / "fetch-jars.sh"), "spark"],
        check=True, capture_output=True, text=True, timeout=600,
    ).stdout.strip()  # fmt: skip
    probe = (
        "from icefall.spark.session import spark_jars; print(sorted({str(j.parent) for j in spark_jars()}))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], env=new_shell(), check=True, capture_output=True, text=True, timeout=60
    ).stdout.strip()  # fmt: skip
    assert found == repr([fetched]), (found, fetched)


def test_without_the_setup_run_says_what_to_run(tmp_path: Path) -> None:
    manifest = tmp_path / "table.yaml"
    manifest.write_text(manifest_text("no_setup", "no-setup", "127.0.0.1:1"))
    icefall = Path(sys.executable).parent / "icefall"  # the console script the README runs
    done = subprocess.run(
        [str(icefall), "run", "-f", str(manifest), "--until-caught-up", "--state-dir", str(tmp_path / "s")],
        env=new_shell(XDG_CACHE_HOME=str(tmp_path / "empty-cache")),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"run `hack/fetch-jars.sh spark` in {REPO}" in lines[0] and JARS_VARIABLE in lines[0], lines
