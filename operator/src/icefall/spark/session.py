"""Build the one long-lived SparkSession a process uses, with Icefall's jars and catalogs.

Spark session start costs seconds, so callers keep it for their life (tests share one per run).
The jars are the list in `spark_images/pom.xml` (Iceberg's Spark runtime, S3FileIO, GCSFileIO, Spark's Kafka
source, the JDBC drivers). `spark_jars` finds them: in the folder `ICEFALL_SPARK_JARS` names when it is
set, else already in Spark's own jar folder (`$SPARK_HOME/jars`, where the image puts them, so no
`spark.jars` is set), else, run from a checkout, in the cache folder its `make setup` or `make demo` filled
(`setup_jar_folder`: keyed by the pom's content, as `hack/fetch-jars.sh spark` keys it), so `icefall` needs
no variable in a new shell. Otherwise it fails with one line saying what to run. It never resolves jars
itself (Maven is a development tool; `icefall.devstack.tools` does that for the test stack).

Delta Lake is scoped to the sessions of Delta tables (`table_format=TableFormat.DELTA`, `delta_conf`): only
they add the jars of `spark_images/delta/pom.xml` (`delta_jars`: `ICEFALL_DELTA_JARS`, else the checkout's
`hack/fetch-jars.sh delta` folder), Delta's SQL extension and its session catalog. An Iceberg table's
session conf is exactly what it was before Delta (tests/unit/test_delta_session.py).

The driver JVM's native memory is kept small without costing CPU (`DRIVER_JAVA_OPTIONS`,
`DRIVER_MALLOC_ARENAS`; measured in bench/results/memory.md), and so is the driver's Python
(`pyspark_flags_without_pyarrow`). `spark_conf` is the base every session shares; what differs per process
(master, application name, the driver's memory, Kubernetes, scheduling) comes from
`icefall.plan.spark_conf` as `extra_conf`, which wins. A conf that asks for the FAIR scheduler
gets the pools of `fairscheduler.xml`, beside this module.

Spark's catalog client (Iceberg Java) reaches each REST catalog through `icefall.catalog.rest_proxy`, in
this process: the catalog's Spark `uri` is the proxy's, which drops what the catalog's answers name to load.

Guarantee: no secret value is on a command line. PySpark starts the JVM with `spark-submit --conf k=v` for
every builder option, and any process of the pod can read a command line (`/proc/<pid>/cmdline`). So the
catalog options that carry a secret value (`launch_and_late_conf`) are left out of the launch and set on
the session once its JVM runs (`spark.conf.set`, over Py4J's socket): Spark's catalogs are created on
first use from the session's conf, so they see them (tests/integration/test_catalog_auth.py proves both
with a REST catalog that refuses a missing token).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icefall.api import CatalogType, TableFormat
from icefall.catalog import CatalogConfig
from icefall.catalog.config import DELTA_SESSION_CATALOG
from icefall.catalog.rest_proxy import LOOPBACK, through_proxies
from icefall.plan.spark_conf import DEFAULT_MASTER, shuffle_partitions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JARS_VARIABLE = "ICEFALL_SPARK_JARS"
RUNTIME_JAR = "iceberg-spark-runtime-*.jar"  # present in a jar folder that holds the pom's jars
# Spark's default redaction plus the catalog options that carry credentials (credential, s3.access-key-id,
# header.Authorization, Azure's adls.auth.shared-key.account.key) and the Kafka source's client key
# (kafka.ssl.keystore.key, a PEM private key whose name and text match none of the others): Spark shows
# redacted values in its UI, event logs, error reports and the data source options of a plan's text.
REDACTION_REGEX = (
    "(?i)secret|password|token|access[.-]key|account[.-]key|credential|authorization|keystore[.]key"
    "|private key"
)
#: Iceberg's SQL extensions (procedures, branches): every session.
ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
#: Delta Lake's SQL extension (reads, writes, commands): Delta tables' sessions only.
DELTA_EXTENSIONS = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_JARS_VARIABLE = "ICEFALL_DELTA_JARS"
#: Delta 4.1.0 reads a checkpoint's schema from the Parquet footer with a Spark constructor Spark 4.1.3 no
#: longer has (NoSuchMethodError: a table with a checkpoint could not be read); `_last_checkpoint` holds
#: the schema too, and this has Delta take it from there.
DELTA_CHECKPOINT_SCHEMA = {"spark.databricks.delta.checkpointSchema.useFromCheckpointMetadata": "true"}
#: `extra_conf` of a session whose jobs come from two threads (`icefall run`: batches and in-process
#: maintenance): Spark's FAIR scheduler with the pools of fairscheduler.xml, beside this module.
FAIR_SCHEDULING = {
    "spark.scheduler.mode": "FAIR",
    "spark.scheduler.allocation.file": str(Path(__file__).with_name("fairscheduler.xml")),
}


#: The driver JVM's options (`spark.driver.extraJavaOptions`, which no table may set: icefall.api.spark):
#: give freed native memory (C2's compiler arenas, inflaters, Kafka and Parquet buffers) back to the system
#: every 5 s instead of keeping it in glibc's free lists; a `malloc_trim` every 5 s costs no measurable CPU.
DRIVER_JAVA_OPTIONS = "-XX:TrimNativeHeapInterval=5000"
#: glibc's malloc arenas for the driver JVM (its environment; `MALLOC_ARENA_MAX`): the default, 8 per core,
#: lets each of the JVM's ~55 threads keep a 64 MiB arena of its own, partly resident and rarely reused;
#: the JVM allocates its heap, metaspace and code itself, so two arenas cost no contention that shows.
DRIVER_MALLOC_ARENAS = "2"


class SparkJarsMissingError(RuntimeError):
    """Neither ICEFALL_SPARK_JARS nor Spark's own jar folder provides Icefall's jars."""


def spark_home(environ: Mapping[str, str] = os.environ) -> Path | None:
    """$SPARK_HOME, else the Spark a pip-installed pyspark brings (its package folder)."""
    if environ.get("SPARK_HOME"):
        return Path(environ["SPARK_HOME"])
    spec = importlib.util.find_spec("pyspark")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


#: The jar list, relative to a checkout (the image has no checkout: its jars are in Spark's folder).
JAR_LIST = Path("spark_images") / "pom.xml"
#: The jars only Delta tables' sessions add (`delta_conf`), relative to a checkout.
DELTA_JAR_LIST = Path("spark_images") / "delta" / "pom.xml"
_FETCH_SCRIPT = Path("hack") / "fetch-jars.sh"


def source_checkout(start: Path = Path(__file__)) -> Path | None:
    """The checkout this module runs from (an editable install), if any: the folder holding both the jar
    list and the script that resolves it."""
    for parent in start.resolve().parents:
        if (parent / JAR_LIST).is_file() and (parent / _FETCH_SCRIPT).is_file():
            return parent
    return None


def setup_jar_folder(
    checkout: Path, environ: Mapping[str, str] = os.environ, component: str = "spark"
) -> Path:
    """Where `hack/fetch-jars.sh spark` (run by `make setup` and `make demo`) puts the jars of `checkout`'s
    jar list: `${XDG_CACHE_HOME:-$HOME/.cache}/icefall/jars-spark-<first 12 hex digits of its sha256>`
    (`component` delta: `hack/fetch-jars.sh delta`, of `DELTA_JAR_LIST`)."""
    jar_list = DELTA_JAR_LIST if component == "delta" else JAR_LIST
    key = hashlib.sha256((checkout / jar_list).read_bytes()).hexdigest()[:12]
    cache = Path(environ.get("XDG_CACHE_HOME") or Path(environ.get("HOME") or Path.home()) / ".cache")
    return cache / "icefall" / f"jars-{component}-{key}"


def spark_jars(
    environ: Mapping[str, str] = os.environ, home: Path | None = None, checkout: Path | None = None
) -> list[Path]:
    """The jars to pass as `spark.jars`: none when Spark's jar folder already holds them (see module doc).
    `checkout` defaults to `source_checkout()`."""
    folder = environ.get(JARS_VARIABLE)
    if folder:
        jars = sorted(Path(folder).glob("*.jar"))
        if not jars:
            raise SparkJarsMissingError(f"{JARS_VARIABLE}={folder} holds no jars")
        return jars
    home = home or spark_home(environ)
    if home is not None and any((home / "jars").glob(RUNTIME_JAR)):
        return []
    checkout = checkout or source_checkout()
    if checkout is not None:
        return _setup_jars(checkout, environ)
    where = f"{home / 'jars'}" if home is not None else "Spark's jar folder (no SPARK_HOME)"
    raise SparkJarsMissingError(
        f"Icefall's Spark jars are missing: {JARS_VARIABLE} is unset and {where} has no {RUNTIME_JAR}; "
        f"set {JARS_VARIABLE} to a folder with the jars of spark_images/pom.xml (a checkout's `make setup` "
        "fills one), or use the Icefall image"
    )


def _setup_jars(checkout: Path, environ: Mapping[str, str], component: str = "spark") -> list[Path]:
    """The jars `make setup` resolved for `checkout`, or one line saying what to run there."""
    folder = setup_jar_folder(checkout, environ, component)
    # hack/fetch-jars.sh renames a folder into place once full and marks it `.complete`.
    jars = sorted(folder.glob("*.jar")) if (folder / ".complete").is_file() else []
    if not jars:
        if component == "delta":
            raise SparkJarsMissingError(
                f"Delta Lake's jars are not set up for this checkout ({folder} is missing): run "
                f"`hack/fetch-jars.sh delta` in {checkout}, or set {DELTA_JARS_VARIABLE}"
            )
        raise SparkJarsMissingError(
            f"Icefall's Spark jars are not set up for this checkout ({folder} is missing): run "
            f"`hack/fetch-jars.sh spark` in {checkout} (`make setup` and `make demo` run it), "
            f"or set {JARS_VARIABLE}"
        )
    return jars


def delta_jars(environ: Mapping[str, str] = os.environ, checkout: Path | None = None) -> list[Path]:
    """The jars a Delta table's session adds (`spark_images/delta/pom.xml`): in the folder
    `ICEFALL_DELTA_JARS` names (the image sets it to a folder of its own, outside Spark's jar folder), else
    in the checkout's `hack/fetch-jars.sh delta` folder; elsewhere this fails with one line saying what to
    set."""
    folder = environ.get(DELTA_JARS_VARIABLE)
    if folder:
        jars = sorted(Path(folder).glob("*.jar"))
        if not jars:
            raise SparkJarsMissingError(f"{DELTA_JARS_VARIABLE}={folder} holds no jars")
        return jars
    checkout = checkout or source_checkout()
    if checkout is not None and (checkout / DELTA_JAR_LIST).is_file():
        return _setup_jars(checkout, environ, "delta")
    raise SparkJarsMissingError(
        f"Delta Lake's jars are missing: set {DELTA_JARS_VARIABLE} to a folder with the jars of "
        "spark_images/delta/pom.xml (a checkout's `hack/fetch-jars.sh delta` fills one)"
    )


def delta_conf(conf: Mapping[str, str], jars: Iterable[Path]) -> dict[str, str]:
    """`conf` (an Iceberg session's) made a Delta table's: Delta's SQL extension after Iceberg's, Spark's
    session catalog wrapped by Delta's (Delta tables are read and maintained through it; Iceberg's are named
    catalogs), and `jars` after the session's own."""
    delta = dict(conf)
    delta["spark.sql.extensions"] = f"{conf['spark.sql.extensions']},{DELTA_EXTENSIONS}"
    delta.update(DELTA_SESSION_CATALOG)
    delta.update(DELTA_CHECKPOINT_SCHEMA)
    delta["spark.jars"] = ",".join([*filter(None, [conf.get("spark.jars")]), *(str(jar) for jar in jars)])
    return delta


def spark_conf(
    catalogs: Iterable[CatalogConfig],
    *,
    master: str,
    app_name: str,
    driver_memory: str = "1g",
    table_format: TableFormat = TableFormat.ICEBERG,
) -> dict[str, str]:
    """The base of every Icefall session: jars, SQL extensions, catalogs, redaction, UTC, no SQL on files
    (`spark.sql.runSQLOnFiles=false`), shuffle partitions for the master (`plan.spark_conf.
    shuffle_partitions`, with this machine's cores for `local[*]`; a cluster driver's conf names its own);
    a local master binds to loopback. A Delta table's session adds Delta Lake (`delta_conf`)."""
    conf = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        "spark.driver.memory": driver_memory,
        "spark.driver.extraJavaOptions": DRIVER_JAVA_OPTIONS,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(shuffle_partitions(master, cores=os.cpu_count() or 1)),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "true",
        "spark.redaction.regex": REDACTION_REGEX,
        # No `SELECT ... FROM parquet.`/path``: Icefall's SQL names tables, never files (docs/security.md).
        "spark.sql.runSQLOnFiles": "false",
    }
    jars = spark_jars()
    if jars:
        conf["spark.jars"] = ",".join(str(jar) for jar in jars)
    if master.startswith("local"):
        # One machine: keep the driver's RPC and block manager on loopback, not the host's interface.
        conf["spark.driver.bindAddress"] = "127.0.0.1"
        conf["spark.driver.host"] = "127.0.0.1"
    for catalog in catalogs:
        conf.update(catalog.spark_conf())
    if table_format is TableFormat.DELTA:
        return delta_conf(conf, delta_jars())
    return conf


