"""Py4J's own log record of a lost connection to the JVM is one line, not a traceback: a SIGTERM to the
process group ends the JVM under a running call, and the log of that orderly stop must not read as a crash
(the caller still gets Py4J's error and reports it).

Proves it with Py4J's real client against a loopback server that drops the connection mid-command.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading

import pytest
from py4j.java_gateway import GatewayClient, GatewayParameters

from icefall.spark.session import quiet_lost_jvm_connections

pytestmark = pytest.mark.unit


def dropping_server() -> tuple[socket.socket, threading.Thread]:
    """Accepts a connection, reads a command and resets the connection, like a JVM that exits mid-call (Py4J
    does not retry a command whose answer was lost)."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = server.accept()
        connection.recv(65536)
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
        connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def lost_connection_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    server, thread = dropping_server()
    client = GatewayClient(gateway_parameters=GatewayParameters(port=server.getsockname()[1]))
    try:
        with caplog.at_level(logging.WARNING):  # what a process shows: its root logger's default
            assert client.send_command("c\nt\ngetName\ne\n") == "x"  # Py4J's error answer, raised by callers
    finally:
        client.close()
        server.close()
        thread.join(5)
    return [each for each in caplog.records if "py4j" in each.pathname and each.levelno >= logging.ERROR]


def test_py4j_logs_a_lost_connection_with_its_traceback_by_default(caplog: pytest.LogCaptureFixture) -> None:
    root = logging.getLogger()
    saved = list(root.filters)
    for each in saved:
        root.removeFilter(each)
    try:
        (record,) = lost_connection_records(caplog)
        assert record.exc_info is not None  # what the filter is for
    finally:
        for each in saved:
            root.addFilter(each)


def test_a_lost_connection_is_one_line_with_its_cause(caplog: pytest.LogCaptureFixture) -> None:
    quiet_lost_jvm_connections()
    quiet_lost_jvm_connections()  # once is enough; twice installs nothing more
    assert sum(type(each).__name__ == "_LostJvmConnection" for each in logging.getLogger().filters) == 1
    (record,) = lost_connection_records(caplog)
    assert record.exc_info is None and record.exc_text is None
    message = record.getMessage()
    assert message.startswith("Py4J lost its connection to Spark's JVM: ")
    assert "Connection" in message  # the socket's own error, reset or closed
    assert "Traceback" not in caplog.text
