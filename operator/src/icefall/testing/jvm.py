"""Spark JVMs that start cheaply in tests.

The suite starts well over a hundred Spark driver JVMs (every `icefall run` a test kills or runs to the end
is one), and each start costs more CPU than the work it does: on the 2-core machines here a session plus
its first query took 40 to 50 CPU-s, most of it C2 compiling code that runs once. Tests' drivers are
short-lived and move little data, so they run with two JVM options (through `SPARK_SUBMIT_OPTS`, which
spark-submit gives the driver JVM; processes the tests start inherit it):
- `-XX:TieredStopAtLevel=1`: the C1 compiler only;
- `-XX:SharedArchiveFile`: a class-data archive of the classes a Spark session loads, made once per JDK,
  pyspark install (a checkout's own virtualenv) and jar set, cached beside the jars.
Together: ~11 CPU-s per start. Neither changes what a job computes. The product's JVMs keep the defaults
(a long-running driver wants C2's code), and so does the run's own session (`long_lived`: it serves every
test of the run).

An archive that does not fit the JVM (another JDK, classpath or jar set) is ignored by the JVM without a
word (`-Xlog:cds=off`); one that cannot be made leaves the tests on the defaults, slower but the same.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path

#: The variable spark-submit adds to the driver JVM's command line (client mode: the tests' only mode).
SUBMIT_OPTS = "SPARK_SUBMIT_OPTS"
C1_ONLY = "-XX:TieredStopAtLevel=1"
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"
KEEP_ARCHIVES = 3

# Run in a child process: a session that loads what tests' sessions load (SQL, the Iceberg catalog, a
# write and a read), then exits, when the JVM writes the archive.
_TRAINING_RUN = """
import sys
from pathlib import Path
from icefall.catalog import CatalogConfig
from icefall.spark.session import build_spark_session

config = CatalogConfig.embedded(Path(sys.argv[2]))
config.pyiceberg()
spark = build_spark_session(
    [config], master="local[1]",
    extra_conf={"spark.driver.extraJavaOptions": "-XX:ArchiveClassesAtExit=" + sys.argv[1]},
)
spark.sql("CREATE NAMESPACE IF NOT EXISTS icefall.warmup")
spark.sql(
    "CREATE TABLE icefall.warmup.t (id BIGINT, name STRING) USING iceberg PARTITIONED BY (bucket(4, id))"
)
spark.range(100).selectExpr("id", "CAST(id AS STRING) AS name").writeTo("icefall.warmup.t").append()
spark.sql("SELECT name, count(*) FROM icefall.warmup.t GROUP BY name").collect()
spark.stop()
"""


def archive_path(cache: Path, jars: Path) -> Path:
    """Where the archive for this JDK, pyspark (its version and folder: the driver's classpath, which the
    archive must match) and jar folder is cached."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr
    names = sorted(path.name for path in jars.glob("*.jar"))
    parts = [java, pyspark.__version__, str(Path(pyspark.__file__).parent), str(jars), *names]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    return cache / f"spark-classes-{key}.jsa"


def make_archive(target: Path) -> bool:
    """Make the archive at `target` (atomically: tests in other checkouts may start at once); False (with the
    child's output printed) when the run failed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    print(f"[tests] making a class-data archive for Spark's driver JVMs: {target}", flush=True)
    with tempfile.TemporaryDirectory(prefix="icefall-jvm-archive-") as work:
        done = subprocess.run(
            [sys.executable, "-c", _TRAINING_RUN, str(partial), work],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    if done.returncode != 0 or not partial.is_file():
        print(f"[tests] no class-data archive for Spark (exit {done.returncode}):\n{done.stderr[-2000:]}")
        partial.unlink(missing_ok=True)
        return False
    os.replace(partial, target)
    # Each checkout has its own (~170 MB): keep the newest few.
    made = sorted(target.parent.glob("spark-classes-*.jsa"), key=lambda path: path.stat().st_mtime)
    for old in made[:-KEEP_ARCHIVES]:
        old.unlink(missing_ok=True)
    return True


def fast_start(jars: Path, environ: MutableMapping[str, str] = os.environ) -> None:
    """Set `SPARK_SUBMIT_OPTS` in `environ` for cheap starts, making the archive first when it is missing."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "icefall"
    archive = archive_path(cache, jars)
    options = [C1_ONLY]
    if archive.is_file() or _make_once(archive):
        options += [f"-XX:SharedArchiveFile={archive}", QUIET_CDS]
    environ[SUBMIT_OPTS] = " ".join([environ.get(SUBMIT_OPTS, ""), *options]).strip()


def _make_once(archive: Path) -> bool:
    """`make_archive`, once for the parallel workers of a run: the others wait for it, then use it."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive.with_name(f"{archive.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return archive.is_file() or make_archive(archive)


@contextmanager
def long_lived(environ: MutableMapping[str, str] = os.environ) -> Iterator[None]:
    """Within: a JVM started here keeps C2 (the archive stays)."""
    before = environ.get(SUBMIT_OPTS)
    if before is not None:
        environ[SUBMIT_OPTS] = " ".join(option for option in before.split() if option != C1_ONLY)
    try:
        yield
    finally:
        if before is not None:
            environ[SUBMIT_OPTS] = before
