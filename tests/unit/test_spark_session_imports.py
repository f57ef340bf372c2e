"""What a driver's Python loads for PySpark's own flags (`icefall.spark.session`).

Proves (`pyspark_flags_without_pyarrow`): `pyspark.testing.utils`, which PySpark imports at run time
(`functions.lit`, Py4J's NumPy converters), is loaded without pyarrow (~29 MiB of the driver's RSS,
bench/results/memory.md) and keeps the one flag PySpark reads at run time, `have_numpy`, true to what is
installed; pyarrow still imports afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import icefall

pytestmark = pytest.mark.unit

SCRIPT = """
import importlib.util, sys
from icefall.spark.session import pyspark_flags_without_pyarrow
pyspark_flags_without_pyarrow()
import pyspark.testing.utils as flags
loaded = "pyarrow" in sys.modules
import pyarrow
print(loaded, flags.have_numpy == (importlib.util.find_spec("numpy") is not None), pyarrow.__name__)
"""


def test_pysparks_flags_load_without_pyarrow_and_pyarrow_still_imports_after() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(icefall.__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "pyarrow"]
