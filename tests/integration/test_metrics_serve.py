"""`icefall.runtime.metrics.serve` on real loopback sockets.

Proves: a port already taken raises for the processes that must serve (`icefall run`, `icefall operator`)
and is logged, not raised, for the pods (`required=False`: the e2e tests' local kubelet runs every pod on the
host's network, where a real cluster gives each pod its own); port 0 serves nothing; a free port serves
/metrics with Icefall's series. Not proved: anything about a real cluster's pod network.
"""

from __future__ import annotations

import logging
import socket
import urllib.request

import pytest

from icefall.runtime import metrics

pytestmark = pytest.mark.integration


def test_a_taken_port_raises_unless_not_required(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            metrics.serve(port)
        with caplog.at_level(logging.WARNING, logger="icefall.runtime.metrics"):
            metrics.serve(port, required=False)
        assert f"metrics not served on port {port}" in caplog.text
    metrics.serve(0)  # off: nothing to bind


def test_a_free_port_serves_the_registry() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics.FRESHNESS_TARGET.labels(table="it.serve").set(10)
    metrics.serve(port, required=False)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'icefall_freshness_target_seconds{table="it.serve"} 10.0' in text
