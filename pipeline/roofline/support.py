"""Which ops of a graph would not run on a device's runtime as built, and how we know.

- This machine (ONNX Runtime's CPU EP): the installed onnxruntime's own kernel registry
  (`get_all_opkernel_def`): an op without a CPU kernel, or whose input type no kernel takes.
- A GPU under ONNX Runtime's CUDA EP: the com.microsoft ops' CUDA kernels and their float
  types, copied from ONNX Runtime's docs/OperatorKernels.md (generated from the registered
  kernels) at commit 001d12d2 (CUDA_CONTRIB below). A contrib op missing there has no CUDA
  kernel: ORT places it on the CPU EP, with a copy to and from the host around it. ai.onnx
  ops are taken to have CUDA kernels (not checked op by op here).
- TensorRT (its ONNX parser, and ORT's TensorRT EP): it parses the ai.onnx domain only
  (onnx-tensorrt's docs/operators.md); a com.microsoft op is no TensorRT layer (TensorRT's
  own build fails on it; the TensorRT EP hands it to CUDA or CPU). A TensorRT plan runs only
  on an NVIDIA GPU, of the architecture and TensorRT version it was built with (TensorRT's
  developer guide, "engine compatibility").
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

from pipeline.hardware.entry import HardwareEntry
from pipeline.roofline.shapes import Skeleton, type_name

ORT_KERNELS_DOC = "onnxruntime docs/OperatorKernels.md @ 001d12d2 (CUDAExecutionProvider, com.microsoft)"
_ALL = None  # any type
_F = ("float", "float16")
_BF = ("bfloat16", "float", "float16")
# com.microsoft op -> the float types its CUDA kernel takes (None: not a float-typed op)
CUDA_CONTRIB: dict[str, tuple[str, ...] | None] = {
    "Attention": _BF, "BiasAdd": _F, "BiasDropout": _BF, "BiasGelu": _BF, "BiasSoftmax": _F,
    "BiasSplitGelu": _F, "ComplexMul": _F, "ComplexMulConj": _F, "DecoderAttention": _F,
    "DecoderMaskedMultiHeadAttention": _F, "DecoderMaskedSelfAttention": _F,
    "DequantizeLinear": ("float16",), "EmbedLayerNormalization": _F, "FastGelu": _BF, "FusedConv": ("float",),
    "FusedMatMul": _BF, "GatherBlockQuantized": _BF, "Gelu": _BF, "GemmFloat8": _ALL, "GroupNorm": _F,
    "GroupQueryAttention": ("bfloat16", "float16"), "LongformerAttention": _F, "MatMulBnb4": _BF,
    "MatMulNBits": _BF, "MoE": _BF, "MultiHeadAttention": _BF, "NhwcConv": _F, "PackedAttention": _F,
    "PackedMultiHeadAttention": _F, "PagedAttention": ("bfloat16", "float16"), "QAttention": _ALL,
    "QMoE": ("bfloat16", "float16"), "QuantizeLinear": ("float16",), "QuickGelu": _BF,
    "RelativePositionBias": _F, "RemovePadding": _F, "RestorePadding": _F, "RotaryEmbedding": _BF,
    "SkipGroupNorm": _F, "SkipLayerNormalization": _BF, "SkipSimplifiedLayerNormalization": _BF,
    "SimplifiedLayerNormalization": _BF, "SparseAttention": ("bfloat16", "float16"), "TransposeMatMul": _BF,
    "Trilu": _ALL, "UnfoldTensor": _ALL, "BeamSearch": _ALL, "GreedySearch": _ALL, "Sampling": _ALL,
}


@dataclass(frozen=True)
class Unsupported:
    op: str  # domain.op
    nodes: int
    runtime: str
    why: str


@dataclass(frozen=True)
class Support:
    runtime: str
    unsupported: list[Unsupported]
    how: str  # how we know


def _ops(skel: Skeleton) -> Counter:
    """(domain, op, the node's first typed input's type) -> nodes."""
    from pipeline.roofline.shapes import Value

    types: dict[str, Value] = dict(skel.initializers)
    for info in [*skel.model.graph.input, *skel.model.graph.value_info]:
        if info.type.tensor_type.elem_type:
            types[info.name] = Value(info.type.tensor_type.elem_type, None)
    found = Counter()
    for node in skel.model.graph.node:
        first = next((types[i] for i in node.input if i in types), None)
        found[(node.domain or "ai.onnx", node.op_type, type_name(first.elem_type) if first else None)] += 1
    return found


@functools.cache
def _cpu_kernels() -> dict[tuple[str, str], dict[str, set[str]]]:
    """(domain, op) -> type constraint name -> the types its CPU kernels take (any version)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    kernels: dict[tuple[str, str], dict[str, set[str]]] = {}
    for k in C.get_all_opkernel_def():
        if k.provider != "CPUExecutionProvider":
            continue
        constraints = kernels.setdefault((k.domain or "ai.onnx", k.op_name), {})
        for name, types in k.type_constraints.items():
            constraints.setdefault(name, set()).update(t.removeprefix("tensor(").removesuffix(")") for t in types)
    return kernels


