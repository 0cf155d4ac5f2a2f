"""What is in an ONNX file: op histogram, inputs and outputs with shapes, size (`pipeline inspect`).

Why not `polygraphy inspect model`: it prints a text listing for people (layers, attributes,
weights), with no op histogram and no machine-readable form, while the same facts here feed
the pipeline itself (compare's parameter counts and "not the same model", the plain-ONNX
check of foreign ops, deploy's tensors) and `pipeline inspect --json`. For a layer-by-layer
look, `polygraphy inspect model FILE.onnx --show layers` works on every graph this writes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.core.errors import InputError
from pipeline.core.json_object import JsonObject
from pipeline.model import compact_storage

OpCounts = dict[str, int]  # op ("domain.op" outside the ONNX domains) -> how many nodes


def _shape(value) -> list:
    """Dims of a ValueInfoProto: ints, symbol names, or '?' for unknown."""
    t = value.type.tensor_type
    if not t.HasField("shape"):
        return ["?"]  # rank unknown
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]


@dataclass(frozen=True)
class OnnxFacts:
    """What `pipeline inspect` tells of one ONNX file: its size, producer, opsets (domain ->
    version), node count and op histogram, inputs and outputs ({name, dtype, shape}),
    initializers and their elements (parameters), what onnx.checker says."""

    path: str
    bytes: int
    producer: str
    opsets: dict[str, int]
    nodes: int
    ops: dict[str, int]
    inputs: list[JsonObject]
    outputs: list[JsonObject]
    initializers: int
    parameters: int
    checker: str

    def dump(self) -> JsonObject:
        return asdict(self)


def describe(path: Path) -> OnnxFacts:
    """Facts about one ONNX file; InputError (exit 2) when it is missing or not a valid model."""
    import onnx

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file", "give the path of an .onnx model")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf DecodeError and the like
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise InputError(f"{path}: not a readable ONNX model ({type(e).__name__}: {first})") from None
    compact_storage.expand(model)  # ops and parameters as a session holds them; bytes as stored
    graph = model.graph
    if not model.opset_import or not (graph.node or graph.output):
        raise InputError(f"{path}: not an ONNX model (no opset, nodes or outputs)")
    try:
        # Informational: ORT's contrib ops in the default domain (fused graphs) fail it.
        onnx.checker.check_model(model)
        checker = "ok"
    except Exception as e:
        checker = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    initializers = {i.name for i in graph.initializer}
    elem = onnx.helper.tensor_dtype_to_np_dtype

    def io(values):
        return [{"name": v.name, "dtype": str(elem(v.type.tensor_type.elem_type)), "shape": _shape(v)}
                for v in values if v.name not in initializers]

    params = sum(int(_numel(i.dims)) for i in graph.initializer)
    return OnnxFacts(
        path=str(path), bytes=path.stat().st_size,
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        opsets={o.domain or "ai.onnx": o.version for o in model.opset_import}, nodes=len(graph.node),
        ops=dict(Counter(f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
                         for n in graph.node).most_common()),
        inputs=io(graph.input), outputs=io(graph.output), initializers=len(graph.initializer),
        parameters=params, checker=checker)


# ONNX Runtime contrib ops its fusions write in the *default* domain, where ONNX has no such
# op (ORT registers these schemas there): the domain alone does not give them away.
ORT_DEFAULT_DOMAIN_OPS = frozenset({
    "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "SkipLayerNormalization",
    "EmbedLayerNormalization", "FastGelu", "BiasGelu", "QuickGelu", "FusedMatMul", "FusedGemm",
    "FusedConv", "BiasAdd", "BiasSplitGelu",
})


def _default_opset(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def foreign_ops(path: Path) -> OpCounts:
    """Nodes a plain-ONNX consumer (TensorRT's parser) cannot run, by name: outside the ONNX
    domains as "domain.op" (e.g. ONNX Runtime's com.microsoft contrib ops that the
    `ort_fusions` pass writes), and, by op type alone, default-domain nodes that are no ONNX op
    at the model's opset (ORT's SimplifiedLayerNormalization and the like, ORT_DEFAULT_DOMAIN_OPS)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    opset = _default_opset(model)
    out: Counter = Counter()
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            out[f"{n.domain}.{n.op_type}"] += 1
        elif n.op_type in ORT_DEFAULT_DOMAIN_OPS or not onnx.defs.has(n.op_type, opset, ""):
            out[n.op_type] += 1
    return dict(out)


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def render(info: OnnxFacts):
    """Rich renderables: a header line, inputs/outputs, the op histogram."""
    from rich.table import Table

    from pipeline.core.text import escape  # markup and control characters

    head = (f"{info.path}: {info.bytes:,} bytes, {info.nodes} nodes, "
            f"{info.parameters:,} parameters in {info.initializers} initializers; "
            f"producer {info.producer or '?'}; opsets "
            + ", ".join(f"{d} {v}" for d, v in info.opsets.items())
            + f"; onnx.checker: {info.checker}")
    io = Table(title="inputs and outputs")
    for col in ("", "name", "dtype", "shape"):
        io.add_column(col)
    for kind, values in (("inputs", info.inputs), ("outputs", info.outputs)):
        for v in values:
            io.add_row(kind[:-1], v["name"], v["dtype"], escape(str(v["shape"]).replace("'", "")))
    ops = Table(title="ops")
    ops.add_column("op")
    ops.add_column("count", justify="right")
    for op, n in info.ops.items():
        ops.add_row(op, str(n))
    return [escape(head), io, ops]
