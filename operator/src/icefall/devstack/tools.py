"""Where the provisioned binaries and jars are.

`make` exports their folders as environment variables (ICEFALL_KUBE_BIN, ICEFALL_ETCD_BIN, ICEFALL_HELM_BIN,
ICEFALL_MINIO_BIN, ICEFALL_PROMTOOL_BIN, ICEFALL_KAFKA_JARS, ICEFALL_SPARK_JARS, ICEFALL_DELTA_JARS: the jars
only Delta tables' sessions add, ICEFALL_REST_CATALOG_JARS, ICEFALL_REGISTRY_HOME: the unpacked schema
registry distribution, ICEFALL_AZURITE_BIN: the Azure Storage emulator's executables, ICEFALL_FAKE_GCS_BIN:
the GCS emulator).
When one is unset and this runs from a checkout, the matching `hack/` script is called: it builds or resolves
into the version-keyed cache and prints the folder.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_SCRIPTS = {
    "ICEFALL_KUBE_BIN": ("build-go-tools.sh", "kube"),
    "ICEFALL_ETCD_BIN": ("build-go-tools.sh", "etcd"),
    "ICEFALL_HELM_BIN": ("build-go-tools.sh", "helm"),
    "ICEFALL_MINIO_BIN": ("build-go-tools.sh", "minio"),
    "ICEFALL_FAKE_GCS_BIN": ("build-go-tools.sh", "fake-gcs-server"),
    "ICEFALL_PROMTOOL_BIN": ("build-go-tools.sh", "promtool"),
    "ICEFALL_KAFKA_JARS": ("fetch-jars.sh", "kafka"),
    "ICEFALL_SPARK_JARS": ("fetch-jars.sh", "spark"),
    "ICEFALL_DELTA_JARS": ("fetch-jars.sh", "delta"),
    "ICEFALL_REST_CATALOG_JARS": ("fetch-jars.sh", "rest-catalog"),
    "ICEFALL_REGISTRY_HOME": ("fetch-jars.sh", "registry"),
    "ICEFALL_AZURITE_BIN": ("fetch-npm-tools.sh", "azurite"),
}


class ToolMissingError(RuntimeError):
    pass


def repo_root() -> Path | None:
    for parent in Path(__file__).resolve().parents:
        if (parent / "hack" / "versions.env").is_file():
            return parent
    return None


def tool_dir(variable: str) -> Path:
    """The folder named by `variable`, provisioning it through `hack/` when unset."""
    value = os.environ.get(variable)
    if value:
        path = Path(value)
        if not path.is_dir():
            raise ToolMissingError(f"{variable}={value} is not a folder; run `make setup` or unset it")
        return path
    root = repo_root()
    script, arg = _SCRIPTS[variable]
    if root is None:
        raise ToolMissingError(f"{variable} is not set and no checkout with hack/{script} was found")
    out = subprocess.run(
        [str(root / "hack" / script), arg], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    os.environ[variable] = out
    return Path(out)


def jar_files(variable: str) -> list[Path]:
    jars = sorted(tool_dir(variable).glob("*.jar"))
    if not jars:
        raise ToolMissingError(f"no jars in {tool_dir(variable)}; delete it and run `make setup`")
    return jars
