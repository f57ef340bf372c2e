"""spark_images/Dockerfile, checked statically: the image is built from the one jar list and
the pinned Python packages.

Proves:
- the Maven stage copies spark_images/pom.xml and resolves it with `dependency:copy-dependencies`, and its
  jars land in Spark's jar folder; no other jar list exists but Delta Lake's (spark_images/delta/pom.xml),
  resolved in the same stage into a folder of its own that `ICEFALL_DELTA_JARS` names, outside Spark's jar
  folder (only Delta tables' sessions add them); the build context lets both poms in and hack/build-image.sh's
  tag hashes both; no `--packages`, `spark.jars.packages`, Maven coordinates or jar downloads are in the
  Dockerfile;
- every stage builds on the one Debian 12 `BASE` argument (no other registry's image), Spark is the pinned
  pyspark's, whose version is the pom's spark.version;
- the dependencies are installed with constraints.txt, the source with no further dependencies;
- the final user is numeric and not root, and the entrypoint is set.
That the image builds and runs: every e2e pod is a container from it (e2e/test_node.py and the others).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from icefall.spark.session import DELTA_JARS_VARIABLE

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "spark_images" / "Dockerfile"
POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, comments dropped and continuation lines joined."""
    text = re.sub(r"^\s*#.*\n", "", DOCKERFILE.read_text(), flags=re.M)
    text = re.sub(r"\\\n", " ", text)
    result = []
    for line in text.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def _args() -> dict[str, str]:
    """Default values of the Dockerfile's ARGs (the first default wins, like the global ones)."""
    values: dict[str, str] = {}
    for keyword, rest in _instructions():
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            values.setdefault(name, value)
    return values


def _expand(text: str) -> str:
    args = _args()
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), text)


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _pom_property(name: str) -> str:
    value = (
        ET.parse(ROOT / "spark_images" / "pom.xml")
        .getroot()
        .findtext(f"m:properties/m:{name}", namespaces=POM_NS)
    )
    assert value, name
    return value


def _pinned(package: str) -> str:
    found = re.search(rf"^{package}==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert found is not None, package
    return found.group(1)


def test_jars_come_from_the_one_pom_into_sparks_jar_folder() -> None:
    maven = [stage for stage in _stages() if any("mvn" in rest for kw, rest in stage if kw == "RUN")]
    assert len(maven) == 1, "exactly one Maven stage"
    stage = maven[0]
    alias = stage[0][1].split()[-1]
    copies = [rest for kw, rest in stage if kw == "COPY"]
    assert any(rest.split()[0] == "spark_images/pom.xml" for rest in copies), copies
    runs = " ".join(rest for kw, rest in stage if kw == "RUN")
    assert "dependency:copy-dependencies" in runs
    out = re.search(r"-DoutputDirectory=(\S+)", runs)
    assert out is not None
    final = _stages()[-1]
    assert any(
        kw == "COPY"
        and f"--from={alias}" in rest
        and out.group(1) in rest
        and rest.split()[-1].startswith("/opt/spark/jars")
        for kw, rest in final
    ), "the resolved jars are copied into /opt/spark/jars"


def test_no_second_jar_list() -> None:
    text = " ".join(rest for _, rest in _instructions())
    for forbidden in ("--packages", "spark.jars.packages", "spark.jars=", "ivy", "curl ", "wget ", ".jar "):
        assert forbidden not in text, forbidden
    for maven_coordinate in re.findall(r"\b[\w.-]+:[\w.-]+:\d[\w.-]*\b", text):
        pytest.fail(f"a Maven coordinate in the Dockerfile: {maven_coordinate}")
    poms = [p for p in ROOT.glob("spark_images/**/*") if p.name.endswith(("pom.xml", ".jars", "jars.txt"))]
    # Beside the one list, only Delta Lake's: the jars only Delta tables' sessions add.
    assert sorted(poms) == [ROOT / "spark_images" / "delta" / "pom.xml", ROOT / "spark_images" / "pom.xml"]


def test_delta_jars_in_a_folder_of_their_own_named_by_icefall_delta_jars() -> None:
    (maven,) = [stage for stage in _stages() if any("mvn" in rest for kw, rest in stage if kw == "RUN")]
    alias = maven[0][1].split()[-1]
    copies = [rest.split() for kw, rest in maven if kw == "COPY"]
    assert ["spark_images/delta/pom.xml", "delta/pom.xml"] in copies, copies
    (run,) = [rest for kw, rest in maven if kw == "RUN" and "delta/pom.xml" in rest]
    out = re.search(r"-DoutputDirectory=(\S+)", run)
    assert out is not None and "dependency:copy-dependencies" in run
    final = _stages()[-1]
    (target,) = [
        rest.split()[-1]
        for kw, rest in final
        if kw == "COPY" and f"--from={alias}" in rest and out.group(1) in rest
    ]
    assert not target.startswith("/opt/spark"), "Iceberg sessions must not load Delta's jars"
    env = " ".join(rest for kw, rest in final if kw == "ENV")
    found = re.search(rf"\b{DELTA_JARS_VARIABLE}=(\S+)", env)
    assert found is not None and found.group(1).rstrip("/") == target.rstrip("/"), env
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "!spark_images/delta/pom.xml" in ignore and "!spark_images/pom.xml" in ignore
    assert "spark_images/delta/pom.xml" in (ROOT / "hack" / "build-image.sh").read_text()


def test_debian_base_and_spark_from_the_pinned_pyspark() -> None:
    # No image of another registry: every stage builds FROM the one BASE argument, a Debian 12 image
    # (debootstrap's here, debian:bookworm-slim elsewhere), and Spark is the pinned pyspark's.
    assert _pom_property("spark.version") == _pinned("pyspark")
    assert re.fullmatch(r"debian:bookworm(-slim)?", _args()["BASE"]), _args()["BASE"]
    assert all(stage[0][1].split()[0] == "${BASE}" for stage in _stages()), [s[0] for s in _stages()]
    final = " ".join(rest for kw, rest in _stages()[-1] if kw == "RUN")
    assert "pyspark" in final and "/opt/spark" in final, "SPARK_HOME links to the pyspark package"


def test_dependencies_pinned_by_constraints_and_the_source_installed_without_more() -> None:
    final = _stages()[-1]
    installs = [rest for kw, rest in final if kw == "RUN" and "pip install" in rest]
    assert len(installs) == 2, installs
    dependencies, source = installs
    assert re.search(r"(--constraint|-c)[ =]/tmp/build/constraints.txt\b", dependencies), dependencies
    assert "--no-deps" in source, source


def test_runs_as_a_numeric_non_root_user_with_an_entrypoint() -> None:
    final = _stages()[-1]
    users = [rest for kw, rest in final if kw == "USER"]
    assert users, "the final stage sets USER"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) > 0, users[-1]
    assert not group or (group.isdigit() and int(group) > 0), users[-1]
    assert [kw for kw, _ in final].count("ENTRYPOINT") == 1
