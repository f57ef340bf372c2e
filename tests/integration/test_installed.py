"""The image's entry point as spark_images/Dockerfile lays it out, without Docker: the wheel in a virtualenv
of its own, Spark's jars in Spark's jar folder, no development variables, no checkout.

Proves:
- the wheel builds from exactly what the Dockerfile copies (pyproject.toml, README.md, operator/src),
  offline, and holds neither `icefall/devstack` nor `icefall/testing`;
- installed into a fresh virtualenv (its dependencies come from the development virtualenv's
  site-packages through a `.pth` line, so nothing is downloaded), `icefall --help` runs from a folder
  outside the checkout with an empty HOME, and neither development package can be imported;
- `icefall run --until-caught-up` then ingests a real topic into the embedded catalog, exactly once, with
  Spark finding Icefall's jars in `$SPARK_HOME/jars` (a Spark home laid out like the image's /opt/spark:
  pyspark's jars plus the jar list's) and ICEFALL_SPARK_JARS unset; the state goes to ICEFALL_STATE_DIR as
  the image sets it, and nothing is written to HOME or the working folder (the image's root is read-only);
- with the jars nowhere, `icefall run` fails with one line saying how to provide them.
The image itself is built and run by the e2e tier (e2e/test_node.py); this is the same layout, quicker.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from icefall.catalog import CatalogConfig
from icefall.devstack.kafka import KafkaBroker
from icefall.devstack.tools import tool_dir
from icefall.spark.session import JARS_VARIABLE
from icefall.testing.streams import assert_exactly_once, manifest_text, produce, watermarks

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEV_PACKAGES = ("icefall.devstack", "icefall.testing")


class Installed:
    """A virtualenv with the icefall wheel, and a Spark home laid out like the image's."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.venv = root / "venv"
        self.spark_home = root / "spark"
        self.home = root / "home"
        self.cwd = root / "work"
        self.wheel = self._build_wheel()
        self._install()
        self._spark_home()
        self.home.mkdir()
        self.cwd.mkdir()

    def _build_wheel(self) -> Path:
        source = self.root / "src"
        source.mkdir()
        for name in ("pyproject.toml", "README.md"):  # the Dockerfile copies these...
            shutil.copy(REPO / name, source / name)
        shutil.copytree(  # ...and operator/src
            REPO / "operator" / "src",
            source / "operator" / "src",
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
        )
        dist = self.root / "dist"
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
             "--no-index", "--wheel-dir", str(dist), str(source)],
            check=True, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        [wheel] = dist.glob("icefall-*.whl")
        return wheel

    def _install(self) -> None:
        venv = [sys.executable, "-m", "venv", "--without-pip", str(self.venv)]
        subprocess.run(venv, check=True, timeout=120)
        # Without the test run's PYTHONPATH: it holds the checkout's operator/src, whose icefall.egg-info
        # (from the editable install) would make pip take the wheel for installed already.
        clean = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(self.python), "install", "--quiet", "--no-deps",
             "--no-index", str(self.wheel)],
            check=True, capture_output=True, text=True, timeout=300, env=clean,
        )  # fmt: skip
        # The dependencies: the development virtualenv's site-packages, as a plain path (its own .pth files,
        # such as the editable install pointing at the checkout, are not processed).
        purelib = subprocess.run(
            [str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        (Path(purelib) / "dev-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    def _spark_home(self) -> None:
        """Like the image's /opt/spark: Spark's files, and one jar folder with Spark's and Icefall's jars."""
        import pyspark

        pyspark_home = Path(pyspark.__file__).parent
        self.spark_home.mkdir()
        for entry in pyspark_home.iterdir():
            if entry.name != "jars":
                (self.spark_home / entry.name).symlink_to(entry)
        jars = self.spark_home / "jars"
        jars.mkdir()
        for jar in [*(pyspark_home / "jars").glob("*.jar"), *tool_dir(JARS_VARIABLE).glob("*.jar")]:
            (jars / jar.name).symlink_to(jar)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        """The image's environment: no checkout on any path, no ICEFALL_* development variables."""
        keep = ("PATH", "LANG", "LC_ALL", "JAVA_HOME", "TMPDIR", "TZ")
        env = {key: os.environ[key] for key in keep if key in os.environ}
        env |= {
            "PATH": f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            "HOME": str(self.home),
            "SPARK_HOME": str(self.spark_home),
            "PYSPARK_PYTHON": str(self.python),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        return env | extra

    def icefall(self, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / "icefall"), *args],
            cwd=self.cwd, env=self.env(**env), capture_output=True, text=True, check=False, timeout=timeout,
        )  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return Installed(tmp_path_factory.mktemp("installed"))


def test_the_wheel_leaves_development_tooling_out(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    assert "icefall/cli.py" in names and "icefall/catalog/config.py" in names
    leaked = [n for n in names if n.startswith(("icefall/devstack", "icefall/testing", "icefall/demo"))]
    assert not leaked, leaked
    probe = "; ".join(
        [
            "import importlib.util, icefall",
            "print(icefall.__file__)",
            *(f"print(importlib.util.find_spec({dev!r}))" for dev in DEV_PACKAGES),
        ]
    )
    found = subprocess.run(
        [str(installed.python), "-c", probe],
        cwd=installed.cwd, env=installed.env(), capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert found[0].startswith(str(installed.venv)), found
    assert found[1:] == ["None", "None"], found


def test_icefall_help_runs_outside_the_checkout(installed: Installed) -> None:
    usage = installed.icefall("--help")
    assert usage.returncode == 0, usage.stderr
    assert "run" in usage.stdout and "ingest" in usage.stdout and "compact" in usage.stdout
    assert list(installed.home.iterdir()) == []


def test_a_real_job_finds_the_jars_in_sparks_jar_folder(installed: Installed, kafka: KafkaBroker) -> None:
    topic, name = "installed-orders", "installed_orders"
    kafka.create_topic(topic, partitions=2)
    bad = produce(kafka, topic, 0, 300, bad_every=50)
    manifest = installed.root / "orders.yaml"
    manifest.write_text(manifest_text(name, topic, kafka.bootstrap))
    state = installed.root / "state"  # the image's ICEFALL_STATE_DIR is /tmp/icefall, an emptyDir
    done = installed.icefall(
        "run", "-f", str(manifest), "--until-caught-up", "--master", "local[1]",
        timeout=600, ICEFALL_STATE_DIR=str(state),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "[run] batch 1:" in done.stdout, done.stdout[-3000:]
    assert_exactly_once(CatalogConfig.embedded(state), name, watermarks(kafka, topic), bad)
    assert list(installed.home.iterdir()) == [], "written to HOME"
    assert list(installed.cwd.iterdir()) == [], "written to the working folder"


def test_without_the_jars_run_says_how_to_provide_them(installed: Installed, tmp_path: Path) -> None:
    manifest = tmp_path / "t.yaml"
    manifest.write_text(manifest_text("no_jars", "no-jars", "127.0.0.1:1"))
    import pyspark

    bare = installed.icefall(
        "run", "-f", str(manifest), "--until-caught-up",
        SPARK_HOME=str(Path(pyspark.__file__).parent), ICEFALL_STATE_DIR=str(tmp_path / "state"),
    )  # fmt: skip
    assert bare.returncode == 1
    message = bare.stderr.strip().splitlines()
    assert len(message) == 1, bare.stderr
    assert JARS_VARIABLE in message[0] and "make setup" in message[0], message
