"""Layer truth: what precision a TensorRT engine really runs in, from its inspector JSON.

TensorRT's engine inspector (`IEngineInspector.get_engine_information(LayerInformationFormat.JSON)`,
or `trtexec --exportLayerInfo`) describes every layer of the built engine:

    {"Layers": [{"Name": "...", "LayerType": "CaskGemm" | "Reformat" | ...,
                 "Inputs":  [{"Name": "...", "Location": "Device", "Dimensions": [2, 64, 32],
                              "Format/Datatype": "Row major linear Int8 format"}, ...],
                 "Outputs": [...], "ParameterType": "...", "TacticName": "...", ...}, ...],
     "Bindings": ["input_ids", "logits"]}

TensorRT 11 replaces `Bindings` with `I/O Tensors` and splits `Format/Datatype` into a
`Format` and a `DataType` field; a tensor's data type is read from whichever it has. With a
profiling verbosity below DETAILED the layers are bare name strings and no precision
can be read. A layer's precision follows TREx (TensorRT Engine Explorer): the data type of
its first input, falling back to the narrowest float/int8 tensor it touches when that first
input is an index or shape tensor. Per-layer times (ms, by layer name) come from an
IProfiler run (or trtexec --exportProfile) and weight the shares by time.

Pure Python: runs on any machine, so the arithmetic is tested without TensorRT.
"""

from __future__ import annotations

import re

from pipeline.artifacts.report import Gate
from pipeline.core.json_object import JsonObject

# Precision categories, narrowest first; `other` is index/shape/bool work.
CATEGORIES = ("fp4", "int4", "int8", "fp8", "fp16", "bf16", "fp32", "other")
_BITS = {"fp4": 4, "int4": 4, "int8": 8, "fp8": 8, "fp16": 16, "bf16": 16, "fp32": 32}

# Data-type words as they appear in "Format/Datatype" strings (TensorRT 8.6-10.x, kgen names
# included) and in TensorRT 11's "DataType" field, matched as whole words.
_DTYPE_WORDS = (
    ("fp4", r"FP4|Float4|E2M1"),
    ("int4", r"Int4|INT4"),
    ("fp8", r"FP8|Float8|E4M3"),
    ("int8", r"Int8|INT8"),
    ("bf16", r"BFloat16|BF16"),
    ("fp16", r"FP16|Half"),
    ("fp32", r"FP32|Float"),
    ("other", r"Int32|INT32|Int64|INT64|Bool|BOOL|UInt8|Double"),
)


def dtype_of(format_string: str) -> str:
    """`Row major linear FP32` -> fp32, `Channel major FP16 format where ...` -> fp16."""
    for category, words in _DTYPE_WORDS:
        if re.search(rf"\b(?:{words})\b", format_string):
            return category
    return "other"


def tensor_dtype(tensor: dict) -> str:
    """A layer tensor's category: TensorRT 11's `DataType`, else 10.x's `Format/Datatype`."""
    return dtype_of(str(tensor.get("DataType") or tensor.get("Format/Datatype") or tensor.get("Format") or ""))


def is_reformat(layer: dict) -> bool:
    return (
        layer.get("LayerType") == "Reformat"
        or layer.get("ParameterType") == "Reformat"
        or str(layer.get("Origin", "")).upper() == "REFORMAT"
        or str(layer.get("Name", "")).startswith("Reformatting CopyNode")
    )


def layer_precision(layer: dict) -> str:
    tensors = list(layer.get("Inputs") or []) + list(layer.get("Outputs") or [])
    kinds = [tensor_dtype(t) for t in tensors]
    if not kinds:
        return "other"
    first = kinds[0] if layer.get("Inputs") else "other"
    if first != "other":
        return first
    floats = [k for k in kinds if k != "other"]
    return min(floats, key=_BITS.__getitem__) if floats else "other"


def effective_precision(inspector: JsonObject, layer_ms: dict[str, float] | None = None) -> JsonObject:
    """Shares of layers (and of time, when timed) per precision, and the reformat count, as
    <id>.build.json and the engine entry's `tensorrt_layer_shares` hold them (validate reads
    them back from that file):
    {"detailed": bool, "layers": n, "reformat_layers": n,
             "layer_share": {cat: f}, "time_share": {cat: f} | None, "time_ms": {cat: f} | None,
             "untimed_layers": [names], "per_layer": [{name, type, precision, ms}]}
    """
    layers = inspector.get("Layers")
    if not isinstance(layers, list):
        raise ValueError("inspector JSON has no `Layers` list")
    if layers and not all(isinstance(layer, dict) for layer in layers):
        # Built below ProfilingVerbosity.DETAILED: names only, no data types.
        return {"detailed": False, "layers": len(layers), "reformat_layers": None,
                "layer_share": None, "time_share": None, "time_ms": None,
                "untimed_layers": [], "per_layer": []}
    per_layer, counts = [], dict.fromkeys(CATEGORIES, 0)
    times = dict.fromkeys(CATEGORIES, 0.0)
    untimed = []
    for layer in layers:
        name, precision = layer.get("Name", ""), layer_precision(layer)
        ms = None if layer_ms is None else layer_ms.get(name)
        if layer_ms is not None and ms is None:
            untimed.append(name)
        counts[precision] += 1
        times[precision] += ms or 0.0
        per_layer.append({"name": name, "type": layer.get("LayerType"), "precision": precision,
                          "reformat": is_reformat(layer), "ms": ms})
    total_ms = sum(times.values())
    timed = layer_ms is not None and total_ms > 0
    return {
        "detailed": True,
        "layers": len(layers),
        "reformat_layers": sum(p["reformat"] for p in per_layer),
        "layer_share": {c: counts[c] / len(layers) if layers else 0.0 for c in CATEGORIES},
        "time_share": {c: times[c] / total_ms for c in CATEGORIES} if timed else None,
        "time_ms": times if timed else None,
        "untimed_layers": untimed,
        "per_layer": per_layer,
    }


def check_required(summary: dict, required: str, min_share: float) -> Gate:
    """Gate: at least `min_share` of the engine's float/int8 work runs at `required` or narrower.

    Shares are by time when the engine was timed, else by layer count; index/shape work
    (`other`) is left out of the denominator, so an INT8 engine is not excused by its Gathers.
    """
    name = f"effective_precision.{required}"
    if not summary.get("detailed"):
        return Gate(name=name, passed=False,
                    detail="the inspector gave layer names only (build with profiling verbosity "
                           "DETAILED) so the effective precision is unknown")
    basis = "time" if summary.get("time_share") else "layers"
    shares = summary["time_share"] if basis == "time" else summary["layer_share"]
    compute = sum(v for c, v in shares.items() if c != "other")
    narrow = sum(v for c, v in shares.items() if c != "other" and _BITS[c] <= _BITS[required])
    share = narrow / compute if compute else 0.0
    spread = ", ".join(f"{c} {v / compute:.0%}" for c, v in shares.items()
                       if c != "other" and v and compute)
    return Gate(name=name, passed=bool(share >= min_share),
                detail=f"{share:.0%} of {basis} at {required} or narrower >= {min_share:.0%} "
                       f"({spread or 'no compute layers'}; {summary['reformat_layers']} reformat layers)")
