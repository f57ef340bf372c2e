"""The console script answers --version and --help without starting anything; `make demo`'s command (a
development tool, not an `icefall` subcommand) answers --help too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from icefall import __version__

pytestmark = pytest.mark.unit


def test_version_and_help() -> None:
    version = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "--version"], check=False, capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.strip() == f"icefall {__version__}"
    usage = subprocess.run(
        [sys.executable, "-m", "icefall.cli", "--help"], capture_output=True, text=True, check=False
    )
    assert usage.returncode == 0 and "run" in usage.stdout and "demo" not in usage.stdout


def test_the_demo_is_a_development_command() -> None:
    usage = subprocess.run(
        [sys.executable, "-m", "icefall.devstack.demo", "--help"], capture_output=True, text=True, check=False
    )
    assert usage.returncode == 0 and "make demo" in usage.stdout, usage.stderr
