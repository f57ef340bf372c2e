"""One image name and one version everywhere a release names them.

Proves: the chart's default image (`image.repository` with the chart's appVersion as tag) is the
operator's `DEFAULT_IMAGE` (what an operator started without ICEFALL_IMAGE gives its pods), and the
chart's appVersion is the package's version (`icefall --version`, pyproject.toml). Not proved: that the
image exists in a registry (README, "In a cluster": it is pushed by whoever releases).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml

from icefall import __version__
from icefall.controller.reconcile import DEFAULT_IMAGE

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "icefall"


def test_the_chart_and_the_operator_name_one_image() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    assert (image["tag"], image["digest"]) == ("", ""), "the default follows appVersion"
    assert f"{image['repository']}:{chart['appVersion']}" == DEFAULT_IMAGE


def test_the_chart_ships_the_packages_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == __version__ == project["version"]