def session_conf(
    catalogs: Iterable[CatalogConfig],
    *,
    master: str = DEFAULT_MASTER,
    app_name: str = "icefall",
    extra_conf: Mapping[str, str] | None = None,
    table_format: TableFormat = TableFormat.ICEBERG,
) -> dict[str, str]:
    """The whole conf of a session: the base (`spark_conf`) for the master and application name that
    `extra_conf` names (else `master`, `app_name`), then `extra_conf`; FAIR scheduling with its pools."""
    extra = dict(extra_conf or {})
    master = extra.get("spark.master", master)
    app_name = extra.get("spark.app.name", app_name)
    base = spark_conf(catalogs, master=master, app_name=app_name, table_format=table_format)
    conf = {**base, **extra}
    if conf.get("spark.scheduler.mode") == "FAIR":
        conf.setdefault("spark.scheduler.allocation.file", FAIR_SCHEDULING["spark.scheduler.allocation.file"])
    return conf


def launch_and_late_conf(
    conf: Mapping[str, str], catalogs: Iterable[CatalogConfig]
) -> tuple[dict[str, str], dict[str, str]]:
    """`conf` split in two: what spark-submit may start the JVM with, and the options of `catalogs` whose
    value holds one of their secret values (a secret property, or an option derived from one, such as a
    JDBC password or Azure's shared key), to set on the running session instead (module doc)."""
    catalogs = list(catalogs)
    secrets = {value for catalog in catalogs for value in catalog.secrets.values() if value}
    prefixes = tuple(catalog.spark_prefix for catalog in catalogs)
    late = {
        key: value
        for key, value in conf.items()
        if key.startswith(prefixes) and any(secret in value for secret in secrets)
    }
    return {key: value for key, value in conf.items() if key not in late}, late


