"""`remember_jvm_names`: the driver's Py4J view asks the JVM once per name, not at every use.

Proves, with Py4J's own view and package classes over a client that answers like the JVM and counts:
- a class or package resolved once is found again without a round trip, at any depth of a dotted path,
  through the short names PySpark uses (`jvm.functions`) and dotted ones (`getattr(jvm, "a.b.C")`);
- a name the JVM does not have is asked again (nothing false is kept);
- a view made to remember once is left as it is the second time.
"""

from __future__ import annotations

from collections import Counter

import pytest
from py4j import protocol
from py4j.java_gateway import GatewayClient, GatewayProperty, JavaClass, JavaPackage, JVMView
from py4j.protocol import Py4JError

from icefall.spark.jvm_names import remember_jvm_names

pytestmark = pytest.mark.unit

CLASSES = {"org.apache.spark.sql.functions", "org.apache.iceberg.spark.Spark3Util"}
IMPORTS = ("org.apache.spark.sql",)  # a star import, as PySpark's view has


class AnsweringClient(GatewayClient):
    """Answers Py4J's reflection command for unknown names as the JVM does (no connection is opened), and
    counts what it was asked."""

    def __init__(self) -> None:
        super().__init__(gateway_property=GatewayProperty(auto_field=False, pool=None))
        self.converters: list[object] = []  # set by a JavaGateway, read by each JavaClass
        self.asked: Counter[str] = Counter()

    def send_command(self, command: str, retry: bool = True, binary: bool = False) -> str:
        name = command.split("\n")[2]  # r, u, the name, the view
        self.asked[name] += 1
        for fqn in (name, *(f"{package}.{name}" for package in IMPORTS)):
            if fqn in CLASSES:
                return protocol.SUCCESS_CLASS + fqn
        if name == "missing":
            return protocol.ERROR + "ynot found"
        return protocol.SUCCESS_PACKAGE


def view() -> tuple[JVMView, AnsweringClient]:
    client = AnsweringClient()
    jvm = JVMView(client, "default", id="rj")
    remember_jvm_names(jvm)
    return jvm, client


def test_names_are_asked_once_at_every_depth() -> None:
    jvm, client = view()
    for _ in range(3):
        util = jvm.org.apache.iceberg.spark.Spark3Util
        functions = jvm.functions
        dotted = getattr(jvm, "org.apache.spark.sql.functions")
    assert isinstance(util, JavaClass) and util._fqn == "org.apache.iceberg.spark.Spark3Util"
    assert isinstance(functions, JavaClass) and functions._fqn == "org.apache.spark.sql.functions"
    assert dotted._fqn == "org.apache.spark.sql.functions"
    assert isinstance(jvm.org.apache, JavaPackage)
    assert client.asked == {
        "org": 1,
        "org.apache": 1,
        "org.apache.iceberg": 1,
        "org.apache.iceberg.spark": 1,
        "org.apache.iceberg.spark.Spark3Util": 1,
        "functions": 1,
        "org.apache.spark.sql.functions": 1,
    }


def test_a_view_without_it_asks_at_every_use() -> None:
    client = AnsweringClient()
    jvm = JVMView(client, "default", id="plain")
    for _ in range(3):
        jvm.functions  # noqa: B018 - the lookup is what is counted
    assert client.asked["functions"] == 3


def test_a_name_the_jvm_lacks_is_asked_again() -> None:
    jvm, client = view()
    for _ in range(2):
        with pytest.raises(Py4JError):
            jvm.missing  # noqa: B018 - the lookup is what is counted
    assert client.asked["missing"] == 2


def test_remembering_twice_changes_nothing() -> None:
    jvm, client = view()
    jvm.functions  # noqa: B018 - the lookup is what is counted
    remember_jvm_names(jvm)
    jvm.functions  # noqa: B018 - the lookup is what is counted
    assert client.asked["functions"] == 1