@functools.cache
def _first_input_type_param() -> dict[tuple[str, str], str]:
    """(domain, op) -> the type parameter of its first input (e.g. `T`), from the schemas
    onnxruntime knows (ONNX's and its contrib ops')."""
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    params = {}
    for schema in C.get_all_operator_schema():
        if schema.inputs:
            params[(schema.domain or "ai.onnx", schema.name)] = schema.inputs[0].typeStr
    return params


def cpu_support(skel: Skeleton) -> Support:
    import onnxruntime as ort

    kernels, params, missing = _cpu_kernels(), _first_input_type_param(), []
    for (domain, op, dtype), count in sorted(_ops(skel).items(), key=str):
        constraints = kernels.get((domain, op))
        if constraints is None:
            missing.append(Unsupported(f"{domain}.{op}", count, "CPUExecutionProvider", "no CPU kernel"))
            continue
        allowed = constraints.get(params.get((domain, op), ""))  # None: a fixed type, or not a constraint
        if dtype and allowed and dtype not in allowed:
            missing.append(Unsupported(f"{domain}.{op}", count, "CPUExecutionProvider",
                                       f"no CPU kernel for {dtype} inputs"))
    return Support("CPUExecutionProvider", missing,
                   f"the installed onnxruntime {ort.__version__}'s kernel registry (get_all_opkernel_def)")


def cuda_support(skel: Skeleton) -> Support:
    missing = []
    for (domain, op, dtype), count in sorted(_ops(skel).items(), key=str):
        if domain != "com.microsoft":
            continue
        if op not in CUDA_CONTRIB:
            missing.append(Unsupported(f"{domain}.{op}", count, "CUDAExecutionProvider",
                                       "no CUDA kernel: placed on the CPU EP, with host copies around it"))
        elif CUDA_CONTRIB[op] is not None and dtype and dtype not in CUDA_CONTRIB[op]:
            missing.append(Unsupported(f"{domain}.{op}", count, "CUDAExecutionProvider",
                                       f"CUDA kernel takes {'/'.join(CUDA_CONTRIB[op])} only, the graph has "
                                       f"{dtype}: placed on the CPU EP"))
    return Support("CUDAExecutionProvider", missing,
                   f"{ORT_KERNELS_DOC}; ai.onnx ops taken to have CUDA kernels (not checked op by op)")


def tensorrt_support(skel: Skeleton) -> Support:
    """Ops outside the ONNX standard: another domain's, or an ai.onnx-domain name ONNX does not
    define (ORT registers some contrib ops there, e.g. SimplifiedLayerNormalization)."""
    import onnx

    custom: Counter = Counter()
    for (domain, op, _), count in _ops(skel).items():
        if domain != "ai.onnx" or not onnx.defs.has(op):
            custom[f"{domain}.{op}"] += count
    return Support("TensorRT", [Unsupported(op, n, "TensorRT", "not an ONNX standard op: no TensorRT layer "
                                            "(TensorRT's build fails on it; ORT's TensorRT EP gives it to CUDA/CPU)")
                                for op, n in sorted(custom.items())],
                   "onnx-tensorrt's docs/operators.md: the ONNX standard (ai.onnx) ops only")


def support(skel: Skeleton, entry: HardwareEntry) -> list[Support]:
    """What would not run on `entry`'s runtimes (a CPU: ORT's CPU EP; a GPU: CUDA EP and TensorRT)."""
    if entry.kind == "cpu":
        return [cpu_support(skel)]
    return [cuda_support(skel), tensorrt_support(skel)]


def engine_kind_note(kind: str, entry: HardwareEntry) -> str | None:
    """What an engine file of `kind` needs beyond its ops, on `entry`."""
    if kind == "tensorrt":
        return ("a TensorRT plan runs only on an NVIDIA GPU, of the architecture and TensorRT version it was "
                "built with: rebuild it there" if entry.kind == "gpu"
                else "a TensorRT plan does not run on a CPU at all (it needs an NVIDIA GPU)")
    if kind == "aotinductor":
        return "an AOTInductor package is compiled for the device it was built on: rebuild it for this one"
    return None
