"""What an engine file is, from its own bytes: an ONNX graph, a .pt2 archive, or neither
(a TensorRT plan, whose serialization NVIDIA does not document).

A report's `kind` is a word in a file that may have been rewritten; deploy names the Triton
platform (onnxruntime_onnx, tensorrt_plan, ...) after it, so a kind changed to "tensorrt"
would ship ONNX bytes as model.plan. The file's leading bytes say what it is:

    pt2 archive   a zip (torch.export's package): b"PK\\x03\\x04"
    onnx          a ModelProto: protobuf whose first field is ir_version (field 1, varint),
                  tag byte 0x08, the order onnx's serializer always writes
    plan          anything else: a TensorRT plan is an opaque binary, so it is recognised as
                  being neither of the two above
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core import safe_files

FORMAT_OF_KIND = {"onnxruntime": "onnx", "tensorrt": "plan", "aotinductor": "pt2 archive"}
_ZIP = b"PK\x03\x04"
_ONNX_FIRST_TAG = 0x08  # field 1 (ir_version), wire type 0 (varint)


def sniff(path: Path) -> str:
    """"onnx", "pt2 archive" or "plan" (see the module docstring); "empty" for no bytes."""
    with safe_files.open_regular(path) as f:
        head = f.read(8)
    if not head:
        return "empty"
    if head.startswith(_ZIP):
        return "pt2 archive"
    if head[0] == _ONNX_FIRST_TAG:
        return "onnx"
    return "plan"


def mismatch(kind: str, path: Path) -> str | None:
    """Why `path` cannot be a `kind` engine (one line), or None when its bytes fit."""
    expected = FORMAT_OF_KIND.get(kind)
    if expected is None:
        return None  # a kind added by a plugin: its backend knows its own format
    found = sniff(path)
    if found != expected:
        return f"a `{kind}` engine file holds {expected} bytes, this one holds {found} bytes"
    return None
