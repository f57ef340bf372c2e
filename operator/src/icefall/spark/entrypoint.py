"""The image's entry point (spark_images/Dockerfile), where Apache Spark's images have `/opt/entrypoint.sh`.

Spark on Kubernetes creates executor pods with no `command` and the single argument `executor`: the entry
point turns the variables Spark sets on the pod (SPARK_DRIVER_URL, SPARK_EXECUTOR_ID, SPARK_EXECUTOR_CORES,
SPARK_EXECUTOR_MEMORY, SPARK_APPLICATION_ID, SPARK_EXECUTOR_POD_IP, SPARK_EXECUTOR_POD_NAME,
SPARK_RESOURCE_PROFILE_ID, SPARK_CONF_DIR and the JVM options SPARK_JAVA_OPT_<n>) into the executor JVM's
command line: Spark's jars are pyspark's ($SPARK_HOME/jars, where the image also puts Icefall's), plus the
folder `ICEFALL_SPARK_JARS` names when it is set. Any other arguments run as a command, as Spark's entry
point does. It replaces itself with the JVM (same pid), so the runtime's signals reach the executor.

The JVM also gets `-Dspark.master` (the API server's in-cluster address, as the driver's): before it has
the driver's conf, Spark's executor fetches it over RPC with a SecurityManager built from its own JVM
options only, which reads the table's secret file (`spark.authenticate.secret.file`, see
`icefall.plan.isolation`) only when its master is a `k8s://` one, and Spark passes executors no master.
Without it, authenticated RPC fails at once ("A secret key must be specified via the
spark.authenticate.secret config"). The driver's conf then replaces it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

EXECUTOR_BACKEND = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
_JAVA_OPT = re.compile(r"^SPARK_JAVA_OPT_(\d+)$")
_MASTER_OPTION = "-Dspark.master="


def executor_command(environ: Mapping[str, str], spark_jars: Path) -> list[str]:
    """The executor JVM's argv from the pod's environment (what the image's entry point runs)."""
    # Here, not at the top: the entry point's other commands start without importing the API models.
    from icefall.plan.spark_conf import KUBERNETES_MASTER, in_cluster_master

    missing = [
        name
        for name in ("SPARK_DRIVER_URL", "SPARK_EXECUTOR_ID", "SPARK_EXECUTOR_CORES", "SPARK_APPLICATION_ID")
        if not environ.get(name)
    ]
    if missing:
        raise SystemExit(f"executor: {', '.join(missing)} not set (Spark sets them on executor pods)")
    options = [
        environ[name]
        for name in sorted((n for n in environ if _JAVA_OPT.match(n)), key=lambda n: int(n.rsplit("_", 1)[1]))
    ]
    if not any(option.startswith(_MASTER_OPTION) for option in options):  # see the module doc
        options.append(f"{_MASTER_OPTION}{in_cluster_master(KUBERNETES_MASTER, environ)}")
    memory = environ.get("SPARK_EXECUTOR_MEMORY", "1g")
    classpath = [
        *([environ["SPARK_CONF_DIR"]] if environ.get("SPARK_CONF_DIR") else []),
        f"{spark_jars}/*",
        *([f"{environ['ICEFALL_SPARK_JARS']}/*"] if environ.get("ICEFALL_SPARK_JARS") else []),
        os.getcwd(),
    ]
    java = f"{environ['JAVA_HOME']}/bin/java" if environ.get("JAVA_HOME") else "java"
    return [
        java,
        *options,
        f"-Xms{memory}",
        f"-Xmx{memory}",
        "-cp",
        ":".join(classpath),
        EXECUTOR_BACKEND,
        "--driver-url", environ["SPARK_DRIVER_URL"],
        "--executor-id", environ["SPARK_EXECUTOR_ID"],
        "--cores", environ["SPARK_EXECUTOR_CORES"],
        "--app-id", environ["SPARK_APPLICATION_ID"],
        "--hostname", environ.get("SPARK_EXECUTOR_POD_IP", "127.0.0.1"),
        "--resourceProfileId", environ.get("SPARK_RESOURCE_PROFILE_ID", "0"),
        "--podName", environ.get("SPARK_EXECUTOR_POD_NAME", ""),
    ]  # fmt: skip


def main(argv: Sequence[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m icefall.spark.entrypoint executor | <command> [args...]")
    if argv[0] != "executor":
        os.execvp(argv[0], list(argv))
    import pyspark

    command = executor_command(os.environ, Path(pyspark.__file__).parent / "jars")
    print(
        f"[entrypoint] executor {os.environ.get('SPARK_EXECUTOR_ID')}: {' '.join(command[:1])} ...",
        flush=True,
    )
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
