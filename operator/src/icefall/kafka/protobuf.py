"""A registry's Protobuf schema as a self-contained `FileDescriptorSet` (base64 text: what
`icefall.api.protobuf_schema` and `icefall.decode.protobuf` read).

A registry holds a Protobuf schema as either
- a base64 serialized `FileDescriptorProto` (what confluent-kafka's Python serializer registers, kept as
  such by Apicurio; Confluent's registry serves it on `?format=serialized`, which `WriterSchemas` asks
  for), used as it is; or
- `.proto` source text (what Java and Go serializers register), compiled with protoc from grpcio-tools
  (a wheel with protoc inside and the well-known types' .proto files beside it; no binary to install).

Imports of well-known types (google/protobuf/timestamp.proto, wrappers.proto, ...) are added to the set
from the protobuf package's own descriptors, or by protoc. Not supported: imports of other files
(registry schema references): `ProtobufSchemaError` naming the import.
"""

from __future__ import annotations

import base64
import binascii
import subprocess
import sys
import tempfile
from pathlib import Path

from icefall.api.protobuf_schema import ProtobufSchemaError

#: The well-known types' modules, imported so that the default pool holds their files.
_WELL_KNOWN = (
    "any_pb2",
    "duration_pb2",
    "empty_pb2",
    "field_mask_pb2",
    "struct_pb2",
    "timestamp_pb2",
    "wrappers_pb2",
)


def descriptor_set_text(schema: str) -> str:
    """The base64 `FileDescriptorSet` of a registry's Protobuf `schema` (the schema's file last)."""
    from google.protobuf.descriptor_pb2 import FileDescriptorProto, FileDescriptorSet
    from google.protobuf.message import DecodeError

    try:
        main = FileDescriptorProto.FromString(base64.b64decode(schema, validate=True))
    except (binascii.Error, DecodeError, ValueError):
        return _compiled(schema)
    files = FileDescriptorSet()
    for dependency in _well_known(main):
        files.file.append(dependency)
    files.file.append(main)
    return base64.b64encode(files.SerializeToString()).decode("ascii")


def _well_known(main: object) -> list[object]:
    """The files `main` imports, with theirs, dependencies first: well-known types only."""
    import importlib

    from google.protobuf import descriptor_pool
    from google.protobuf.descriptor_pb2 import FileDescriptorProto

    for module in _WELL_KNOWN:
        importlib.import_module(f"google.protobuf.{module}")
    pool = descriptor_pool.Default()
    found: dict[str, FileDescriptorProto] = {}

    def visit(names: list[str]) -> None:
        for name in names:
            if name in found:
                continue
            if not name.startswith("google/protobuf/"):
                raise ProtobufSchemaError(
                    f"the Protobuf schema imports {name}: only well-known types (google/protobuf/...) can be "
                    "imported; registry schema references are not supported"
                )
            try:
                descriptor = pool.FindFileByName(name)
            except KeyError as error:
                raise ProtobufSchemaError(f"the Protobuf schema imports {name}, which is unknown") from error
            proto = FileDescriptorProto()
            descriptor.CopyToProto(proto)
            visit(list(proto.dependency))
            found[name] = proto

    visit(list(getattr(main, "dependency", [])))
    return list(found.values())


def _compiled(source: str) -> str:
    """protoc's descriptor set (with imports) of `.proto` source text."""
    try:
        import grpc_tools
    except ImportError as error:  # pragma: no cover - a dependency of the package
        raise ProtobufSchemaError(
            f"the schema is .proto text and grpcio-tools is missing: {error}"
        ) from error
    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="icefall-proto-") as tmp:
        folder = Path(tmp)
        (folder / "schema.proto").write_text(source)
        out = folder / "schema.pb"
        # protoc in a child process: its errors go to its stderr, which is kept for the message.
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{folder}",
                f"-I{include}",
                f"--descriptor_set_out={out}",
                "--include_imports",
                "schema.proto",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0 or not out.exists():
            why = " ".join(done.stderr.split())[:500]
            raise ProtobufSchemaError(f"protoc cannot compile the Protobuf schema: {why}")
        return base64.b64encode(out.read_bytes()).decode("ascii")