def build_spark_session(
    catalogs: Iterable[CatalogConfig],
    *,
    master: str = DEFAULT_MASTER,
    app_name: str = "icefall",
    extra_conf: Mapping[str, str] | None = None,
    table_format: TableFormat = TableFormat.ICEBERG,
) -> SparkSession:
    """The session of `session_conf`, or the one this process already has (Spark keeps one per JVM); the
    catalogs' secret options are set once the JVM runs (module doc). `table_format` delta: a Delta table's
    session (Delta Lake's jars, extension and catalog; the process's first session decides)."""
    from pyspark.sql import SparkSession

    from icefall.spark.jvm_names import remember_jvm_names

    # Executors (local or remote) must run the same Python as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # The JVM PySpark starts inherits this environment (see DRIVER_MALLOC_ARENAS).
    os.environ.setdefault("MALLOC_ARENA_MAX", DRIVER_MALLOC_ARENAS)
    quiet_lost_jvm_connections()
    pyspark_flags_without_pyarrow()
    catalogs = list(catalogs)
    conf = session_conf(
        catalogs, master=master, app_name=app_name, extra_conf=extra_conf, table_format=table_format
    )
    if any(catalog.type is CatalogType.REST for catalog in catalogs):
        # Iceberg Java talks to each REST catalog through a proxy that drops the classes its answers name,
        # listening where Spark's driver does, so that executors reach it too (icefall.catalog.rest_proxy).
        catalogs = through_proxies(catalogs, conf.get("spark.driver.host") or LOOPBACK)
        conf = session_conf(
            catalogs, master=master, app_name=app_name, extra_conf=extra_conf, table_format=table_format
        )
    launch, late = launch_and_late_conf(conf, catalogs)
    builder = SparkSession.builder
    for key, value in launch.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    for key, value in late.items():  # after the JVM started: never on its command line
        session.conf.set(key, value)
    session.sparkContext.setLogLevel("WARN")
    remember_jvm_names(session.sparkContext._jvm)
    # Ingestion sets `kafka.group.id` on purpose (one group per writer, partitions assigned, nothing
    # committed: `icefall.ingest.engine.read_kafka`); Spark's warning about it, meant for subscribed
    # streaming queries, would otherwise be logged on every read.
    jvm: Any = session.sparkContext._jvm
    log4j = jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setLevel(
        "org.apache.spark.sql.kafka010.KafkaSourceProvider", log4j.Level.ERROR
    )
    # The dead-letter reasons of a wide record are one large expression: its generated code is past what
    # Janino compiles, and Spark falls back to interpreting that plan (the same results, slower). Both
    # classes would log it with the whole plan, megabytes at every batch with bad records.
    for noisy in (
        "org.apache.spark.sql.execution.WholeStageCodegenExec",
        "org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator",
    ):
        log4j.core.config.Configurator.setLevel(noisy, log4j.Level.FATAL)
    return session


