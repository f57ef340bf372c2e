"""The e2e node's image import is tried again when containerd loses a layer it skipped (a fresh run's
"content digest ...: not found"), and gives up with the last error after its attempts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from icefall.devstack import node
from icefall.devstack.procs import StartError

pytestmark = pytest.mark.unit


class Runtime(node.Containerd):
    def __init__(self, failures: int) -> None:
        super().__init__(Path("/nonexistent/containerd"), "localhost/icefall-pause:1")
        self.failures, self.imports, self.removed = failures, 0, []

    def _import_from_podman(self, ref: str) -> None:
        self.imports += 1
        if self.imports <= self.failures:
            raise StartError(f"importing {ref} failed: ctr: content digest sha256:ab: not found")

    def ctr(self, *args: str, stdin: object = None) -> subprocess.CompletedProcess[str]:
        self.removed.append(args[-1])
        return subprocess.CompletedProcess(args, 0, "", "")


def test_an_import_that_lost_a_layer_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node.time, "sleep", lambda _: None)
    runtime = Runtime(failures=1)
    runtime.import_from_podman("localhost/icefall:abc")
    assert runtime.imports == 2 and runtime.removed == ["localhost/icefall:abc"]

    hopeless = Runtime(failures=5)
    with pytest.raises(StartError, match="not found"):
        hopeless.import_from_podman("localhost/icefall:abc")
    assert hopeless.imports == 3
