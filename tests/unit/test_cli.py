"""The console script answers --version and --help without starting anything."""

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
    assert usage.returncode == 0 and "demo" in usage.stdout