class _LostJvmConnection(logging.Filter):
    """Py4J logs a lost connection to the JVM on the root logger with its whole traceback, then raises an
    error to the caller, who reports it (and `jvm_stopped` tells a stop from a failure). This keeps that
    record to one line: a SIGTERM to the process group ends the JVM under a running call, and a traceback
    in the log of an orderly stop reads as a crash."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Exception while sending command." and "py4j" in record.pathname and record.exc_info:
            error, why = record.exc_info[1], ""
            cause = getattr(error, "__cause__", None) or getattr(error, "__context__", None)
            if cause is not None:
                why = f" ({type(cause).__name__}: {cause})"
            record.msg, record.args = "Py4J lost its connection to Spark's JVM: %s%s", (error, why)
            record.exc_info, record.exc_text = None, None
        return True


def pyspark_flags_without_pyarrow() -> None:
    """Import `pyspark.testing.utils` with pyarrow hidden, unless pyarrow is loaded already. PySpark
    imports that module at run time for its one flag `have_numpy` (in `functions.lit` and Py4J's NumPy
    converters, asked about every argument of every JVM call), and the module also imports pyarrow and
    probes pandas to fill the flags of PySpark's own tests: +29 MiB of the driver's RSS for nothing
    (bench/results/memory.md). Hidden, its `have_pyarrow` is False, which only PySpark's doctests read;
    anything that imports pyarrow afterwards gets it as usual."""
    if "pyspark.testing.utils" in sys.modules or "pyarrow" in sys.modules:
        return
    sys.modules["pyarrow"] = None  # type: ignore[assignment]  # an import of it raises ImportError
    try:
        import pyspark.testing.utils  # noqa: F401 - loaded now, without pyarrow
    finally:
        del sys.modules["pyarrow"]


def quiet_lost_jvm_connections() -> None:
    """Install `_LostJvmConnection` on the root logger, once."""
    root = logging.getLogger()
    if not any(isinstance(each, _LostJvmConnection) for each in root.filters):
        root.addFilter(_LostJvmConnection())


def jvm_stopped(spark: SparkSession | None, error: BaseException | None = None) -> bool:
    """True when the session's JVM (the process PySpark started) has exited: a SIGTERM sent to the whole
    process group ends it at once, beside this process's orderly stop. Its errors then say nothing about
    the work (and a Py4J error cannot even be turned into text). When `error` (or one it was raised while
    handling) is a lost connection to the JVM, or says that a pool or SparkContext of the JVM was shut
    down, the JVM is given a few seconds to finish exiting: its shutdown hooks stop those pools (Iceberg's
    commit workers among them) while it still answers, and it stops answering after them."""
    gateway = getattr(getattr(spark, "sparkContext", None), "_gateway", None)
    jvm = getattr(gateway, "proc", None)
    if jvm is None:
        return False
    if jvm.poll() is not None:
        return True
    if not (_lost_connection(error) or _shut_down_inside(error)):
        return False
    try:
        jvm.wait(JVM_EXIT_SECONDS)
    except subprocess.TimeoutExpired:
        return False
    return True


#: How long a JVM that stopped answering may take to exit (its shutdown hooks stop Spark's executors).
JVM_EXIT_SECONDS = 15.0


def _lost_connection(error: BaseException | None) -> bool:
    from py4j.protocol import Py4JNetworkError

    seen = 0
    while error is not None and seen < 10:
        if isinstance(error, Py4JNetworkError | ConnectionError):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


#: What the JVM's errors say when its shutdown hooks stopped a pool or the SparkContext under a running call.
_SHUTDOWN_MARKS = ("RejectedExecutionException", "SparkContext was shut down", "stopped SparkContext")


def _shut_down_inside(error: BaseException | None) -> bool:
    seen = 0
    while error is not None and seen < 10:
        try:
            text = f"{type(error).__name__}: {error}"
        except Exception:  # a Py4J error whose JVM is gone cannot be turned into text
            text = ""
        if any(mark in text for mark in _SHUTDOWN_MARKS):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def local_dirs(spark: SparkSession | None) -> str | None:
    """Where `spark` writes its shuffle and spill files (and, in local mode, its copy of the jars): its
    local dirs as Spark resolves them (`SPARK_LOCAL_DIRS`, else `spark.local.dir`, else the JVM's temp
    dir), comma-separated; None when the JVM cannot say."""
    try:
        conf = spark.sparkContext._jsc.sc().conf()  # type: ignore[union-attr]
        dirs = spark._jvm.org.apache.spark.util.Utils.getConfiguredLocalDirs(conf)  # type: ignore[union-attr]
        return ",".join(str(d) for d in dirs) or None
    except Exception:  # no session (tests), or the JVM is gone: the outage line names no dir
        return None
