"""The driver's Py4J view of the JVM keeps the classes and packages it has resolved.

Py4J resolves each name the Python side uses on the JVM (`sc._jvm.functions`, `jvm.org.apache.iceberg`)
with a round trip, and the JVM answers a name that is not a class (each package prefix of a dotted path,
or a short name tried in turn against every imported package) with a class-path search that fails, in
every jar. PySpark repeats the same few names for every column expression of every batch; with the cloud
SDK bundles on the class path, those failed searches were 13 % of the driver JVM's CPU when it commits
small batches (bench/results/profile.md).

A name keeps its meaning for the life of the JVM: Icefall adds no jars and no Py4J imports once the session
runs. So what a name resolved to is kept on the object it was looked up on, where Python finds it as a plain
attribute from then on, with no round trip. Names that fail are not kept.
"""

from __future__ import annotations

from typing import Any

from py4j.java_gateway import JavaClass, JavaPackage, JVMView


class _RememberingPackage(JavaPackage):  # type: ignore[misc]  # py4j has no types
    def __getattr__(self, name: str) -> Any:
        return _remember(self, name, super().__getattr__(name))


class _RememberingView(JVMView):  # type: ignore[misc]  # py4j has no types
    def __getattr__(self, name: str) -> Any:
        return _remember(self, name, super().__getattr__(name))


def _remember(owner: object, name: str, found: Any) -> Any:
    if type(found) is JavaPackage:
        found.__class__ = _RememberingPackage  # its own names are kept too
    if isinstance(found, JavaClass | JavaPackage):
        owner.__dict__[name] = found
    return found


def remember_jvm_names(view: JVMView) -> None:
    """Make `view` (a SparkContext's `_jvm`, shared by all of PySpark) keep what it resolves."""
    if type(view) is JVMView:
        view.__class__ = _RememberingView
