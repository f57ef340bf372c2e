"""Where a Delta deletion vector's file is (Delta's PROTOCOL.md, "Deletion Vector Descriptor").

A `deletionVector` descriptor names its bitmap by `storageType`: `u` a file in the table's folder, whose
name holds a UUID (`pathOrInlineDv` = an optional random prefix, a folder, then the UUID in 20 characters
of Z85: `<prefix>/deletion_vector_<uuid>.bin`); `p` an absolute URI; `i` the bitmap inline (no file).
`vector_file` gives the table-relative path of a `u` file (what VACUUM must keep and an upload must
carry), `with_absolute_vector` the same descriptor as a `p` one under another folder's URI (the keyed
MERGE's shadow reads the table's vectors where they are: `icefall.ingest.delta_keyed`).

Guarantees: a `u` descriptor whose text is not 20 Z85 characters after its prefix raises ValueError (never
a guessed path); `p` and `i` descriptors have no table-relative file (None).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

#: ZeroMQ's Z85 alphabet, which Delta's `Base85Codec` encodes UUIDs with (16 bytes → 20 characters).
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_DIGITS = {c: i for i, c in enumerate(_Z85)}
_ENCODED_UUID_LENGTH = 20
IN_TABLE, ABSOLUTE, INLINE = "u", "p", "i"


def decode_uuid(text: str) -> uuid.UUID:
    """The UUID of Delta's 20-character Z85 text (four 5-character groups, each a big-endian 32-bit word)."""
    if len(text) != _ENCODED_UUID_LENGTH or any(c not in _DIGITS for c in text):
        raise ValueError(f"{text!r} is not a deletion vector's 20-character Z85 UUID")
    data = b""
    for start in range(0, _ENCODED_UUID_LENGTH, 5):
        word = 0
        for c in text[start : start + 5]:
            word = word * 85 + _DIGITS[c]
        data += word.to_bytes(4, "big")
    return uuid.UUID(bytes=data)


def vector_file(descriptor: Mapping[str, Any] | None) -> str | None:
    """The table-relative path (decoded, '/'-separated) of a `u` deletion vector's file; None for none,
    `p` (a URI, not this folder's) and `i` (inline)."""
    if not descriptor or descriptor.get("storageType") != IN_TABLE:
        return None
    text = str(descriptor["pathOrInlineDv"])
    prefix, encoded = text[:-_ENCODED_UUID_LENGTH], text[-_ENCODED_UUID_LENGTH:]
    name = f"deletion_vector_{decode_uuid(encoded)}.bin"
    return f"{prefix}/{name}" if prefix else name


def with_absolute_vector(add: Mapping[str, Any], base_uri: str) -> dict[str, Any]:
    """`add` (an add action's body) with its `u` deletion vector named by an absolute URI under
    `base_uri` (the table folder's, ending in '/'): a `p` descriptor with the same offset, size and
    cardinality. Other descriptors are kept as they are."""
    descriptor = add.get("deletionVector")
    relative = vector_file(descriptor)
    if descriptor is None or relative is None:
        return dict(add)
    from urllib.parse import quote

    # A checkpoint's row holds every field, unset ones null (maxRowIndex): the log's JSON omits them.
    kept = {k: v for k, v in descriptor.items() if v is not None}
    absolute = {**kept, "storageType": ABSOLUTE, "pathOrInlineDv": base_uri + quote(relative)}
    return {**add, "deletionVector": absolute}
