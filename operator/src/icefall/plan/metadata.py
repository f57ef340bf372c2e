"""The metadata every child of a StreamingTable carries. Pure: no client, no I/O.

Guarantees: every child gets the labels of `icefall.plan.names.labels`, the submission id
`icefall.dev/spec-hash`, the annotation `icefall.dev/generation` (the generation it was rendered from: intent,
recorded before launching) and a controller owner reference to the StreamingTable (blockOwnerDeletion), so
the garbage collector removes it with its owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from icefall.api import API_VERSION, KIND
from icefall.plan import names

Manifest = dict[str, Any]


@dataclass(frozen=True)
class ChildMeta:
    """The StreamingTable `namespace/name` (uid `uid`, generation `generation`) as its children's owner,
    rendered with the spec hash `digest`."""

    name: str
    namespace: str
    uid: str
    generation: int
    digest: str

    def owner(self) -> Manifest:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def labels(self, component: str) -> dict[str, str]:
        return {**names.labels(self.name, component), names.LABEL_SPEC_HASH: self.digest}

    def metadata(self, name: str, component: str) -> Manifest:
        """The metadata of the child `name` of `component`."""
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": self.labels(component),
            "annotations": {names.ANNOTATION_GENERATION: str(self.generation)},
            "ownerReferences": [self.owner()],
        }
